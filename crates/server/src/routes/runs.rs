//! `/threads/{thread_id}/runs` and stateless `/runs`: create, stream, wait, list, get, delete,
//! join and cancel runs.

use spindle_storage::ResourceId;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use spindle_storage::{
    CancelAction, FiringId, LoggedEvent, MultitaskStrategy, Run, RunFilter, RunStatus, Scope,
    StorageError,
};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, SchemaType, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

pub use spindle_execution::run_view::RunOut;

use crate::auth::AuthUser;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody, ValidationItem};
use crate::extract::{ApiJson, ApiQuery, Validate, Violations};
use crate::routes::assistants::resolve_assistant_id;
use crate::runs::stream::{follow_new_run, follow_stream, Follow, Target};
use crate::sse::{self, ServerSentEvent};
use crate::state::{AppState, Caller};
use crate::wire::{page, path_thread_id, path_uuid, validate_page, JsonObject};
use spindle_execution::execute::keys;
use spindle_execution::hub::{HubMessage, Subscription};
use spindle_execution::metrics::StreamKind;
use spindle_execution::{RunRequest, StartedRun, Stateless};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_run, list_runs))
        .routes(routes!(stream_run))
        .routes(routes!(wait_run))
        .routes(routes!(get_run, delete_run))
        .routes(routes!(join_run))
        .routes(routes!(join_run_stream))
        .routes(routes!(join_stateless_run_stream))
        .routes(routes!(cancel_run))
        .routes(routes!(create_stateless_run))
        .routes(routes!(stream_stateless_run))
        .routes(routes!(wait_stateless_run))
        .routes(routes!(create_run_batch))
        .routes(routes!(cancel_many_runs))
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MultitaskWire {
    Reject,
    Interrupt,
    Rollback,
    Enqueue,
}

impl From<MultitaskWire> for MultitaskStrategy {
    fn from(w: MultitaskWire) -> Self {
        match w {
            MultitaskWire::Reject => MultitaskStrategy::Reject,
            MultitaskWire::Interrupt => MultitaskStrategy::Interrupt,
            MultitaskWire::Rollback => MultitaskStrategy::Rollback,
            MultitaskWire::Enqueue => MultitaskStrategy::Enqueue,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnDisconnect {
    #[default]
    Cancel,
    Continue,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DurabilityWire {
    Sync,
    Async,
    Exit,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum IfNotExists {
    #[default]
    Reject,
    Create,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnCompletion {
    #[default]
    Delete,
    Keep,
}

/// A checkpoint reference: where to start the run from.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct CheckpointIn {
    pub checkpoint_id: Option<String>,
    /// Runs start from a root checkpoint: `""` or null.
    #[serde(default)]
    #[schema(max_length = 0)]
    pub checkpoint_ns: Option<String>,
    #[serde(default)]
    pub thread_id: Option<String>,
}

/// The create-run request.
#[derive(Debug, Deserialize, ToSchema)]
pub struct RunCreate {
    /// An assistant's id or a graph's id (an unknown one is a 404).
    #[schema(value_type = ResourceId)]
    pub assistant_id: String,
    /// Any JSON value, as LangGraph takes it (the graph's input schema decides).
    #[serde(default)]
    #[schema(value_type = Value)]
    pub input: Option<Value>,
    /// `{resume?, update?, goto?}`: resume interrupts, update the state, go to nodes.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub command: Option<JsonObject>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub config: Option<JsonObject>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub context: Option<JsonObject>,
    /// Wins over `checkpoint_id`.
    #[serde(default, deserialize_with = "crate::extract::opt_object")]
    pub checkpoint: Option<CheckpointIn>,
    #[serde(default)]
    pub checkpoint_id: Option<Uuid>,
    /// Wins over `checkpoint_during`.
    #[serde(default)]
    pub durability: Option<DurabilityWire>,
    /// Deprecated: true means async, false means exit.
    #[serde(default)]
    pub checkpoint_during: Option<bool>,
    /// One mode or a list: values, updates, messages, messages-tuple, custom, tasks,
    /// checkpoints, debug, events.
    #[serde(default)]
    #[schema(schema_with = stream_mode_schema)]
    pub stream_mode: Option<Value>,
    #[serde(default)]
    pub stream_subgraphs: Option<bool>,
    /// Events are always kept in the log; accepted for compatibility.
    #[serde(default)]
    pub stream_resumable: Option<bool>,
    #[serde(default)]
    pub on_disconnect: Option<OnDisconnect>,
    #[serde(default)]
    pub multitask_strategy: Option<MultitaskWire>,
    /// `"*"` or a list of node names.
    #[serde(default)]
    #[schema(schema_with = node_set_schema)]
    pub interrupt_before: Option<Value>,
    /// `"*"` or a list of node names.
    #[serde(default)]
    #[schema(schema_with = node_set_schema)]
    pub interrupt_after: Option<Value>,
    /// At most 32 keys matching `[A-Za-z0-9_-]{1,64}`; primitive values; strings up to 512.
    #[serde(default)]
    #[schema(schema_with = run_metadata_schema)]
    pub metadata: Option<JsonObject>,
    /// An http(s) URL the run's end is POSTed to. Its host must resolve to public addresses
    /// (private and loopback ones too when the server allows them); refused with 422 otherwise.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 2048,
        pattern = "^[Hh][Tt][Tt][Pp][Ss]?://[^\\s/?#]"
    )]
    pub webhook: Option<String>,
    #[serde(default)]
    pub if_not_exists: Option<IfNotExists>,
    /// Seconds to wait before starting (at most a year).
    #[serde(default)]
    #[schema(minimum = 0, maximum = 31536000)]
    pub after_seconds: Option<f64>,
    /// Stateless runs: delete (default) or keep the temporary thread.
    #[serde(default)]
    pub on_completion: Option<OnCompletion>,
}

/// `stream_mode`: one of [`STREAM_MODES`], a list of them, or null. (`tools` too, but only on
/// runs of the agent protocol, flagged in `config.configurable`: left out of the document.)
fn stream_mode_schema() -> OneOfBuilder {
    let mode = || {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(STREAM_MODES))
    };
    OneOfBuilder::new()
        .item(mode())
        .item(ArrayBuilder::new().items(mode()))
        .item(ObjectBuilder::new().schema_type(Type::Null))
}

/// `interrupt_before`/`interrupt_after`: `"*"`, a list of node names, or null.
fn node_set_schema() -> OneOfBuilder {
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["*"])),
        )
        .item(ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::String)))
        .item(ObjectBuilder::new().schema_type(Type::Null))
}

