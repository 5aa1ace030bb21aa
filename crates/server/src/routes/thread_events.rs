//! Agent protocol v2 on a thread: `POST /threads/{thread_id}/stream/events` (the thread
//! event stream) and `POST /threads/{thread_id}/commands`. See `crate::protocol`.
//!
//! The stream is the thread stream of `runs::stream` with a protocol target: it subscribes
//! to the live hub, replays the log after `since`, then goes live, so a client sees each
//! event once and in order, across reconnects and restarts (the seq is the log's).

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};
use spindle_execution::metrics::StreamKind;
use utoipa::openapi::schema::{Array, ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::AuthUser;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::protocol::envelope::{Filter, Framer};
use crate::protocol::{commands, socket};
use crate::protocol::{is_channel, CHANNELS};
use crate::runs::stream::{follow_stream, Follow, Target};
use crate::sse::{self, ServerSentEvent};
use crate::state::{AppState, Caller};
use crate::wire::{path_thread_id, whole_number};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(stream_events, stream_socket))
        .routes(routes!(thread_command))
}

/// A stream request: what it selects and where it resumes.
#[derive(Debug)]
pub struct StreamRequest {
    pub filter: Filter,
    pub since: i64,
}

/// A refused request: 400 for what the protocol defines as a bad subscription (channels),
/// 422 for a field of the wrong type or range.
#[derive(Debug)]
pub enum Refusal {
    BadRequest(String),
    Field(ApiError),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::BadRequest(message) => bad_request(&message),
            Refusal::Field(err) => err.into_response(),
        }
    }
}

/// A 400 in the error body of this server (`details` included, as in every error body), with
/// the reference's `detail` as well.
fn bad_request(message: &str) -> Response {
    let body =
        json!({"error": "invalid_request", "message": message, "details": {}, "detail": message});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

fn field(name: &str, kind: &str, message: &str) -> Refusal {
    Refusal::Field(ApiError::field(
        vec![json!("body"), json!(name)],
        kind,
        message,
    ))
}

/// A whole number of at least 0 (`2.0` included, as JSON Schema's `integer`).
fn count(n: &Value) -> Option<i64> {
    whole_number(n).filter(|n| *n >= 0)
}

/// Reads `{channels, namespaces?, depth?, since?}` (the body of the stream, and the params of
/// `subscription.subscribe` without `since`).
pub fn parse_request(body: &Value) -> Result<StreamRequest, Refusal> {
    let Some(body) = body.as_object() else {
        return Err(Refusal::BadRequest("the body must be a JSON object".into()));
    };
    let channels = match body.get("channels") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        _ => {
            return Err(Refusal::BadRequest(
                "channels is required and must be a non-empty array".into(),
            ))
        }
    };
    let bad: Vec<String> = channels
        .iter()
        .filter(|c| !c.as_str().is_some_and(is_channel))
        .map(|c| {
            c.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| c.to_string())
        })
        .collect();
    if !bad.is_empty() {
        return Err(Refusal::BadRequest(format!(
            "channels contains unsupported entries: {}. Allowed: values, updates, messages, tools, custom, lifecycle, input, tasks, checkpoints, or any `custom:<name>`.",
            bad.join(", ")
        )));
    }
    let namespaces = match body.get("namespaces") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|ns| {
                ns.as_array()
                    .and_then(|parts| {
                        parts
                            .iter()
                            .map(|p| p.as_str().map(str::to_owned))
                            .collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| {
                        field(
                            "namespaces",
                            "list_type",
                            "namespaces must be lists of strings",
                        )
                    })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(field(
                "namespaces",
                "list_type",
                "namespaces must be a list of namespaces",
            ))
        }
    };
    let depth = match body.get("depth") {
        None | Some(Value::Null) => None,
        Some(n) => Some(count(n).ok_or_else(|| {
            field(
                "depth",
                "greater_than_equal",
                "depth must be an integer of at least 0",
            )
        })? as usize),
    };
    let since = match body.get("since") {
        None | Some(Value::Null) => 0,
        Some(n) => count(n).ok_or_else(|| {
            field(
                "since",
                "greater_than_equal",
                "since must be an integer of at least 0",
            )
        })?,
    };
    let filter = Filter {
        channels: channels
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        namespaces,
        depth,
    };
    Ok(StreamRequest { filter, since })
}

