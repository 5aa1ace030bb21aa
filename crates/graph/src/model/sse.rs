//! Server-sent events from a model API: the request, its error status, and the `event:` /
//! `data:` records of the streamed body, with cancellation checked at every await.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::api_error;
use crate::node::NodeError;

/// One event: its `event:` name (empty when the server sends none) and its `data:` lines.
#[derive(Debug, Default)]
pub(super) struct SseEvent {
    pub event: String,
    pub data: String,
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Vec<u8>>> + Send>>;

/// The events of a streamed response body.
pub(super) struct SseStream {
    url: String,
    body: ByteStream,
    buf: Vec<u8>,
    pending: SseEvent,
    ended: bool,
}

/// Send `req` and check the status; errors name the URL, the status and the body (the API
/// key travels in a header, so it is never part of them).
pub(super) async fn open(
    req: reqwest::RequestBuilder,
    url: &str,
    cancel: &CancellationToken,
) -> Result<SseStream, NodeError> {
    let resp = tokio::select! {
        _ = cancel.cancelled() => return Err(NodeError::Cancelled),
        r = req.send() => r.map_err(|e| api_error(format!("request to {url} failed: {e}")))?,
    };
    let status = resp.status();
    if !status.is_success() {
        let text = tokio::select! {
            _ = cancel.cancelled() => return Err(NodeError::Cancelled),
            t = resp.text() => t.unwrap_or_default(),
        };
        return Err(api_error(format!("{url} answered {status}: {text}")));
    }
    Ok(SseStream {
        url: url.to_string(),
        body: Box::pin(resp.bytes_stream().map(|b| b.map(|b| b.to_vec()))),
        buf: Vec::new(),
        pending: SseEvent::default(),
        ended: false,
    })
}

impl SseStream {
    /// The next event, or `None` at the end of the body.
    pub(super) async fn next(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<Option<SseEvent>, NodeError> {
        loop {
            if let Some(event) = self.take_event() {
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            let next = tokio::select! {
                _ = cancel.cancelled() => return Err(NodeError::Cancelled),
                n = self.body.next() => n,
            };
            match next {
                Some(bytes) => {
                    let bytes = bytes
                        .map_err(|e| api_error(format!("stream from {} failed: {e}", self.url)))?;
                    self.buf.extend_from_slice(&bytes);
                }
                None => {
                    // A last event without its closing blank line still counts.
                    self.ended = true;
                    self.buf.extend_from_slice(b"\n\n");
                }
            }
        }
    }

    /// Read complete lines from the buffer until one ends an event (a blank line).
    fn take_event(&mut self) -> Option<SseEvent> {
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.pending.data.is_empty() {
                    return Some(std::mem::take(&mut self.pending));
                }
                self.pending.event.clear();
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            // One optional space after the colon belongs to the syntax, not the value.
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.pending.event = value.to_string(),
                "data" => {
                    if !self.pending.data.is_empty() {
                        self.pending.data.push('\n');
                    }
                    self.pending.data.push_str(value);
                }
                // Comments (`: ping`), `id:` and `retry:` carry nothing a model reply needs.
                _ => {}
            }
        }
        None
    }
}
