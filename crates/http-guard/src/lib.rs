//! The connection guard both HTTP servers of the workspace (`rollout-proxy` and `arena-sim`) are served
//! under, so that nothing which reaches the port can hold the server: a deadline for each request's head,
//! one for its whole body, one for idle keep-alives, one for a write that makes no progress (a client that
//! stops reading a stream), a body size limit, a cap on connections in flight, and graceful shutdown.
//!
//! hyper's own header-read timer restarts as soon as a response is written, so it would also close idle
//! keep-alives at the header timeout; each connection here has a small watchdog instead, which knows
//! whether the connection is reading a head, handling a request or idle, and closes it when the deadline
//! of that phase passes, or when a write has waited on a full socket for `write_timeout`: closing the
//! connection drops the response, so a stalled stream's generation (or a forwarded upstream request) is
//! dropped with it. Nothing on a request's path wakes the watchdog: it looks at the phase when the
//! deadline it knows passes, or after the shortest limit, whichever is first, and no deadline can be
//! nearer than that (each is at least the shortest limit after its phase began). Bodies are guarded as
//! they are read ([`BodyRefused`]), so a handler can check credentials before it reads a byte of the
//! body; a handler that did not turn a cut-off body into its own 413 or 408 is overruled.
//!
//! It is a leaf crate (`../shared/STYLE.md`): it depends on no workspace crate and carries its own tests.
//! Entry points: [`serve_with`] under [`ConnectionLimits`], and [`BodyRefused`] for handlers that read
//! bodies themselves.

#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower::Service;

/// The limits every connection is served under; [`Default`] is what the proxy and `serve-policy` use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a request's head (request line and headers) may take, from its first byte (from the
    /// accept for a connection's first request); the connection is closed when it passes.
    pub header_read_timeout: Duration,
    /// How long a request's whole body may take to arrive, from the end of its head; 408 when it passes.
    pub body_read_timeout: Duration,
    /// How long a keep-alive connection may sit between requests before it is closed.
    pub idle_timeout: Duration,
    /// The largest request body read, in bytes; 413 beyond.
    pub max_body_bytes: usize,
    /// The most connections served at once; one more is answered 503 and closed at once.
    pub max_connections: usize,
    /// How long a write may wait on a socket the client does not read before the connection is closed
    /// (and the response it was writing, a stream's generation included, dropped).
    pub write_timeout: Duration,
    /// The largest request head (request line and headers) and the most a connection buffers of what
    /// it reads (hyper's `max_buf_size`, about 400 KiB by default): a longer head is answered 431 and the
    /// connection closed, so a connection that has not yet shown a credential holds at most this much.
    /// At least 8 KiB (hyper's floor).
    pub max_head_bytes: usize,
}

/// The floor hyper puts on its connection buffer.
pub const MIN_HEAD_BYTES: usize = 8 * 1024;

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
            max_body_bytes: 32 * 1024 * 1024,
            // Above the proxy bench's 1,024 concurrent clients plus the idle keep-alives its pool holds.
            max_connections: 4096,
            write_timeout: Duration::from_secs(60),
            max_head_bytes: 64 * 1024,
        }
    }
}

impl ConnectionLimits {
    /// How often, at most, a connection's watchdog looks at its phase: the shortest of the deadlines.
    fn check_interval(&self) -> Duration {
        self.header_read_timeout
            .min(self.idle_timeout)
            .min(self.write_timeout)
    }

    /// Every limit must be positive; the error names each one that is not.
    pub fn validate(&self) -> Result<(), String> {
        let zero: Vec<&str> = [
            ("header_read_timeout", self.header_read_timeout.is_zero()),
            ("body_read_timeout", self.body_read_timeout.is_zero()),
            ("idle_timeout", self.idle_timeout.is_zero()),
            ("max_body_bytes", self.max_body_bytes == 0),
            ("max_connections", self.max_connections == 0),
            ("write_timeout", self.write_timeout.is_zero()),
        ]
        .into_iter()
        .filter_map(|(name, bad)| bad.then_some(name))
        .collect();
        if !zero.is_empty() {
            return Err(format!("connection limits must be positive: {}", zero.join(", ")));
        }
        if self.max_head_bytes < MIN_HEAD_BYTES {
            return Err(format!(
                "max_head_bytes must be at least {MIN_HEAD_BYTES}, got {}",
                self.max_head_bytes
            ));
        }
        Ok(())
    }
}

/// Why a request body was cut off while it was read; the error a guarded body yields, which handlers
/// turn into their protocol's 413 or 408.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyRefused {
    /// The body is (or says it is) larger than the limit.
    #[error("the request body is larger than {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body did not arrive in time.
    #[error("the request body did not arrive within {:.1}s", .0.as_secs_f64())]
    TimedOut(Duration),
}