/// The follow settings of a protocol stream: every run of the thread, read from the log
/// where the framer's subscriptions left off.
pub fn protocol_follow(thread_id: spindle_storage::ResourceId, framer: Framer) -> Follow {
    Follow {
        thread_id,
        after: Some(framer.read_after()),
        target: Target::Protocol(Arc::new(Mutex::new(framer))),
        with_ids: true,
    }
}

/// The body of the thread event stream, as [`parse_request`] reads it (for the document).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct StreamEventsRequest {
    /// Among values, updates, messages, tools, lifecycle, input, tasks, checkpoints, custom,
    /// and `custom:NAME`.
    #[schema(schema_with = channels_schema)]
    channels: Vec<String>,
    /// Namespace prefixes: only events under one of them.
    namespaces: Option<Vec<Vec<String>>>,
    /// How deep below a prefix.
    #[schema(minimum = 0)]
    depth: Option<i64>,
    /// The last seq seen: the stream resumes after it.
    #[schema(minimum = 0)]
    since: Option<i64>,
}

fn channels_schema() -> Array {
    let channel = OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(CHANNELS)),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(r"^custom:[\s\S]")),
        );
    ArrayBuilder::new()
        .items(channel)
        .min_items(Some(1))
        .build()
}

#[utoipa::path(post, path = "/threads/{thread_id}/stream/events", tag = "threads",
    params(("thread_id" = String, Path)),
    request_body = StreamEventsRequest,
    responses((status = 200, description = "Server-Sent Events: `event: METHOD`, `id: SEQ`, data the protocol's event envelope `{type, event_id, seq, method, params: {namespace, timestamp, data, node?}}`; every run of the thread, from the log after `since`, then live", content_type = "text/event-stream", body = ServerSentEvent),
              (status = 400, description = "channels missing, empty or unknown, or a body that is not a JSON object", body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn stream_events(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let thread_id = path_thread_id(&thread_id)?;
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return Ok(bad_request("Invalid JSON body"));
    };
    let request = match parse_request(&body) {
        Ok(request) => request,
        Err(refusal) => return Ok(refusal.into_response()),
    };
    // Ownership first: another user's thread is not found, and no stream opens.
    state.storage.get_thread(&scope, thread_id).await?;
    let events = follow_stream(
        state.storage.clone(),
        state.hub.clone(),
        scope,
        protocol_follow(thread_id, Framer::new(request.filter, request.since)),
        state.keepalive,
        |_| {},
    );
    // First bytes at once: the client knows the stream is open before any event.
    let opened = futures::stream::once(async { Ok(Bytes::from_static(sse::HEARTBEAT)) });
    let open = state.metrics.stream_opened(StreamKind::Protocol);
    let body = sse::held_open(opened.chain(events), open);
    Ok((sse::headers(), Body::from_stream(body)).into_response())
}

#[utoipa::path(get, path = "/threads/{thread_id}/stream/events", tag = "threads",
    params(("thread_id" = String, Path),
           ("Connection" = String, Header, pattern = "[Uu][Pp][Gg][Rr][Aa][Dd][Ee]", description = "holding `upgrade`"),
           ("Upgrade" = String, Header, pattern = "^[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt]$", description = "`websocket`"),
           ("Sec-WebSocket-Version" = String, Header, pattern = "^13$", description = "`13`"),
           ("Sec-WebSocket-Key" = String, Header, description = "the client's nonce (RFC 6455)")),
    responses((status = 101, description = "WebSocket: send commands `{id, method, params}` (those of `/commands`, plus `subscription.subscribe {channels, namespaces?, depth?, since?}`, `subscription.unsubscribe {subscription_id}`, `subscription.reconnect {run_id, last_event_id?, subscriptions?}`); receive their answers and the subscribed events' envelopes, each event once"),
              (status = 400, description = "not a WebSocket opening handshake (its headers missing or wrong)", body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn stream_socket(
    State(state): State<AppState>,
    caller: AuthUser,
    Path(thread_id): Path<String>,
    upgrade: WebSocketUpgrade,
) -> ApiResult<Response> {
    let thread_id = path_thread_id(&thread_id)?;
    // Ownership before the upgrade, as for the SSE stream.
    state.storage.get_thread(&caller.scope(), thread_id).await?;
    Ok(upgrade.on_upgrade(move |socket| socket::serve(socket, state, caller, thread_id)))
}

/// A command, as `commands::parse` reads it (for the document).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Command {
    #[schema(minimum = 0)]
    id: i64,
    /// run.start, input.respond, agent.getTree, state.get, state.listCheckpoints, state.fork
    /// (another method is answered with an error of the protocol).
    method: String,
    #[schema(value_type = Option<Object>)]
    params: Option<Value>,
}

/// A command's error answer (the protocol's shape, not the error body of the other routes:
/// the official clients read it as a command's answer).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct CommandError {
    /// Always `error`.
    #[serde(rename = "type")]
    kind: String,
    /// The command's `id`, when it had an integer one.
    id: Option<u64>,
    /// The protocol's error code: `invalid_argument`, `not_found`, `not_supported`, ...
    error: String,
    message: String,
}

#[utoipa::path(post, path = "/threads/{thread_id}/commands", tag = "threads",
    params(("thread_id" = String, Path)),
    request_body = Command,
    responses((status = 200, description = "`{type: success, id, result, meta: {applied_through_seq}}` or `{type: error, id, error, message}` with the protocol's error codes", body = Object),
              (status = 400, description = "not a command: a body that is not JSON, or without an integer `id` and a string `method`, or whose `params` is not an object", body = CommandError),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn thread_command(
    State(state): State<AppState>,
    caller: AuthUser,
    Path(thread_id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let thread_id = path_thread_id(&thread_id)?;
    let Ok(command) = serde_json::from_slice::<Value>(&body) else {
        let refusal = commands::error(
            None,
            &commands::Failure {
                code: "invalid_argument",
                message: "Invalid JSON body".into(),
            },
        );
        return Ok((StatusCode::BAD_REQUEST, Json(refusal)).into_response());
    };
    let (id, method, params) = match commands::parse(&command) {
        Ok(parsed) => parsed,
        Err(refusal) => return Ok((StatusCode::BAD_REQUEST, Json(refusal)).into_response()),
    };
    let answer = match commands::run(&state, &caller, thread_id, method, &params).await {
        Ok(result) => commands::success(id, result, 0),
        Err(failure) => commands::error(Some(json!(id)), &failure),
    };
    Ok(Json(answer).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_required_and_known() {
        assert!(matches!(
            parse_request(&json!({})),
            Err(Refusal::BadRequest(_))
        ));
        assert!(matches!(
            parse_request(&json!({"channels": []})),
            Err(Refusal::BadRequest(_))
        ));
        let Err(Refusal::BadRequest(msg)) =
            parse_request(&json!({"channels": ["values", "bogus"]}))
        else {
            panic!("bogus accepted");
        };
        assert!(msg.contains("bogus"), "{msg}");
        let ok = parse_request(
            &json!({"channels": ["custom:progress", "input"], "since": 4, "depth": 0}),
        )
        .unwrap();
        assert_eq!((ok.since, ok.filter.depth), (4, Some(0)));
    }

    #[test]
    fn depth_and_since_are_at_least_zero() {
        for body in [
            json!({"channels": ["values"], "depth": -1}),
            json!({"channels": ["values"], "since": -3}),
            json!({"channels": ["values"], "since": "x"}),
            json!({"channels": ["values"], "namespaces": [[1]]}),
        ] {
            assert!(
                matches!(parse_request(&body), Err(Refusal::Field(_))),
                "{body}"
            );
        }
    }
}
