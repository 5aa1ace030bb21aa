//! Thread-scoped event streams: `GET /threads/{thread_id}/stream` joins every run of a thread.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use spindle_execution::metrics::StreamKind;
use utoipa::openapi::schema::{Array, ArrayBuilder, ObjectBuilder, Type};
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::extract::{ApiQuery, Validate, Violations};
use crate::runs::stream::{follow_stream, Follow, Target, ThreadModes};
use crate::sse::{self, ServerSentEvent};
use crate::state::{AppState, Caller};
use crate::wire::path_thread_id;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(join_thread_stream))
}

const THREAD_MODES: [&str; 3] = ["run_modes", "lifecycle", "state_update"];

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ThreadStreamQuery {
    /// run_modes (default), lifecycle and/or state_update; repeated or comma-separated.
    #[serde(default)]
    #[param(schema_with = modes_schema)]
    pub stream_modes: Vec<String>,
    /// The name the official clients send (`stream_mode`); read the same way.
    #[serde(default)]
    #[param(schema_with = modes_schema)]
    pub stream_mode: Vec<String>,
}

/// Each value of a modes parameter: [`THREAD_MODES`] separated by commas.
fn modes_schema() -> Array {
    let mode = THREAD_MODES.join("|");
    let pattern = format!(r"^\s*({mode})\s*(,\s*({mode})\s*)*$");
    let value = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern));
    ArrayBuilder::new().items(value).build()
}

impl ThreadStreamQuery {
    /// Every mode named, from either parameter, split at commas: `(field, index, name)`.
    fn names(&self) -> Vec<(&'static str, usize, &str)> {
        let mut names = Vec::new();
        for (field, values) in [
            ("stream_modes", &self.stream_modes),
            ("stream_mode", &self.stream_mode),
        ] {
            for (i, value) in values.iter().enumerate() {
                names.extend(value.split(',').map(|name| (field, i, name.trim())));
            }
        }
        names
    }

    fn modes(&self) -> ThreadModes {
        let mut modes = ThreadModes::default();
        for (_, _, name) in self.names() {
            match name {
                "run_modes" => modes.run_modes = true,
                "lifecycle" => modes.lifecycle = true,
                "state_update" => modes.state_update = true,
                _ => {}
            }
        }
        if modes == ThreadModes::default() {
            modes.run_modes = true;
        }
        modes
    }
}

impl Validate for ThreadStreamQuery {
    fn validate(&self, v: &mut Violations) {
        for (field, i, name) in self.names() {
            if !THREAD_MODES.contains(&name) {
                v.push(
                    &[field, &i.to_string()],
                    "enum",
                    "Input should be run_modes, lifecycle or state_update",
                    json!(name),
                    json!({"expected": THREAD_MODES}),
                );
            }
        }
    }
}

#[utoipa::path(get, path = "/threads/{thread_id}/stream", tag = "threads",
    params(("thread_id" = String, Path), ThreadStreamQuery,
           ("Last-Event-ID" = Option<String>, Header, description = "replay the thread's events after this id (-1: all), then go live; without it the stream starts now")),
    responses((status = 200, description = "Server-Sent Events of every run of the thread, with ids; `metadata {run_id, attempt}` when a run starts and `metadata {status: run_done, run_id}` when it ends", content_type = "text/event-stream", body = ServerSentEvent),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn join_thread_stream(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiQuery(query): ApiQuery<ThreadStreamQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let thread_id = path_thread_id(&thread_id)?;
    // Ownership first: another user's thread is not found, and no stream opens.
    state.storage.get_thread(&scope, thread_id).await?;
    let follow = Follow {
        thread_id,
        target: Target::Thread(query.modes()),
        after: sse::last_event_id(&headers),
        with_ids: true,
    };
    let body = follow_stream(
        state.storage.clone(),
        state.hub.clone(),
        scope,
        follow,
        state.keepalive,
        |_| {},
    );
    let body = sse::held_open(body, state.metrics.stream_opened(StreamKind::Thread));
    Ok((sse::headers(), Body::from_stream(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(stream_modes: &[&str], stream_mode: &[&str]) -> ThreadStreamQuery {
        ThreadStreamQuery {
            stream_modes: stream_modes.iter().map(|s| s.to_string()).collect(),
            stream_mode: stream_mode.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn run_modes_is_the_default() {
        let modes = query(&[], &[]).modes();
        assert!(modes.run_modes && !modes.lifecycle && !modes.state_update);
    }

    #[test]
    fn modes_come_from_either_parameter_repeated_or_comma_separated() {
        let modes = query(&["lifecycle,state_update"], &[]).modes();
        assert!(!modes.run_modes && modes.lifecycle && modes.state_update);
        let modes = query(&[], &["lifecycle", "run_modes"]).modes();
        assert!(modes.run_modes && modes.lifecycle);
    }

    #[test]
    fn an_unknown_mode_is_named() {
        let mut v = Violations::new("query");
        query(&["run_modes,bogus"], &[]).validate(&mut v);
        let err = v.into_result().unwrap_err();
        assert!(format!("{err:?}").contains("bogus"), "{err:?}");
    }
}
