//! The Server-Sent Events wire format LangGraph clients parse: CRLF-framed
//! `event: NAME\r\ndata: JSON\r\n[id: ID\r\n]\r\n`, with a `: heartbeat` comment while idle.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use serde_json::{json, Value};

use crate::error::ApiError;

/// Seconds between keepalive comments, so idle proxies keep the connection open.
pub const DEFAULT_KEEPALIVE_SECS: u64 = 5;

/// The keepalive comment.
pub const HEARTBEAT: &[u8] = b": heartbeat\r\n\r\n";

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
/// replays everything), or none.
pub fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let raw = value.to_str().unwrap_or_default().trim();
    if raw.is_empty() {
        return Ok(None);
    }
    raw.parse::<i64>().map(Some).map_err(|_| {
        ApiError::field(
            vec![json!("header"), json!("Last-Event-ID")],
            "int_parsing",
            "Last-Event-ID should be an event id",
        )
    })
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
}