/// Run metadata as [`validate_run_metadata`] takes it (the interface's limits).
fn run_metadata_schema() -> ObjectBuilder {
    let primitive = OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(512)),
        )
        .item(ObjectBuilder::new().schema_type(Type::Number))
        .item(ObjectBuilder::new().schema_type(Type::Boolean));
    let key = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some("^[A-Za-z0-9_-]{1,64}$"));
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .max_properties(Some(32))
        .property_names(Some(key))
        .additional_properties(Some(RefOr::<Schema>::from(primitive)))
}

const STREAM_MODES: [&str; 9] = [
    "values",
    "updates",
    "messages",
    "messages-tuple",
    "custom",
    "tasks",
    "checkpoints",
    "debug",
    "events",
];

impl Validate for RunCreate {
    fn validate(&self, v: &mut Violations) {
        validate_run_metadata(v, self.metadata.as_ref());
        validate_stream_mode(v, self.stream_mode.as_ref(), self.is_v2());
        for (field, value) in [
            ("interrupt_before", &self.interrupt_before),
            ("interrupt_after", &self.interrupt_after),
        ] {
            if let Some(value) = value.as_ref().filter(|v| !v.is_null()) {
                if spindle_graph::NodeSet::from_value(value).is_none() {
                    v.push(
                        &[field],
                        "value_error",
                        "Input should be \"*\" or a list of node names",
                        value.clone(),
                        Value::Null,
                    );
                }
            }
        }
        if let Some(seconds) = self.after_seconds {
            if !(0.0..=86_400.0 * 365.0).contains(&seconds) {
                v.push(
                    &["after_seconds"],
                    "greater_than_equal",
                    "Input should be between 0 and one year",
                    json!(seconds),
                    Value::Null,
                );
            }
        }
        v.max_len("webhook", self.webhook.as_deref(), 2048);
        // The syntax here; where the host resolves to is checked by `start_run`, which can
        // wait for DNS.
        if let Some(Err(refusal)) = self
            .webhook
            .as_deref()
            .map(spindle_execution::webhook::parse)
        {
            v.push(
                &["webhook"],
                refusal.kind,
                refusal.message,
                json!(self.webhook),
                Value::Null,
            );
        }
        if let Some(ns) = self
            .checkpoint
            .as_ref()
            .and_then(|c| c.checkpoint_ns.as_deref())
        {
            if !ns.is_empty() {
                v.push(
                    &["checkpoint", "checkpoint_ns"],
                    "not_supported",
                    "runs start from a root checkpoint",
                    json!(ns),
                    Value::Null,
                );
            }
        }
    }
}

/// The interface's limits on run metadata, which become trace attributes.
fn validate_run_metadata(v: &mut Violations, metadata: Option<&JsonObject>) {
    let Some(metadata) = metadata else { return };
    if metadata.len() > 32 {
        v.push(
            &["metadata"],
            "too_long",
            "Run metadata may have at most 32 keys",
            json!(metadata.len()),
            json!({"max_length": 32}),
        );
    }
    for (key, value) in metadata {
        let key_ok = (1..=64).contains(&key.len())
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !key_ok {
            v.push(
                &["metadata", key],
                "string_pattern_mismatch",
                "Metadata keys must match [A-Za-z0-9_-]{1,64}",
                json!(key),
                json!({"pattern": "[A-Za-z0-9_-]{1,64}"}),
            );
        }
        match value {
            Value::String(s) if s.chars().count() > 512 => {
                v.push(
                    &["metadata", key],
                    "string_too_long",
                    "String should have at most 512 characters",
                    value.clone(),
                    json!({"max_length": 512}),
                );
            }
            Value::String(_) | Value::Number(_) | Value::Bool(_) => {}
            _ => v.push(
                &["metadata", key],
                "value_error",
                "Metadata values must be strings, numbers or booleans",
                value.clone(),
                Value::Null,
            ),
        }
    }
}

/// The stream mode only runs started through the agent protocol (v2) may ask for, as on the
/// reference: on other runs it would put protocol-shaped events into a v1 stream.
const V2_ONLY_STREAM_MODE: &str = "tools";

fn validate_stream_mode(v: &mut Violations, mode: Option<&Value>, v2: bool) {
    let modes: Vec<&Value> = match mode {
        None | Some(Value::Null) => return,
        Some(Value::Array(items)) => items.iter().collect(),
        Some(one) => vec![one],
    };
    for (i, mode) in modes.into_iter().enumerate() {
        if mode.as_str() == Some(V2_ONLY_STREAM_MODE) {
            if !v2 {
                v.push(
                    &["stream_mode", &i.to_string()],
                    "value_error",
                    "stream_mode 'tools' is only supported on the v2 event streaming endpoints",
                    mode.clone(),
                    json!({}),
                );
            }
            continue;
        }
        if !mode.as_str().is_some_and(|m| STREAM_MODES.contains(&m)) {
            v.push(
                &["stream_mode", &i.to_string()],
                "enum",
                format!("Input should be one of {}", STREAM_MODES.join(", ")),
                mode.clone(),
                json!({"expected": STREAM_MODES}),
            );
        }
    }
}

