//! A small incremental parser of server-sent events, for the harnesses that read streamed model answers.
//!
//! Bytes go in as they arrive; whole events come out. It follows the SSE rules the model protocols use:
//! `event:` and `data:` fields (one optional space after the colon), multi-line data joined with `\n`,
//! comment lines (`: ping`) ignored, events ended by a blank line, `\n`, `\r\n` or `\r` line ends.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` field, empty when absent.
    pub(crate) event: String,
    /// The `data:` lines joined with `\n`.
    pub(crate) data: String,
}

/// The parser's state: the unfinished line and event.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    buffer: Vec<u8>,
    event: String,
    data: Vec<String>,
    has_data: bool,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete, in order.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|b| *b == b'\n' || *b == b'\r') {
            // A `\r` at the very end may be the first half of `\r\n`: wait for the next byte.
            if self.buffer[end] == b'\r' && end + 1 == self.buffer.len() {
                break;
            }
            let skip = if self.buffer[end] == b'\r' && self.buffer.get(end + 1) == Some(&b'\n') {
                2
            } else {
                1
            };
            let line: Vec<u8> = self.buffer.drain(..end + skip).take(end).collect();
            let line = String::from_utf8_lossy(&line).into_owned();
            if let Some(event) = self.line(&line) {
                events.push(event);
            }
        }
        events
    }

    /// Ends the stream: an event without its closing blank line is still delivered.
    pub(crate) fn finish(&mut self) -> Option<SseEvent> {
        if !self.buffer.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.buffer)).into_owned();
            if let Some(event) = self.line(&line) {
                return Some(event);
            }
        }
        self.dispatch()
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_string(),
            "data" => {
                self.data.push(value.to_string());
                self.has_data = true;
            }
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some(SseEvent {
            event,
            data: data.join("\n"),
        })
    }
}

#[cfg(test)]
mod tests;