impl BodyRefused {
    /// The status this refusal is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// The refusal somewhere in `err`'s source chain, if the error is one.
    pub fn find(err: &(dyn StdError + 'static)) -> Option<Self> {
        let mut next = Some(err);
        while let Some(e) = next {
            if let Some(refused) = e.downcast_ref::<Self>() {
                return Some(*refused);
            }
            next = e.source();
        }
        None
    }

    const NONE: u8 = 0;
    const TOO_LARGE: u8 = 1;
    const TIMED_OUT: u8 = 2;

    fn code(self) -> u8 {
        match self {
            Self::TooLarge { .. } => Self::TOO_LARGE,
            Self::TimedOut(_) => Self::TIMED_OUT,
        }
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` completes; then stops accepting, lets
/// requests in flight finish and closes idle connections.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    limits.validate().map_err(std::io::Error::other)?;
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let limits = Arc::new(limits);
    let (signal_tx, signal_rx) = watch::channel(());
    let (close_tx, close_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Streams are written in small frames as tokens arrive; without TCP_NODELAY, Nagle's algorithm and
        // delayed ACKs hold frames back for tens of milliseconds.
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refuse(&stream);
            continue;
        };
        let connection = Connection {
            router: router.clone(),
            limits: limits.clone(),
            shutdown: signal_rx.clone(),
            _closed: close_rx.clone(),
            _permit: permit,
        };
        tokio::spawn(connection.serve(stream));
    }
    drop(listener);
    drop(signal_rx);
    let _ = signal_tx.send(());
    drop(close_rx);
    close_tx.closed().await;
    Ok(())
}

/// Errors of one connection (reset, aborted) are the client's; anything else (out of file descriptors)
/// would repeat at once, so the loop waits a little before accepting again.
async fn accept_failed(e: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Over the connection limit: a best-effort 503 (never waiting for the socket), then the close.
fn refuse(stream: &TcpStream) {
    const BODY: &str = r#"{"error":{"message":"too many connections in flight","code":503}}"#;
    let busy = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.try_write(busy.as_bytes());
    tracing::debug!("refused a connection over the connection limit");
}

struct Connection {
    router: Router,
    limits: Arc<ConnectionLimits>,
    shutdown: watch::Receiver<()>,
    // Held for the connection's life: shutdown waits until every copy is gone, the limit until the permit is.
    _closed: watch::Receiver<()>,
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    async fn serve(mut self, stream: TcpStream) {
        let watch = Arc::new(Watchdog::new());
        let io = TokioIo::new(Watched {
            inner: stream,
            watch: watch.clone(),
            stalled: false,
        });
        let service = {
            let (router, limits, watch) = (self.router.clone(), self.limits.clone(), watch.clone());
            hyper::service::service_fn(move |request| {
                handle(router.clone(), limits.clone(), watch.clone(), request)
            })
        };
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .max_buf_size(self.limits.max_head_bytes)
            .keep_alive(true);
        let builder = builder.http1_only();
        let conn = builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(conn);
        let mut shutting_down = false;
        // Nothing that changes the phase wakes this loop: every phase's deadline is at least `check` after
        // the phase begins, so waking at the known deadline or `check` from now, whichever is first, and
        // looking again is never late, and costs each connection one wake per `check` at most.
        let check = self.limits.check_interval();
        loop {
            let now = Instant::now();
            let wake = watch
                .deadline(&self.limits)
                .map_or(now + check, |d| d.min(now + check));
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = tokio::time::sleep_until(wake) => {
                    if watch.deadline(&self.limits).is_some_and(|d| d <= Instant::now()) {
                        tracing::debug!("closing a connection past its header, idle or write deadline");
                        return;
                    }
                }
                _ = self.shutdown.changed(), if !shutting_down => {
                    shutting_down = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// What a connection is doing, which decides its deadline.
struct Phase {
    /// Requests being handled (their response bodies not yet written out).
    busy: usize,
    /// When the first byte of the next request's head arrived, while not busy.
    head_since: Option<Instant>,
    /// When the connection became idle (accepted, or its last response written).
    idle_since: Instant,
    /// Whether a request was ever handled (a fresh connection gets the header timeout, not the idle one).
    served: bool,
    /// Since when a write has waited on a full socket with no byte written, if one is waiting.
    write_stalled_since: Option<Instant>,
}

struct Watchdog {
    phase: Mutex<Phase>,
}

impl Watchdog {
    fn new() -> Self {
        Self {
            phase: Mutex::new(Phase {
                busy: 0,
                head_since: None,
                idle_since: Instant::now(),
                served: false,
                write_stalled_since: None,
            }),
        }
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        let phase = self.phase();
        let stalled = phase
            .write_stalled_since
            .map(|since| since + limits.write_timeout);
        let phase_deadline = if phase.busy > 0 {
            None
        } else if let Some(since) = phase.head_since {
            Some(since + limits.header_read_timeout)
        } else if phase.served {
            Some(phase.idle_since + limits.idle_timeout)
        } else {
            Some(phase.idle_since + limits.header_read_timeout)
        };
        match (phase_deadline, stalled) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A write found the socket full (`true`) or wrote bytes (`false`).
    fn write_stalled(&self, stalled: bool) {
        self.phase().write_stalled_since = stalled.then(Instant::now);
    }

    fn bytes_arrived(&self) {
        let mut phase = self.phase();
        if phase.busy == 0 && phase.head_since.is_none() {
            phase.head_since = Some(Instant::now());
        }
    }

    fn begin(self: &Arc<Self>) -> Busy {
        let mut phase = self.phase();
        phase.busy += 1;
        phase.head_since = None;
        phase.served = true;
        Busy(self.clone())
    }
}

/// One request in flight on a connection, until its response body is dropped.
struct Busy(Arc<Watchdog>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut phase = self.0.phase();
        phase.busy = phase.busy.saturating_sub(1);
        if phase.busy == 0 {
            phase.idle_since = Instant::now();
            phase.head_since = None;
        }
    }
}

/// The socket, telling the watchdog when bytes arrive and when writes stall or make progress.
struct Watched {
    inner: TcpStream,
    watch: Arc<Watchdog>,
    /// Whether the last write found the socket full (the watchdog is told only of changes).
    stalled: bool,
}

impl Watched {
    fn wrote(&mut self, polled: &Poll<std::io::Result<usize>>) {
        let stalled = match polled {
            Poll::Pending => true,
            Poll::Ready(Ok(n)) if *n > 0 => false,
            Poll::Ready(_) => return,
        };
        if stalled != self.stalled {
            self.stalled = stalled;
            self.watch.write_stalled(stalled);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.watch.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(&polled);
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

async fn handle(
    mut router: Router,
    limits: Arc<ConnectionLimits>,
    watch: Arc<Watchdog>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let busy = watch.begin();
    let refused = Arc::new(AtomicU8::new(BodyRefused::NONE));
    let request = request.map(|body| Body::new(Guarded::new(body, &limits, refused.clone())));
    let response = router.call(request).await?;
    // A handler that did not turn a cut-off body into its own 413 or 408 (an extractor's 400) is overruled.
    let response = match refused.load(Ordering::Acquire) {
        BodyRefused::TOO_LARGE if response.status() != StatusCode::PAYLOAD_TOO_LARGE => {
            refusal(BodyRefused::TooLarge {
                limit: limits.max_body_bytes,
            })
        }
        BodyRefused::TIMED_OUT if response.status() != StatusCode::REQUEST_TIMEOUT => {
            refusal(BodyRefused::TimedOut(limits.body_read_timeout))
        }
        _ => response,
    };
    Ok(response.map(|body| {
        Body::new(Tracked {
            inner: body,
            _busy: busy,
        })
    }))
}

fn refusal(refused: BodyRefused) -> Response<Body> {
    let status = refused.status();
    let mut response = (
        status,
        axum::Json(serde_json::json!({"error": {"message": refused.to_string(), "code": status.as_u16()}})),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request body under the size limit and the body deadline.
struct Guarded {
    inner: Incoming,
    limit: usize,
    read: usize,
    deadline: Instant,
    after: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    refused: Arc<AtomicU8>,
}

impl Guarded {
    fn new(inner: Incoming, limits: &ConnectionLimits, refused: Arc<AtomicU8>) -> Self {
        Self {
            inner,
            limit: limits.max_body_bytes,
            read: 0,
            deadline: Instant::now() + limits.body_read_timeout,
            after: limits.body_read_timeout,
            sleep: None,
            refused,
        }
    }

    fn refuse(&self, refused: BodyRefused) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.refused.store(refused.code(), Ordering::Release);
        Poll::Ready(Some(Err(Box::new(refused))))
    }
}

type BoxError = Box<dyn StdError + Send + Sync>;

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let too_large = BodyRefused::TooLarge { limit: this.limit };
        if this.inner.size_hint().lower() > this.limit as u64 {
            return this.refuse(too_large);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.read = this.read.saturating_add(data.len());
                    if this.read > this.limit {
                        return this.refuse(too_large);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let deadline = this.deadline;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_ready() {
                    return this.refuse(BodyRefused::TimedOut(this.after));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request counted as in flight until it is written out or dropped.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