impl RunCreate {
    /// Whether the run is started through the agent protocol (`run.start`), which marks its
    /// config.
    fn is_v2(&self) -> bool {
        self.config
            .as_ref()
            .and_then(|c| c.get("configurable"))
            .and_then(|c| c.get(crate::protocol::V2_CONFIG_KEY))
            == Some(&Value::Bool(true))
    }

    /// What the worker needs to execute the run, in the keys `runs::execute` reads.
    fn kwargs(&self) -> JsonObject {
        let mut kwargs = Map::new();
        let mut put = |key: &str, value: Option<Value>| {
            if let Some(value) = value.filter(|v| !v.is_null()) {
                kwargs.insert(key.to_owned(), value);
            }
        };
        put(keys::INPUT, self.input.clone());
        put(keys::COMMAND, self.command.clone().map(Value::Object));
        put(keys::CONFIG, self.config.clone().map(Value::Object));
        put(keys::CONTEXT, self.context.clone().map(Value::Object));
        put(keys::STREAM_MODE, self.stream_mode.clone());
        put(
            keys::STREAM_SUBGRAPHS,
            self.stream_subgraphs.map(Value::Bool),
        );
        put(keys::INTERRUPT_BEFORE, self.interrupt_before.clone());
        put(keys::INTERRUPT_AFTER, self.interrupt_after.clone());
        put(keys::WEBHOOK, self.webhook.clone().map(Value::String));
        let checkpoint_id = self
            .checkpoint
            .as_ref()
            .and_then(|c| c.checkpoint_id.clone())
            .or_else(|| self.checkpoint_id.map(|id| id.to_string()));
        put(keys::CHECKPOINT_ID, checkpoint_id.map(Value::String));
        let durability = match (self.durability, self.checkpoint_during) {
            (Some(d), _) => Some(d),
            (None, Some(true)) => Some(DurabilityWire::Async),
            (None, Some(false)) => Some(DurabilityWire::Exit),
            (None, None) => None,
        };
        put(
            keys::DURABILITY,
            durability.map(|d| {
                json!(match d {
                    DurabilityWire::Sync => "sync",
                    DurabilityWire::Async => "async",
                    DurabilityWire::Exit => "exit",
                })
            }),
        );
        put(
            keys::ON_DISCONNECT,
            Some(json!(match self.on_disconnect.unwrap_or_default() {
                OnDisconnect::Cancel => "cancel",
                OnDisconnect::Continue => "continue",
            })),
        );
        kwargs
    }
}

/// Who removes the thread of a stateless run, and when (`on_completion`; `background`: nobody
/// waits for the run).
fn stateless_of(body: &RunCreate, background: bool) -> Stateless {
    match (body.on_completion.unwrap_or_default(), background) {
        (OnCompletion::Keep, _) => Stateless::Keep,
        (OnCompletion::Delete, true) => Stateless::DeleteByWorker,
        (OnCompletion::Delete, false) => Stateless::DeleteAfterResponse,
    }
}

/// Starts the run a body asks for on `thread_id`: by the run routes, and by crons when they
/// fire (`cron_firing`, which the run's creation ends).
pub(crate) async fn start_run(
    state: &AppState,
    caller: &AuthUser,
    thread_id: ResourceId,
    body: &RunCreate,
    stateless: Stateless,
    cron_firing: Option<FiringId>,
) -> ApiResult<StartedRun> {
    let scope = &caller.scope();
    let mut assistant = run_assistant_kept(state, scope, &body.assistant_id).await?;
    let webhooks_off = cron_firing.is_some() && state.http.disable_webhooks;
    if !webhooks_off {
        check_webhook(state, body, vec![json!("body"), json!("webhook")]).await?;
    }
    // The assistant may be this process's copy, which another process may have changed since:
    // then the run is not created and the assistant is read again (see
    // `AssistantStore::assistant_for_run`). Three tries: an assistant changing under every one
    // is being rewritten without pause, and the caller learns it (409).
    let mut tries = 1;
    loop {
        let request = RunRequest {
            assistant,
            kwargs: run_kwargs(caller, body, webhooks_off),
            metadata: body.metadata.clone().unwrap_or_default(),
            multitask_strategy: body.multitask_strategy.map(Into::into).unwrap_or_default(),
            after_seconds: body.after_seconds.unwrap_or(0.0),
            create_missing_thread: body.if_not_exists.unwrap_or_default() == IfNotExists::Create,
            stateless,
            cron_firing,
        };
        match state.workers.start_run(scope, thread_id, request).await {
            Err(StorageError::AssistantChanged) if tries < 3 => {
                tries += 1;
                assistant = run_assistant_kept(state, scope, &body.assistant_id).await?;
            }
            started => return Ok(started?),
        }
    }
}

/// The kwargs a run is stored with: the body's, with who started it.
fn run_kwargs(caller: &AuthUser, body: &RunCreate, webhooks_off: bool) -> JsonObject {
    let mut kwargs = body.kwargs();
    if webhooks_off {
        // A cron made before webhooks were turned off still fires; its webhook is not called,
        // as the reference skips the call.
        kwargs.remove(keys::WEBHOOK);
    }
    // Who started the run, for its graph (`langgraph_auth_user`), kept with the run so that
    // any process executing it knows.
    kwargs.insert(keys::AUTH_USER.into(), caller.to_json());
    kwargs
}

/// The assistant a run names (its id, or a graph id for the graph's default assistant), or a
/// 404 naming what was asked for: an id that is not a UUID is as unknown as a UUID of no
/// assistant, not malformed.
pub(crate) async fn run_assistant(
    state: &AppState,
    scope: &Scope,
    raw: &str,
) -> ApiResult<spindle_storage::Assistant> {
    let assistant_id = resolve_assistant_id(state, raw).map_err(|_| no_assistant(raw))?;
    match state.storage.get_assistant(scope, assistant_id).await {
        Err(StorageError::NotFound(_)) => Err(no_assistant(raw)),
        other => Ok(other?),
    }
}

