//! What every request passes through around its handler: the body's media type, the path's
//! encoding, and error bodies in the interface's JSON shapes.
//!
//! These are checks no handler can make for itself: axum rejects a path it cannot decode, or a
//! method a route does not serve, before any handler runs, and answers in plain text (or with
//! no body at all). Doing them here, once, keeps every handler and extractor out of it.

use axum::body::{to_bytes, Body};
use axum::extract::{MatchedPath, Request};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::error::{ApiError, ErrorBody, ErrorCode, ValidationErrorBody, ValidationItem};

/// The most of a non-JSON error body kept as the JSON body's message.
const MESSAGE_MAX: usize = 1024;

/// The most of a refused body read before answering (axum's default body limit); a larger
/// one closes the connection instead.
const DRAIN_MAX: usize = 2 * 1024 * 1024;

/// The middleware: refuses a request whose body is not JSON or whose path does not decode,
/// runs the handler, and rewrites an error it answered in another format as JSON.
pub async fn guard(request: Request, next: Next) -> Response {
    let body_hint = axum::body::HttpBody::size_hint(request.body());
    // Nothing to read is known only when the size is known to be zero (a chunked body, or
    // one whose length is announced, may hold something).
    let may_have_body = body_hint.exact() != Some(0) || has_body(request.headers());
    if let Err(refusal) = check_media_type(request.method(), request.headers(), may_have_body) {
        // Read what was sent before answering: a connection whose request body is left
        // unread is closed, and a client that reuses it fails its next request.
        let _ = to_bytes(request.into_body(), DRAIN_MAX).await;
        return refusal.into_response();
    }
    if let Err(refusal) = check_path_encoding(&request) {
        return refusal.into_response();
    }
    as_json_error(next.run(request).await).await
}

/// A request that may change something carries JSON or nothing. A browser sends a cross-site
/// form or `text/plain` body without asking the server first (no CORS preflight); only a
/// JSON body needs its permission. So a non-JSON `Content-Type` is refused even with an empty
/// body, and a body without any `Content-Type` too. A request with neither (a bodyless POST
/// such as a cancel or a copy) passes.
fn check_media_type(
    method: &Method,
    headers: &HeaderMap,
    may_have_body: bool,
) -> Result<(), ApiError> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let declared = headers.get(header::CONTENT_TYPE);
    if let Some(value) = declared {
        return if is_json(value) {
            Ok(())
        } else {
            Err(unsupported(value.to_str().unwrap_or("(not text)")))
        };
    }
    if may_have_body {
        return Err(unsupported("(none)"));
    }
    Ok(())
}

/// `application/json`, or a `+json` type, with any parameters (`; charset=utf-8`).
fn is_json(value: &HeaderValue) -> bool {
    let Ok(text) = value.to_str() else {
        return false;
    };
    let essence = text.split(';').next().unwrap_or_default().trim();
    let essence = essence.to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Whether the headers announce a body: a non-zero length, or a chunked one.
fn has_body(headers: &HeaderMap) -> bool {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match length {
        Some(n) => n > 0,
        None => headers.contains_key(header::TRANSFER_ENCODING),
    }
}

fn unsupported(content_type: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedMediaType,
        format!("Request bodies must be JSON (Content-Type: application/json); got {content_type}"),
    )
    .with_detail("content_type", json!(content_type))
}

/// Every path parameter is a string, so the only way axum's `Path` can refuse one is a
/// percent-encoding that does not decode to UTF-8 (`/threads/%ff%fe`). Refused here as a 422
/// naming the parameter, as a bad body field is.
fn check_path_encoding(request: &Request) -> Result<(), ApiError> {
    let path = request.uri().path();
    let Some(index) = path.split('/').position(|s| decode(s).is_none()) else {
        return Ok(());
    };
    let segment = path.split('/').nth(index).unwrap_or_default();
    let name = request
        .extensions()
        .get::<MatchedPath>()
        .and_then(|m| m.as_str().split('/').nth(index))
        .and_then(|s| s.strip_prefix('{')?.strip_suffix('}'))
        .map(str::to_owned);
    let mut loc = vec![json!("path")];
    loc.extend(name.map(Value::String));
    Err(ApiError::validation(vec![ValidationItem::new(
        loc,
        "string_unicode",
        "Input should be a valid string: the path's percent-encoding is not UTF-8",
    )
    .with_input(json!(segment))]))
}

/// A path segment percent-decoded, or `None` when the bytes are not UTF-8.
fn decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h)? * 16 + hex(l)?) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// An error response axum (or a layer) made in plain text or with no body (a 405, a 413, a
/// path it could not read), rewritten into the interface's bodies: `{detail: [...]}` for a 422,
/// `{error, message, details}` otherwise. Responses already JSON pass untouched.
async fn as_json_error(response: Response) -> Response {
    let status = response.status();
    if status.as_u16() < 400 || is_json_response(response.headers()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = match to_bytes(body, 64 * 1024).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text.chars().take(MESSAGE_MAX).collect()
    };
    let body = if status == StatusCode::UNPROCESSABLE_ENTITY {
        let item = ValidationItem::new(vec![json!("request")], "value_error", message);
        serde_json::to_vec(&ValidationErrorBody { detail: vec![item] })
    } else {
        serde_json::to_vec(&ErrorBody {
            error: error_name(status),
            message,
            details: Map::new(),
        })
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body.unwrap_or_default()))
}

fn is_json_response(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(is_json)
}

/// The `error` of a status no [`ErrorCode`] answers with: its reason in snake case
/// (`method_not_allowed`), or the code's own name where one does.
fn error_name(status: StatusCode) -> String {
    let known = [
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];
    if let Some(code) = known.into_iter().find(|c| c.status() == status) {
        return code.name().to_owned();
    }
    status
        .canonical_reason()
        .unwrap_or("error")
        .to_ascii_lowercase()
        .replace([' ', '-'], "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_types_with_parameters_and_suffixes() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/merge-patch+json",
        ] {
            assert!(is_json(&HeaderValue::from_static(ok)), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "",
        ] {
            assert!(!is_json(&HeaderValue::from_static(bad)), "{bad}");
        }
    }

    #[test]
    fn segments_decode_or_not() {
        assert_eq!(decode("a%20b").as_deref(), Some("a b"));
        assert_eq!(decode("%E2%9C%93").as_deref(), Some("\u{2713}"));
        assert_eq!(decode("100%").as_deref(), Some("100%"));
        assert_eq!(decode("%ff%fe"), None);
    }

    #[test]
    fn error_names_by_status() {
        assert_eq!(
            error_name(StatusCode::METHOD_NOT_ALLOWED),
            "method_not_allowed"
        );
        assert_eq!(error_name(StatusCode::NOT_FOUND), "not_found");
        assert_eq!(error_name(StatusCode::BAD_REQUEST), "bad_request");
    }
}
