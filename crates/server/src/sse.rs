//! The Server-Sent Events wire format LangGraph clients parse: CRLF-framed
//! `event: NAME\r\ndata: JSON\r\n[id: ID\r\n]\r\n`, with a `: heartbeat` comment while idle.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures::Stream;
use serde_json::Value;
use spindle_execution::metrics::OpenStream;
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::ToSchema;

/// Seconds between keepalive comments, so idle proxies keep the connection open.
pub const DEFAULT_KEEPALIVE_SECS: u64 = 5;

/// The keepalive comment.
pub const HEARTBEAT: &[u8] = b": heartbeat\r\n\r\n";

/// One event of a stream, as a client's SSE parser reads it (the document's schema of each
/// event of a `text/event-stream` response; OpenAPI 3.1 has `schema` describe one event).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ServerSentEvent {
    /// The event's name: a stream mode (`values`, `updates|node:TASK`, ...), `metadata`,
    /// `error` or `end`; on the thread event stream, the protocol method.
    event: String,
    /// The payload, JSON.
    #[schema(schema_with = json_text)]
    data: String,
    /// The event's seq in the thread's event log, on streams that send ids.
    id: Option<String>,
}

/// A string holding JSON: `contentMediaType` says so, and `contentSchema` (JSON Schema
/// 2020-12, which utoipa has no builder for; `{}`: any JSON value) lets a validator parse it.
fn json_text() -> Object {
    let mut schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("application/json")
        .build();
    schema
        .extensions
        .get_or_insert_with(Default::default)
        .insert("contentSchema".into(), Value::Object(Default::default()));
    schema
}

/// One frame. `data` is already-serialised JSON, so events read back from the log are sent
/// without being parsed again.
pub fn frame(event: &str, data: &str, id: Option<i64>) -> Bytes {
    let mut out = String::with_capacity(event.len() + data.len() + 32);
    out.push_str("event: ");
    out.push_str(event);
    out.push_str("\r\ndata: ");
    out.push_str(data);
    out.push_str("\r\n");
    if let Some(id) = id {
        out.push_str("id: ");
        out.push_str(&id.to_string());
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    Bytes::from(out)
}

pub fn json_frame(event: &str, data: &Value, id: Option<i64>) -> Bytes {
    frame(event, &data.to_string(), id)
}

/// The `Last-Event-ID` header a client resumes a stream with: an event id (a seq; `-1`
/// replays everything), or none. A value that names no event (not a number: some clients
/// send ids of their own making) reads as none, so the stream starts from its beginning
/// rather than failing the reconnect.
pub fn last_event_id(headers: &HeaderMap) -> Option<i64> {
    let raw = headers.get("last-event-id")?.to_str().ok()?.trim();
    raw.parse::<i64>().ok()
}

/// Headers of every event stream.
pub fn headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    headers
}

/// An event stream's body, counted among the open streams of its kind
/// ([`spindle_execution::metrics::StreamKind`]) until it is dropped: when it ended, or when
/// its client went away and the server noticed (at the next frame or heartbeat at the latest).
pub struct HeldOpen<S> {
    body: std::pin::Pin<Box<S>>,
    _open: OpenStream,
}

pub fn held_open<S: Stream>(body: S, open: OpenStream) -> HeldOpen<S> {
    HeldOpen {
        body: Box::pin(body),
        _open: open,
    }
}

impl<S: Stream> Stream for HeldOpen<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        self.body.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_crlf_delimited() {
        assert_eq!(
            &frame("values", "{\"a\":1}", None)[..],
            b"event: values\r\ndata: {\"a\":1}\r\n\r\n"
        );
        assert_eq!(
            &frame("metadata", "{}", Some(7))[..],
            b"event: metadata\r\ndata: {}\r\nid: 7\r\n\r\n"
        );
    }

    #[test]
    fn a_last_event_id_that_names_no_event_reads_as_none() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("last-event-id", HeaderValue::from_str(value).unwrap());
            last_event_id(&headers)
        };
        assert_eq!(with("7"), Some(7));
        assert_eq!(with("-1"), Some(-1));
        assert_eq!(with("mock_event_20"), None);
        assert_eq!(with(""), None);
        assert_eq!(last_event_id(&HeaderMap::new()), None);
    }
}