/// [`run_assistant`] for a run about to be created: possibly a copy this process kept, which
/// the run's creation checks (`AssistantStore::assistant_for_run`).
async fn run_assistant_kept(
    state: &AppState,
    scope: &Scope,
    raw: &str,
) -> ApiResult<spindle_storage::Assistant> {
    let assistant_id = resolve_assistant_id(state, raw).map_err(|_| no_assistant(raw))?;
    match state.storage.assistant_for_run(scope, assistant_id).await {
        Err(StorageError::NotFound(_)) => Err(no_assistant(raw)),
        other => Ok(other?),
    }
}

pub(crate) fn no_assistant(raw: &str) -> ApiError {
    ApiError::not_found(format!("No assistant found for \"{raw}\""))
        .with_detail("assistant_id", json!(raw))
}

/// A run body with the request's headers that `http.configurable_headers` selects copied into
/// its `config.configurable` (for runs created over HTTP only, as in the reference: crons'
/// firings and protocol commands carry none).
fn with_headers(state: &AppState, headers: &HeaderMap, mut body: RunCreate) -> RunCreate {
    state
        .http
        .configurable_headers
        .apply(headers, &mut body.config);
    body
}

/// Refuses a webhook whose host resolves where webhooks may not go (422 at `loc`), or any
/// webhook when `http.disable_webhooks` is set, before anything is stored.
pub(crate) async fn check_webhook(
    state: &AppState,
    body: &RunCreate,
    loc: Vec<Value>,
) -> ApiResult<()> {
    let Some(url) = body.webhook.as_deref() else {
        return Ok(());
    };
    if state.http.disable_webhooks {
        let message = "webhooks are turned off on this server (http.disable_webhooks)";
        let item = ValidationItem::new(loc, "webhooks_disabled", message).with_input(json!(url));
        return Err(ApiError::validation(vec![item]));
    }
    let Err(refusal) = state.webhooks.check(url).await else {
        return Ok(());
    };
    let item = ValidationItem::new(loc, refusal.kind, refusal.message).with_input(json!(url));
    Err(ApiError::validation(vec![item]))
}

/// `Location` (where to join the run: its `/join` for a JSON answer) and `Content-Location`
/// (the run itself), as the reference sends them on every response that creates or follows a
/// run.
pub(crate) fn locations(run: &Run) -> HeaderMap {
    run_locations(run, "join")
}

/// [`locations`] of a streamed run: `Location` is the run's `/stream`, which the official
/// clients reconnect to (with `Last-Event-ID`) when the stream is cut before the run's end;
/// langgraph-sdk reconnects only to a run stream's path, and the JS client would read `/join`'s
/// JSON as events.
fn stream_locations(run: &Run) -> HeaderMap {
    run_locations(run, "stream")
}

fn run_locations(run: &Run, follow: &str) -> HeaderMap {
    let base = format!("/threads/{}/runs/{}", run.thread_id, run.run_id);
    let mut headers = HeaderMap::new();
    // Ids have only letters, digits and . _ : -, so these are always valid header values.
    if let (Ok(location), Ok(content)) = (format!("{base}/{follow}").parse(), base.parse()) {
        headers.insert(axum::http::header::LOCATION, location);
        headers.insert(axum::http::header::CONTENT_LOCATION, content);
    }
    headers
}

/// Where a run stream's events come from at first.
enum Source {
    /// The log after this seq (from the run's first event without one), then live.
    Log(Option<i64>),
    /// A subscription taken before the run was created: live from the start (after the
    /// run's first event, when its creator already knows it).
    New(Subscription, Option<Box<LoggedEvent>>),
}

/// An SSE response following `run` from `source`. When the client leaves first and
/// `cancel_on_disconnect`, the run is cancelled; with `delete_after`, the run's (stateless)
/// thread is deleted once the run has ended.
fn stream_response(
    state: &AppState,
    scope: Scope,
    run: &Run,
    source: Source,
    cancel_on_disconnect: bool,
    delete_after: bool,
) -> Response {
    let mut headers = sse::headers();
    headers.extend(stream_locations(run));
    let (thread_id, run_id) = (run.thread_id, run.run_id);
    // What the stream's end may have to do, with what it needs for that: a join stream has
    // nothing to do, and keeps nothing (the state and the run are a kilobyte).
    let todo = (cancel_on_disconnect || delete_after)
        .then(|| Box::new((state.clone(), scope.clone(), run.clone())));
    let on_done = move |ended: bool| {
        let Some(todo) = todo else {
            return;
        };
        if ended && !delete_after {
            return;
        }
        tokio::spawn(async move {
            let (state, scope, run) = *todo;
            if !ended && cancel_on_disconnect {
                tracing::info!(%run_id, "client disconnected; cancelling the run (on_disconnect=cancel)");
                match state
                    .storage
                    .cancel_runs(&scope, thread_id, &[run_id], CancelAction::Interrupt)
                    .await
                {
                    Ok(ids) => state.workers.cancel_local(&ids),
                    Err(err) => tracing::warn!(%run_id, error = %err, "cannot cancel the run"),
                }
            }
            if delete_after {
                let _ = wait_for_end(&state, &scope, &run).await;
                if let Err(err) = spindle_execution::threads::delete_thread(
                    state.storage.as_ref(),
                    &scope,
                    thread_id,
                )
                .await
                {
                    tracing::warn!(%thread_id, error = %err, "cannot delete the stateless run's thread");
                }
            }
        });
    };
    let follow = |after| Follow {
        thread_id,
        target: Target::Run(run_id),
        after,
        with_ids: true,
    };
    let (storage, keepalive) = (state.storage.clone(), state.keepalive);
    let kind = match source {
        Source::Log(_) => StreamKind::RunJoin,
        Source::New(..) => StreamKind::Run,
    };
    let body = match source {
        Source::Log(after) => follow_stream(
            storage,
            state.hub.clone(),
            scope,
            follow(after),
            keepalive,
            on_done,
        )
        .left_stream(),
        Source::New(live, first) => follow_new_run(
            storage,
            live,
            scope,
            follow(None),
            first.as_deref(),
            keepalive,
            on_done,
        )
        .right_stream(),
    };
    let open = state.metrics.stream_opened(kind);
    let body = Body::from_stream(sse::held_open(body, open));
    (headers, body).into_response()
}

