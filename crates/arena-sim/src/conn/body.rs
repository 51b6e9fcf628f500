//! Request bodies under the connection limits: [`Guarded`] cuts a body off past its size limit or its
//! deadline, and [`refusal`] is the sim's 413 or 408 for it. Mirrors `rollout_proxy::connection`'s body guard.

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::http::{HeaderValue, Response, StatusCode, header};
use axum::response::IntoResponse;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

use super::ConnectionLimits;

/// Why a request body was cut off while it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum BodyRefused {
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
    fn status(self) -> StatusCode {
        match self {
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }

    pub(super) const NONE: u8 = 0;
    pub(super) const TOO_LARGE: u8 = 1;
    pub(super) const TIMED_OUT: u8 = 2;

    fn code(self) -> u8 {
        match self {
            Self::TooLarge { .. } => Self::TOO_LARGE,
            Self::TimedOut(_) => Self::TIMED_OUT,
        }
    }
}

pub(super) fn refusal(refused: BodyRefused) -> Response<Body> {
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
pub(super) struct Guarded {
    inner: Incoming,
    limit: usize,
    read: usize,
    deadline: Instant,
    after: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    refused: Arc<AtomicU8>,
}

impl Guarded {
    pub(super) fn new(inner: Incoming, limits: &ConnectionLimits, refused: Arc<AtomicU8>) -> Self {
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
