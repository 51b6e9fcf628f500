//! Server-sent events for every protocol: a driver that pulls a [`Generation`] as tokens arrive, lets the
//! protocol frame its events, batches whatever is ready at once into one write, and sends a keep-alive
//! while the engine is silent.

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use serde::Serialize;
use tokio::time::{Instant, Sleep};

use crate::error::ApiError;
use crate::generation::{GenEvent, Generation, Step, Summary};

/// How a protocol frames a generation as SSE.
pub trait SseProtocol: Send + 'static {
    /// Frames sent before the first token (OpenAI's role chunk, Anthropic's `message_start`).
    fn start(&mut self, generation: &Generation, out: &mut BytesMut);
    /// Frames for events, in order.
    fn events(&mut self, events: &[GenEvent], out: &mut BytesMut);
    /// The closing frames.
    fn done(&mut self, summary: &Summary, out: &mut BytesMut);
    /// The frame for a failure after the stream started.
    fn error(&mut self, error: &ApiError, out: &mut BytesMut);
    /// A keep-alive while the engine is silent (default: the comment `: ping`).
    fn ping(&mut self, out: &mut BytesMut) {
        out.extend_from_slice(b": ping\n\n");
    }
}

/// Appends `data: <json>\n\n`.
pub fn data<T: Serialize>(out: &mut BytesMut, value: &T) {
    out.extend_from_slice(b"data: ");
    write_json(out, value);
    out.extend_from_slice(b"\n\n");
}

/// Appends `event: <name>\ndata: <json>\n\n`.
pub fn event<T: Serialize>(out: &mut BytesMut, name: &str, value: &T) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    write_json(out, value);
    out.extend_from_slice(b"\n\n");
}

fn write_json<T: Serialize>(out: &mut BytesMut, value: &T) {
    let mut writer = BytesWriter(out);
    if serde_json::to_writer(&mut writer, value).is_err() {
        writer.0.extend_from_slice(b"{}");
    }
}

struct BytesWriter<'a>(&'a mut BytesMut);

impl std::io::Write for BytesWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Driver<P> {
    generation: Generation,
    protocol: P,
    ping: Pin<Box<Sleep>>,
    interval: Duration,
    started: bool,
    finished: bool,
}

impl<P: SseProtocol> Driver<P> {
    /// Collects a step's events; on the last step, frames everything collected and the end.
    fn handle(&mut self, step: Step, events: &mut Vec<GenEvent>, out: &mut BytesMut) {
        events.extend(step.events);
        let Some(end) = step.end else {
            return;
        };
        self.flush(events, out);
        match end {
            Ok(summary) => self.protocol.done(&summary, out),
            Err(error) => self.protocol.error(&error, out),
        }
        self.finished = true;
    }

    fn flush(&mut self, events: &mut Vec<GenEvent>, out: &mut BytesMut) {
        if !events.is_empty() {
            self.protocol.events(events, out);
            events.clear();
        }
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        let mut out = BytesMut::new();
        if !self.started {
            self.started = true;
            self.protocol.start(&self.generation, &mut out);
            return Some(out.freeze());
        }
        loop {
            tokio::select! {
                biased;
                step = self.generation.next() => {
                    // Everything the engine already has goes out in one write.
                    let mut events = Vec::new();
                    self.handle(step, &mut events, &mut out);
                    while !self.finished {
                        match self.generation.next().now_or_never() {
                            Some(step) => self.handle(step, &mut events, &mut out),
                            None => break,
                        }
                    }
                    self.flush(&mut events, &mut out);
                    self.ping.as_mut().reset(Instant::now() + self.interval);
                    if !out.is_empty() || self.finished {
                        return Some(out.freeze());
                    }
                }
                () = &mut self.ping => {
                    self.protocol.ping(&mut out);
                    self.ping.as_mut().reset(Instant::now() + self.interval);
                    return Some(out.freeze());
                }
            }
        }
    }
}

/// An SSE response that streams `generation` framed by `protocol`, pinging every `ping_interval` of silence.
pub fn response<P: SseProtocol>(generation: Generation, protocol: P, ping_interval: Duration) -> Response {
    let driver = Driver {
        generation,
        protocol,
        ping: Box::pin(tokio::time::sleep(ping_interval)),
        interval: ping_interval,
        started: false,
        finished: false,
    };
    let body = futures::stream::unfold(driver, |mut d| async move {
        let chunk = d.next_chunk().await?;
        Some((Ok::<_, Infallible>(chunk), d))
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}