/// A join stream: the run's events from the log after `Last-Event-ID` (from its first
/// without one), then live. Leaving it never cancels the run.
fn join_response(
    state: &AppState,
    scope: Scope,
    run: &Run,
    headers: &HeaderMap,
) -> ApiResult<Response> {
    let after = sse::last_event_id(headers);
    let source = Source::Log(after);
    Ok(stream_response(state, scope, run, source, false, false))
}

/// The final values of an ended run, read from its thread (see [`crate::runs::final_values`]).
async fn final_values(state: &AppState, scope: &Scope, run: &Run) -> Value {
    let thread = state.storage.get_thread(scope, run.thread_id).await.ok();
    let no_interrupts = JsonObject::new();
    crate::runs::final_values(
        thread.as_ref().and_then(|t| t.values.as_ref()),
        thread.as_ref().map_or(&no_interrupts, |t| &t.interrupts),
        run.error.as_ref(),
    )
}

/// Waits until the run ends, then returns it as it ended.
async fn wait_for_end(state: &AppState, scope: &Scope, run: &Run) -> ApiResult<Run> {
    let mut live = state.hub.subscribe(run.thread_id);
    let ended = wait_on(state, scope, run, &mut live, Followed::SinceSeen).await?;
    Ok(ended.run)
}

/// Since when a waiter's subscription follows the run's thread.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Followed {
    /// Since before the run was created: its end cannot have been missed.
    SinceCreation,
    /// Since after the run was last seen: it may have ended in between.
    SinceSeen,
}

/// How a waiter learnt that a run ended.
struct Ended {
    run: Run,
    /// The final values, when the worker announced them with the end.
    values: Option<Value>,
}

/// Waits on `live` until the run ends. The database is asked at the start unless the
/// subscription predates the run, and again when the run may have ended unseen: it may
/// execute in another process (whose commits to the thread's log are announced, or else
/// every 500 ms), and a lagging subscription may have dropped the end.
async fn wait_on(
    state: &AppState,
    scope: &Scope,
    run: &Run,
    live: &mut Subscription,
    followed: Followed,
) -> ApiResult<Ended> {
    let mut ask = followed == Followed::SinceSeen;
    loop {
        if ask {
            let current = state
                .storage
                .get_run(scope, run.thread_id, run.run_id)
                .await?;
            if !current.status.is_active() {
                return Ok(Ended {
                    run: current,
                    values: None,
                });
            }
        }
        ask = true;
        let announced = live.announced();
        let ending = async {
            loop {
                match live.recv().await {
                    Ok(HubMessage::RunEnded { run_id, ended, .. }) if run_id == run.run_id => {
                        return ended
                    }
                    // A run executing here announces its end itself.
                    Ok(HubMessage::Logged { .. }) if !state.workers.is_executing(run.run_id) => {
                        return None
                    }
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        };
        let ended = if announced {
            Ok(ending.await)
        } else {
            tokio::time::timeout(Duration::from_millis(500), ending).await
        };
        if let Ok(Some(ended)) = ended {
            let values = crate::runs::final_values(
                ended.thread_values.as_ref(),
                &ended.thread_interrupts,
                ended.run.error.as_ref(),
            );
            return Ok(Ended {
                run: ended.run.clone(),
                values: Some(values),
            });
        }
    }
}

/// Waits for the run and answers its final values, with a newline every 5 s while waiting so
/// proxies keep the connection open.
fn wait_response(state: AppState, scope: Scope, run: Run, temporary_delete: bool) -> Response {
    let live = state.hub.subscribe(run.thread_id);
    respond_when_ended(
        state,
        scope,
        run,
        live,
        Followed::SinceSeen,
        temporary_delete,
    )
}

/// [`wait_response`] for a run just created, with `live` subscribed before its creation.
fn wait_response_for_new(
    state: AppState,
    scope: Scope,
    run: Run,
    live: Subscription,
    temporary_delete: bool,
) -> Response {
    respond_when_ended(
        state,
        scope,
        run,
        live,
        Followed::SinceCreation,
        temporary_delete,
    )
}

/// The body of both: waits on `live` (see [`wait_on`]), then answers the final values.
fn respond_when_ended(
    state: AppState,
    scope: Scope,
    run: Run,
    mut live: Subscription,
    followed: Followed,
    temporary_delete: bool,
) -> Response {
    let mut headers = locations(&run);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::convert::Infallible>>(4);
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_secs(5));
        ticker.tick().await;
        let ended = {
            let finished = wait_on(&state, &scope, &run, &mut live, followed);
            tokio::pin!(finished);
            loop {
                tokio::select! {
                    result = &mut finished => break result,
                    _ = ticker.tick() => {
                        if tx.send(Ok(bytes::Bytes::from_static(b"\n"))).await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        drop(live);
        let body = match ended {
            Ok(Ended {
                values: Some(values),
                ..
            }) => values,
            Ok(Ended { run, values: None }) => final_values(&state, &scope, &run).await,
            Err(e) => json!({"__error__": {"error": "Error", "message": e.message()}}),
        };
        let _ = tx.send(Ok(bytes::Bytes::from(body.to_string()))).await;
        if temporary_delete {
            if let Err(err) = spindle_execution::threads::delete_thread(
                state.storage.as_ref(),
                &scope,
                run.thread_id,
            )
            .await
            {
                tracing::warn!(thread_id = %run.thread_id, error = %err, "cannot delete the temporary thread");
            }
        }
    });
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (headers, Body::from_stream(stream)).into_response()
}

#[utoipa::path(post, path = "/threads/{thread_id}/runs", tag = "runs", request_body = RunCreate,
    params(("thread_id" = String, Path)),
    responses((status = 200, description = "the run, pending; it executes in the background", body = RunOut),
              (status = 404, body = ErrorBody), (status = 409, description = "multitask_strategy reject and the thread is busy", body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn create_run(
    State(state): State<AppState>,
    caller: AuthUser,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RunCreate>,
) -> ApiResult<Response> {
    let body = with_headers(&state, &headers, body);
    let thread_id = path_thread_id(&thread_id)?;
    let run = start_run(&state, &caller, thread_id, &body, Stateless::No, None)
        .await?
        .run;
    Ok((locations(&run), Json(RunOut::from(run))).into_response())
}

#[utoipa::path(post, path = "/threads/{thread_id}/runs/stream", tag = "runs", request_body = RunCreate,
    params(("thread_id" = String, Path)),
    responses((status = 200, description = "Server-Sent Events: metadata, then the requested stream modes", content_type = "text/event-stream", body = ServerSentEvent),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn stream_run(
    State(state): State<AppState>,
    caller: AuthUser,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RunCreate>,
) -> ApiResult<Response> {
    let body = with_headers(&state, &headers, body);
    let scope = caller.scope();
    let thread_id = path_thread_id(&thread_id)?;
    let live = state.hub.subscribe(thread_id);
    let started = start_run(&state, &caller, thread_id, &body, Stateless::No, None).await?;
    Ok(stream_started(&state, scope, started, live, &body, false))
}

/// The SSE response of a run `start_run` just created, on a thread `live` subscribed to before.
fn stream_started(
    state: &AppState,
    scope: Scope,
    started: StartedRun,
    live: Subscription,
    body: &RunCreate,
    delete_after: bool,
) -> Response {
    let cancel = body.on_disconnect.unwrap_or_default() == OnDisconnect::Cancel;
    let source = Source::New(live, started.first_event().map(Box::new));
    stream_response(state, scope, &started.run, source, cancel, delete_after)
}

#[utoipa::path(post, path = "/threads/{thread_id}/runs/wait", tag = "runs", request_body = RunCreate,
    params(("thread_id" = String, Path)),
    responses((status = 200, description = "the final values (`__interrupt__`, `__error__` when applicable)", body = Object),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn wait_run(
    State(state): State<AppState>,
    caller: AuthUser,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RunCreate>,
) -> ApiResult<Response> {
    let body = with_headers(&state, &headers, body);
    let scope = caller.scope();
    let thread_id = path_thread_id(&thread_id)?;
    let live = state.hub.subscribe(thread_id);
    let run = start_run(&state, &caller, thread_id, &body, Stateless::No, None)
        .await?
        .run;
    Ok(wait_response_for_new(state, scope, run, live, false))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListRunsQuery {
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    #[serde(default)]
    #[param(minimum = 0)]
    pub offset: Option<i64>,
    /// pending, running, error, success, timeout or interrupted.
    #[serde(default)]
    #[param(pattern = "^(pending|running|error|success|timeout|interrupted)$")]
    pub status: Option<String>,
}

impl Validate for ListRunsQuery {
    fn validate(&self, v: &mut Violations) {
        validate_page(v, self.limit, self.offset);
        if let Some(status) = self
            .status
            .as_deref()
            .filter(|s| RunStatus::parse(s).is_none())
        {
            v.push(
                &["status"],
                "enum",
                "Input should be pending, running, error, success, timeout or interrupted",
                json!(status),
                Value::Null,
            );
        }
    }
}

#[utoipa::path(get, path = "/threads/{thread_id}/runs", tag = "runs",
    params(("thread_id" = String, Path), ListRunsQuery),
    responses((status = 200, description = "runs, newest first", body = Vec<RunOut>), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn list_runs(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiQuery(query): ApiQuery<ListRunsQuery>,
) -> ApiResult<Json<Vec<RunOut>>> {
    let thread_id = path_thread_id(&thread_id)?;
    state.storage.get_thread(&scope, thread_id).await?;
    let filter = RunFilter {
        status: query.status.as_deref().and_then(RunStatus::parse),
    };
    let runs = state
        .storage
        .list_runs(&scope, thread_id, filter, page(query.limit, query.offset))
        .await?;
    Ok(Json(runs.into_iter().map(Into::into).collect()))
}

fn run_path(thread_id: &str, run_id: &str) -> ApiResult<(ResourceId, Uuid)> {
    Ok((path_thread_id(thread_id)?, path_uuid("run_id", run_id)?))
}

#[utoipa::path(get, path = "/threads/{thread_id}/runs/{run_id}", tag = "runs",
    params(("thread_id" = String, Path), ("run_id" = Uuid, Path)),
    responses((status = 200, body = RunOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_run(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> ApiResult<Json<RunOut>> {
    let (thread_id, run_id) = run_path(&thread_id, &run_id)?;
    Ok(Json(
        state
            .storage
            .get_run(&scope, thread_id, run_id)
            .await?
            .into(),
    ))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteRunQuery {
    /// 1: cancel an active run first; 0 (default): an active run is a conflict.
    #[serde(default)]
    #[param(minimum = 0, maximum = 1)]
    pub force: Option<u8>,
}

impl Validate for DeleteRunQuery {
    fn validate(&self, v: &mut Violations) {
        v.range("force", self.force.map(i64::from), 0, Some(1));
    }
}

#[utoipa::path(delete, path = "/threads/{thread_id}/runs/{run_id}", tag = "runs",
    params(("thread_id" = String, Path), ("run_id" = Uuid, Path), DeleteRunQuery),
    responses((status = 204, description = "deleted"), (status = 404, body = ErrorBody),
              (status = 409, description = "the run is active and force is 0", body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn delete_run(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path((thread_id, run_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<DeleteRunQuery>,
) -> ApiResult<StatusCode> {
    let (thread_id, run_id) = run_path(&thread_id, &run_id)?;
    let run = state.storage.get_run(&scope, thread_id, run_id).await?;
    if run.status.is_active() {
        if query.force.unwrap_or(0) == 0 {
            return Err(ApiError::conflict(format!(
                "Run {run_id} is {}; delete it with force=1 to cancel it first",
                run.status.as_str()
            )));
        }
        let ids = state
            .storage
            .cancel_runs(&scope, thread_id, &[run_id], CancelAction::Interrupt)
            .await?;
        state.workers.cancel_local(&ids);
        wait_for_end(&state, &scope, &run).await?;
    }
    match state.storage.delete_run(&scope, thread_id, run_id).await {
        Ok(()) | Err(spindle_storage::StorageError::NotFound(_)) => Ok(StatusCode::NO_CONTENT),
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(get, path = "/threads/{thread_id}/runs/{run_id}/join", tag = "runs",
    params(("thread_id" = String, Path), ("run_id" = Uuid, Path)),
    responses((status = 200, description = "the final values once the run ended", body = Object), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn join_run(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let (thread_id, run_id) = run_path(&thread_id, &run_id)?;
    let run = state.storage.get_run(&scope, thread_id, run_id).await?;
    Ok(wait_response(state, scope, run, false))
}

#[utoipa::path(get, path = "/threads/{thread_id}/runs/{run_id}/stream", tag = "runs",
    params(("thread_id" = String, Path), ("run_id" = Uuid, Path),
           ("Last-Event-ID" = Option<String>, Header, description = "resume after this event id; -1 replays all")),
    responses((status = 200, description = "the run's events from the log, then live", content_type = "text/event-stream", body = ServerSentEvent),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn join_run_stream(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path((thread_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (thread_id, run_id) = run_path(&thread_id, &run_id)?;
    let run = state.storage.get_run(&scope, thread_id, run_id).await?;
    join_response(&state, scope, &run, &headers)
}

#[utoipa::path(get, path = "/runs/{run_id}/stream", tag = "runs",
    params(("run_id" = Uuid, Path),
           ("Last-Event-ID" = Option<String>, Header, description = "resume after this event id; -1 replays all")),
    responses((status = 200, description = "the run's events from the log, then live (the JS client joins stateless runs here)", content_type = "text/event-stream", body = ServerSentEvent),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn join_stateless_run_stream(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let run_id = path_uuid("run_id", &run_id)?;
    let run = state.storage.find_run(&scope, run_id).await?;
    join_response(&state, scope, &run, &headers)
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CancelQuery {
    /// Wait until the run has stopped.
    #[serde(default, deserialize_with = "crate::wire::query_bool")]
    #[param(value_type = Option<bool>)]
    pub wait: Option<bool>,
    /// interrupt (default) or rollback.
    #[serde(default)]
    #[param(pattern = "^(interrupt|rollback)$")]
    pub action: Option<String>,
}

impl Validate for CancelQuery {
    fn validate(&self, v: &mut Violations) {
        if let Some(action) = self
            .action
            .as_deref()
            .filter(|a| CancelAction::parse(a).is_none())
        {
            v.push(
                &["action"],
                "enum",
                "Input should be interrupt or rollback",
                json!(action),
                Value::Null,
            );
        }
    }
}

#[utoipa::path(post, path = "/threads/{thread_id}/runs/{run_id}/cancel", tag = "runs",
    params(("thread_id" = String, Path), ("run_id" = Uuid, Path), CancelQuery),
    responses((status = 202, description = "cancel requested"), (status = 204, description = "cancelled (wait=true)"),
              (status = 404, description = "no such active run", body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn cancel_run(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path((thread_id, run_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<CancelQuery>,
) -> ApiResult<StatusCode> {
    let (thread_id, run_id) = run_path(&thread_id, &run_id)?;
    let run = state.storage.get_run(&scope, thread_id, run_id).await?;
    if !run.status.is_active() {
        return Err(ApiError::not_found(format!("Run {run_id} is not active")));
    }
    let action = query
        .action
        .as_deref()
        .and_then(CancelAction::parse)
        .unwrap_or_default();
    let ids = state
        .storage
        .cancel_runs(&scope, thread_id, &[run_id], action)
        .await?;
    state.workers.cancel_local(&ids);
    if query.wait.unwrap_or(false) {
        match wait_for_end(&state, &scope, &run).await {
            Ok(_) | Err(_) => return Ok(StatusCode::NO_CONTENT),
        }
    }
    Ok(StatusCode::ACCEPTED)
}

/// Starts a stateless run: a new thread made for it, removed afterwards unless
/// `on_completion=keep`.
async fn start_stateless(
    state: &AppState,
    caller: &AuthUser,
    thread_id: ResourceId,
    body: &RunCreate,
    background: bool,
) -> ApiResult<(StartedRun, Stateless)> {
    let stateless = stateless_of(body, background);
    let started = start_run(state, caller, thread_id, body, stateless, None).await?;
    Ok((started, stateless))
}

#[utoipa::path(post, path = "/runs", tag = "runs", request_body = RunCreate,
    responses((status = 200, description = "the run, pending, on a new thread", body = RunOut),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn create_stateless_run(
    State(state): State<AppState>,
    caller: AuthUser,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RunCreate>,
) -> ApiResult<Response> {
    let body = with_headers(&state, &headers, body);
    let (StartedRun { run, .. }, _) =
        start_stateless(&state, &caller, ResourceId::generate(), &body, true).await?;
    Ok((locations(&run), Json(RunOut::from(run))).into_response())
}

#[utoipa::path(post, path = "/runs/stream", tag = "runs", request_body = RunCreate,
    responses((status = 200, description = "Server-Sent Events of a run on a new thread", content_type = "text/event-stream", body = ServerSentEvent),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn stream_stateless_run(
    State(state): State<AppState>,
    caller: AuthUser,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RunCreate>,
) -> ApiResult<Response> {
    let body = with_headers(&state, &headers, body);
    let scope = caller.scope();
    let thread_id = ResourceId::generate();
    let live = state.hub.subscribe(thread_id);
    let (started, stateless) = start_stateless(&state, &caller, thread_id, &body, false).await?;
    let delete = stateless == Stateless::DeleteAfterResponse;
    Ok(stream_started(&state, scope, started, live, &body, delete))
}

#[utoipa::path(post, path = "/runs/wait", tag = "runs", request_body = RunCreate,
    responses((status = 200, description = "the final values of a run on a new thread", body = Object),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn wait_stateless_run(
    State(state): State<AppState>,
    caller: AuthUser,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RunCreate>,
) -> ApiResult<Response> {
    let body = with_headers(&state, &headers, body);
    let scope = caller.scope();
    let thread_id = ResourceId::generate();
    let live = state.hub.subscribe(thread_id);
    let (StartedRun { run, .. }, stateless) =
        start_stateless(&state, &caller, thread_id, &body, false).await?;
    let delete = stateless == Stateless::DeleteAfterResponse;
    Ok(wait_response_for_new(state, scope, run, live, delete))
}

#[utoipa::path(post, path = "/runs/batch", tag = "runs", request_body = Vec<RunCreate>,
    responses((status = 200, description = "the runs, pending, each on a new thread", body = Vec<RunOut>),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn create_run_batch(
    State(state): State<AppState>,
    caller: AuthUser,
    headers: HeaderMap,
    ApiJson(bodies): ApiJson<Vec<RunCreate>>,
) -> ApiResult<Json<Vec<RunOut>>> {
    let bodies: Vec<RunCreate> = bodies
        .into_iter()
        .map(|body| with_headers(&state, &headers, body))
        .collect();
    let scope = caller.scope();
    // Everything a run of the batch could be refused for is checked first (its assistant,
    // its webhook), so that a refused item leaves no run of the batch behind.
    for (index, body) in bodies.iter().enumerate() {
        run_assistant(&state, &scope, &body.assistant_id).await?;
        check_webhook(
            &state,
            body,
            vec![json!("body"), json!(index), json!("webhook")],
        )
        .await?;
    }
    let mut runs = Vec::with_capacity(bodies.len());
    for body in &bodies {
        let (StartedRun { run, .. }, _) =
            start_stateless(&state, &caller, ResourceId::generate(), body, true).await?;
        runs.push(RunOut::from(run));
    }
    Ok(Json(runs))
}

/// Which runs `POST /runs/cancel` stops: some runs of a thread, or every active run of the
/// caller with a status.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CancelManyRequest {
    pub thread_id: Option<ResourceId>,
    #[serde(default)]
    pub run_ids: Option<Vec<Uuid>>,
    /// pending, running or all: every such run of the caller, in any thread. Exclusive with
    /// `thread_id` and `run_ids`.
    #[serde(default)]
    pub status: Option<CancelStatus>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CancelStatus {
    Pending,
    Running,
    All,
}

impl Validate for CancelManyRequest {
    fn validate(&self, v: &mut Violations) {
        if self.status.is_some() {
            for (field, given) in [
                ("thread_id", self.thread_id.is_some()),
                ("run_ids", self.run_ids.is_some()),
            ] {
                if given {
                    v.push(
                        &[field],
                        "value_error",
                        "Cancel either by status or by thread_id and run_ids, not both",
                        Value::Null,
                        Value::Null,
                    );
                }
            }
            return;
        }
        if self.thread_id.is_none() {
            v.push(
                &["thread_id"],
                "missing",
                "Field required (with run_ids), unless status is given",
                Value::Null,
                Value::Null,
            );
        }
        if self.run_ids.as_ref().is_none_or(Vec::is_empty) {
            v.push(
                &["run_ids"],
                "missing",
                "Field required: the runs to cancel, unless status is given",
                Value::Null,
                Value::Null,
            );
        }
    }
}

#[utoipa::path(post, path = "/runs/cancel", tag = "runs", request_body = CancelManyRequest, params(CancelQuery),
    responses((status = 204, description = "cancel requested"), (status = 404, body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn cancel_many_runs(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiQuery(query): ApiQuery<CancelQuery>,
    ApiJson(body): ApiJson<CancelManyRequest>,
) -> ApiResult<StatusCode> {
    let action = query
        .action
        .as_deref()
        .and_then(CancelAction::parse)
        .unwrap_or_default();
    let targets = match (body.status, body.thread_id, body.run_ids) {
        (Some(status), _, _) => runs_by_thread(&state, &scope, status).await?,
        (None, Some(thread_id), Some(run_ids)) => vec![(thread_id, run_ids)],
        _ => return Err(ApiError::internal("validated request lost its fields")),
    };
    for (thread_id, run_ids) in targets {
        match state
            .storage
            .cancel_runs(&scope, thread_id, &run_ids, action)
            .await
        {
            Ok(cancelled) => state.workers.cancel_local(&cancelled),
            // By status, a run may end between the listing and its cancel: nothing to stop.
            Err(spindle_storage::StorageError::NotFound(_)) if body.status.is_some() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The caller's active runs of a status, grouped by thread (a cancel is one transaction per
/// thread).
async fn runs_by_thread(
    state: &AppState,
    scope: &Scope,
    status: CancelStatus,
) -> ApiResult<Vec<(ResourceId, Vec<Uuid>)>> {
    let status = match status {
        CancelStatus::Pending => Some(RunStatus::Pending),
        CancelStatus::Running => Some(RunStatus::Running),
        CancelStatus::All => None,
    };
    let mut grouped: Vec<(ResourceId, Vec<Uuid>)> = Vec::new();
    for (thread_id, run_id) in state.storage.active_runs(scope, status).await? {
        match grouped.iter_mut().find(|(t, _)| *t == thread_id) {
            Some((_, runs)) => runs.push(run_id),
            None => grouped.push((thread_id, vec![run_id])),
        }
    }
    Ok(grouped)
}
