//! `/threads/{id}/state` and `/threads/{id}/history`: a thread's state at its latest or any
//! checkpoint, its history (newest first), and state edits as if a node had written them.
//!
//! A thread's graph is the one its metadata names (`graph_id`, set when a run creates the
//! thread or by the client), else the graph of its latest run's assistant. A thread without
//! either has no state to show: reads answer an empty state (or no history), as LangGraph does.
//! Reading a state or a history page costs a fixed number of queries whatever the length of
//! the thread (see `spindle_storage::checkpoints`).

use spindle_storage::ResourceId;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use spindle_graph::checkpoint::{metadata_matches, CheckpointError, ListFilter};
use spindle_graph::pregel::{self, NodeUpdate, PreparedUpdate, StateSnapshot, UpdateError};
use spindle_graph::Graph;
use spindle_storage::{CheckpointWrite, RunFilter, Scope, StateWrite, Thread, ThreadEvent};
use utoipa::openapi::schema::{Object, ObjectBuilder, OneOfBuilder, SchemaType, Type};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ApiResult, ErrorBody, ErrorCode, ValidationErrorBody};
use crate::extract::{ApiJson, ApiQuery, Validate, Violations};
use crate::runs::stream::STATE_UPDATE_EVENT;
use crate::state::{AppState, Caller};
use crate::wire::{page, path_thread_id};
use spindle_execution::graphs::LoadedGraph;
use spindle_execution::hub::HubMessage;
use spindle_execution::python::reads as python_reads;
use spindle_execution::threads::state_columns;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_state, update_state))
        .routes(routes!(get_state_at))
        .routes(routes!(post_state_at))
        .routes(routes!(get_history, post_history))
}

/// `limit` of a history page: 1 to 1000; LangGraph's server reads 1 when it is not given.
const HISTORY_DEFAULT_LIMIT: i64 = 1;
const HISTORY_MAX_LIMIT: i64 = 1000;

/// A checkpoint reference in a body (`checkpoint_id`, `checkpoint_ns`; `thread_id` is the
/// path's and ignored).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct CheckpointRefIn {
    #[serde(default)]
    pub checkpoint_id: Option<String>,
    /// `""` (the root graph, the default) or a subgraph's `node:task_id[|...]`.
    #[serde(default)]
    pub checkpoint_ns: Option<String>,
    #[serde(default)]
    pub thread_id: Option<String>,
    /// Accepted for compatibility (any value); namespaces are followed through `checkpoint_ns`.
    #[serde(default)]
    #[schema(value_type = Value)]
    pub checkpoint_map: Option<Value>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StateQuery {
    /// Inline the state of pending subgraph tasks.
    #[serde(default, deserialize_with = "crate::wire::query_bool")]
    #[param(value_type = Option<bool>)]
    pub subgraphs: Option<bool>,
}

impl Validate for StateQuery {}

/// The body of `POST /threads/{id}/state/checkpoint`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct StateAtRequest {
    #[serde(deserialize_with = "crate::extract::object")]
    pub checkpoint: CheckpointRefIn,
    #[serde(default)]
    pub subgraphs: Option<bool>,
}

impl Validate for StateAtRequest {}

/// The body of `POST /threads/{id}/state`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct StateUpdateRequest {
    /// The writes, as if `as_node` had returned them: an object (or `[key, value]` pairs).
    #[serde(default)]
    #[schema(schema_with = values_schema)]
    pub values: Option<Value>,
    /// The node that "wrote" them; by default the node that ran last.
    #[serde(default)]
    pub as_node: Option<String>,
    /// Edit the state at this checkpoint instead of the latest (the thread forks from it);
    /// with `checkpoint_ns`, the state of that subgraph (e.g. while it waits at an interrupt:
    /// the run that resumes it continues from the edit).
    #[serde(default, deserialize_with = "crate::extract::opt_object")]
    pub checkpoint: Option<CheckpointRefIn>,
    /// Short form of `checkpoint.checkpoint_id`.
    #[serde(default)]
    pub checkpoint_id: Option<String>,
}

impl Validate for StateUpdateRequest {
    fn validate(&self, v: &mut Violations) {
        if let Some(values) = &self.values {
            if !(values.is_object() || values.is_array() || values.is_null()) {
                v.push(
                    &["values"],
                    "model_type",
                    "Input should be an object, a list or null",
                    values.clone(),
                    Value::Null,
                );
            }
        }
    }
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// 1 to 1000 (default 1).
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Only states older than this checkpoint id.
    #[serde(default)]
    pub before: Option<String>,
}

impl Validate for HistoryQuery {
    fn validate(&self, v: &mut Violations) {
        v.range("limit", self.limit, 1, Some(HISTORY_MAX_LIMIT));
    }
}

/// The body of `POST /threads/{id}/history`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct HistoryRequest {
    /// 1 to 1000 (default 1).
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Only states older than this checkpoint: its id, a checkpoint object
    /// (`{checkpoint_id}`) or a config (`{configurable: {checkpoint_id}}`).
    #[serde(default)]
    #[schema(schema_with = before_schema)]
    pub before: Option<Value>,
    /// Only states whose checkpoint metadata holds these key/value pairs.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    /// A subgraph's namespace (`checkpoint_ns`); with `checkpoint_id`, only that state.
    #[serde(default, deserialize_with = "crate::extract::opt_object")]
    pub checkpoint: Option<CheckpointRefIn>,
    /// Inline the state of pending subgraph tasks in each state.
    #[serde(default)]
    pub subgraphs: Option<bool>,
    /// A subgraph's namespace (`checkpoint.checkpoint_ns` wins).
    #[serde(default)]
    pub checkpoint_ns: Option<String>,
}

impl Validate for HistoryRequest {
    fn validate(&self, v: &mut Violations) {
        v.range("limit", self.limit, 1, Some(HISTORY_MAX_LIMIT));
        v.filter_size("metadata", self.metadata.as_ref());
        if let Err(bad) = before_id(self.before.as_ref()) {
            v.push(
                &["before"],
                "checkpoint_type",
                "Input should be a checkpoint id, a checkpoint ({checkpoint_id}) or a config \
                 ({configurable: {checkpoint_id}})",
                bad,
                Value::Null,
            );
        }
    }
}

/// `values` of a state update: an object, a list of `[key, value]` pairs, or null.
fn values_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([
            Type::Object,
            Type::Array,
            Type::Null,
        ]))
        .build()
}

/// `before` of a history request, as [`before_id`] reads it: a checkpoint id, an object with a
/// string `checkpoint_id`, a config whose `configurable` has one, or null.
fn before_schema() -> OneOfBuilder {
    let with_id = || {
        ObjectBuilder::new()
            .property(
                "checkpoint_id",
                ObjectBuilder::new().schema_type(Type::String),
            )
            .required("checkpoint_id")
    };
    // Without `configurable` (utoipa has no builder for `not`).
    let mut checkpoint = with_id().build();
    checkpoint
        .extensions
        .get_or_insert_with(Default::default)
        .insert("not".into(), json!({"required": ["configurable"]}));
    let config = ObjectBuilder::new()
        .property("configurable", with_id())
        .required("configurable");
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(checkpoint)
        .item(config)
        .item(ObjectBuilder::new().schema_type(Type::Null))
}

/// The checkpoint id `before` names; the offending value when it names none.
fn before_id(before: Option<&Value>) -> Result<Option<String>, Value> {
    let id_in = |v: &Value| {
        v.get("checkpoint_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match before {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(id.clone())),
        Some(v @ Value::Object(o)) => match o.get("configurable") {
            Some(conf) => id_in(conf).map(Some).ok_or_else(|| v.clone()),
            None => id_in(v).map(Some).ok_or_else(|| v.clone()),
        },
        Some(other) => Err(other.clone()),
    }
}

/// A thread's state as `GET /threads/{id}/state` answers it (LangGraph's `ThreadState`).
#[derive(Debug, ToSchema)]
#[schema(as = ThreadState)]
#[allow(dead_code)]
pub struct ThreadStateDoc {
    #[schema(value_type = Object)]
    values: Value,
    next: Vec<String>,
    #[schema(value_type = Vec<Object>)]
    tasks: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    interrupts: Vec<Value>,
    #[schema(value_type = Option<Object>)]
    metadata: Value,
    created_at: Option<String>,
    #[schema(value_type = Option<Object>)]
    checkpoint: Value,
    #[schema(value_type = Option<Object>)]
    parent_checkpoint: Value,
    checkpoint_id: Option<String>,
    parent_checkpoint_id: Option<String>,
}

/// What `POST /threads/{id}/state` answers: where the new checkpoint is.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct StateUpdateResponse {
    /// `{thread_id, checkpoint_ns, checkpoint_id}`.
    #[schema(value_type = Object)]
    checkpoint: Value,
    /// The same, under LangGraph's older name.
    #[schema(value_type = Object)]
    configurable: Value,
    checkpoint_id: String,
}

/// The graph whose state a thread holds: a graph file's, read by the engine here, or a
/// Python graph's, read by a worker.
pub(crate) enum ThreadGraph {
    Engine(Arc<Graph>),
    Python(String),
}

/// The graph whose state the thread holds, if it has one.
pub(crate) async fn thread_graph_of(
    state: &AppState,
    scope: &Scope,
    thread: &Thread,
) -> ApiResult<Option<ThreadGraph>> {
    let graph_id = match thread.metadata.get("graph_id").and_then(Value::as_str) {
        Some(id) => Some(id.to_owned()),
        None => latest_run_graph(state, scope, thread.thread_id).await?,
    };
    let Some(graph_id) = graph_id else {
        return Ok(None);
    };
    match state.graphs.loaded(&graph_id) {
        Some(LoadedGraph::Engine(graph)) => Ok(Some(ThreadGraph::Engine(graph))),
        Some(LoadedGraph::Python(_)) => Ok(Some(ThreadGraph::Python(graph_id))),
        // The thread's state, not the request, is at fault: a conflict (409), as for a busy
        // thread.
        None => Err(ApiError::conflict(format!(
            "the thread's graph '{graph_id}' is not loaded in this server"
        ))),
    }
}

/// The graph of the assistant of the thread's latest run.
async fn latest_run_graph(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
) -> ApiResult<Option<String>> {
    let runs = state
        .storage
        .list_runs(scope, thread_id, RunFilter::default(), page(Some(1), None))
        .await?;
    let Some(run) = runs.first() else {
        return Ok(None);
    };
    match state.storage.get_assistant(scope, run.assistant_id).await {
        Ok(assistant) => Ok(Some(assistant.fields.graph_id)),
        Err(spindle_storage::StorageError::NotFound(_)) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

fn checkpoint_failed(err: CheckpointError) -> ApiError {
    ApiError::internal(format!("cannot read the thread's checkpoints: {err}"))
}

/// Where a state read points.
pub(crate) struct StateAt<'a> {
    pub checkpoint_ns: &'a str,
    pub checkpoint_id: Option<&'a str>,
    pub subgraphs: bool,
}

/// The state of a thread at a checkpoint (the latest by default), as JSON, whichever engine
/// runs its graph.
pub(crate) async fn read_state(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
    at: StateAt<'_>,
) -> ApiResult<Value> {
    let at_subgraphs = at.subgraphs;
    let thread = state.storage.get_thread(scope, thread_id).await?;
    let tid = thread_id.to_string();
    let graph = match thread_graph_of(state, scope, &thread).await? {
        None => return Ok(empty_state(&tid, at.checkpoint_id)),
        Some(ThreadGraph::Engine(graph)) => graph,
        Some(ThreadGraph::Python(graph_id)) => {
            let at = python_reads::At {
                thread_id: tid,
                checkpoint_ns: at.checkpoint_ns.to_owned(),
                checkpoint_id: at.checkpoint_id.map(str::to_owned),
            };
            return python_state(state, &graph_id, &at, at_subgraphs).await;
        }
    };
    let saver = state.storage.checkpointer();
    let (ns, id) = (at.checkpoint_ns, at.checkpoint_id);
    let snapshot = if at.subgraphs {
        pregel::get_state_with_subgraphs(&graph, saver.as_ref(), &tid, ns, id).await
    } else {
        pregel::get_state(&graph, saver.as_ref(), &tid, ns, id).await
    }
    .map_err(checkpoint_failed)?;
    Ok(match snapshot {
        Some(s) => s.to_json(),
        None => empty_state(&tid, at.checkpoint_id),
    })
}

/// The state of no checkpoint, as LangGraph answers it: nothing, pointing at the checkpoint
/// asked for (if one was).
fn empty_state(thread_id: &str, asked: Option<&str>) -> Value {
    let mut empty = StateSnapshot::empty(thread_id, "").to_json();
    if let Some(id) = asked {
        empty["checkpoint"] = json!({"checkpoint_id": id, "thread_id": thread_id});
        empty["checkpoint_id"] = json!(id);
    }
    empty
}

#[utoipa::path(get, path = "/threads/{thread_id}/state", tag = "threads",
    params(("thread_id" = String, Path), StateQuery),
    responses((status = 200, description = "the state at the latest checkpoint (empty when there is none)", body = ThreadStateDoc),
              (status = 404, body = ErrorBody), (status = 409, description = "the thread's graph is not loaded in this server", body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_state(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiQuery(query): ApiQuery<StateQuery>,
) -> ApiResult<Json<Value>> {
    let id = path_thread_id(&thread_id)?;
    let at = StateAt {
        checkpoint_ns: "",
        checkpoint_id: None,
        subgraphs: query.subgraphs.unwrap_or(false),
    };
    Ok(Json(read_state(&state, &scope, id, at).await?))
}

#[utoipa::path(get, path = "/threads/{thread_id}/state/{checkpoint_id}", tag = "threads",
    params(("thread_id" = String, Path), ("checkpoint_id" = String, Path), StateQuery),
    responses((status = 200, description = "the state at that checkpoint (empty when the thread has no such checkpoint)", body = ThreadStateDoc),
              (status = 404, body = ErrorBody), (status = 409, description = "the thread's graph is not loaded in this server", body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_state_at(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path((thread_id, checkpoint_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<StateQuery>,
) -> ApiResult<Json<Value>> {
    let id = path_thread_id(&thread_id)?;
    let at = StateAt {
        checkpoint_ns: "",
        checkpoint_id: Some(&checkpoint_id),
        subgraphs: query.subgraphs.unwrap_or(false),
    };
    Ok(Json(read_state(&state, &scope, id, at).await?))
}

#[utoipa::path(post, path = "/threads/{thread_id}/state/checkpoint", tag = "threads",
    request_body = StateAtRequest, params(("thread_id" = String, Path)),
    responses((status = 200, description = "the state at that checkpoint; a namespace without an id gives that subgraph's latest state", body = ThreadStateDoc),
              (status = 404, body = ErrorBody), (status = 409, description = "the thread's graph is not loaded in this server", body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn post_state_at(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiJson(body): ApiJson<StateAtRequest>,
) -> ApiResult<Json<Value>> {
    let id = path_thread_id(&thread_id)?;
    let at = StateAt {
        checkpoint_ns: body.checkpoint.checkpoint_ns.as_deref().unwrap_or(""),
        checkpoint_id: body.checkpoint.checkpoint_id.as_deref(),
        subgraphs: body.subgraphs.unwrap_or(false),
    };
    Ok(Json(read_state(&state, &scope, id, at).await?))
}

/// What a history page asks for.
pub(crate) struct HistoryAsk {
    pub checkpoint_ns: String,
    /// Only this checkpoint (a `checkpoint.checkpoint_id`), as LangGraph's list does.
    pub only: Option<String>,
    pub filter: ListFilter,
    pub subgraphs: bool,
}

/// A page of the thread's history as JSON, newest first, whichever engine runs its graph.
pub(crate) async fn read_history(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
    ask: HistoryAsk,
) -> ApiResult<Vec<Value>> {
    let thread = state.storage.get_thread(scope, thread_id).await?;
    let tid = thread_id.to_string();
    let graph = match thread_graph_of(state, scope, &thread).await? {
        None => return Ok(Vec::new()),
        Some(ThreadGraph::Engine(graph)) => graph,
        Some(ThreadGraph::Python(graph_id)) => {
            return python_history(state, &graph_id, tid, ask).await;
        }
    };
    let saver = state.storage.checkpointer();
    let ns = ask.checkpoint_ns.as_str();
    let mut states = match &ask.only {
        Some(id) => pregel::get_state(&graph, saver.as_ref(), &tid, ns, Some(id))
            .await
            .map_err(checkpoint_failed)?
            .filter(|s| {
                let older = ask.filter.before.as_ref().is_none_or(|b| id < b);
                older && metadata_matches(&s.metadata, ask.filter.metadata.as_ref())
            })
            .into_iter()
            .collect(),
        None => pregel::get_state_history(&graph, saver.as_ref(), &tid, ns, &ask.filter)
            .await
            .map_err(checkpoint_failed)?,
    };
    if ask.subgraphs {
        for s in states.iter_mut() {
            pregel::inline_subgraph_states(&graph, saver.as_ref(), s)
                .await
                .map_err(checkpoint_failed)?;
        }
    }
    Ok(states.iter().map(StateSnapshot::to_json).collect())
}

/// `POST /threads/{id}/state` on a Python graph's thread: the worker runs LangGraph's
/// `update_state` (the graph's reducers, `as_node`), then the thread's columns follow the new
/// state, with the state-update event, as for a graph file's thread.
///
/// The busy check comes first: the worker stores the new checkpoint itself, so a thread
/// with a run pending or running is refused before anything is written. (A run created in
/// the instant between the check and the write is then refused its columns; the checkpoint
/// stays, as the latest the run starts from.)
async fn python_update_state(
    state: &AppState,
    scope: &Scope,
    thread: &Thread,
    graph_id: &str,
    body: StateUpdateRequest,
) -> ApiResult<Json<Value>> {
    if thread.status == spindle_storage::ThreadStatus::Busy {
        return Err(ApiError::conflict(format!(
            "thread {} has a run pending or running; edit its state once it is done",
            thread.thread_id
        )));
    }
    let pool = python_pool(state)?;
    let tid = thread.thread_id.to_string();
    let at = python_reads::At {
        thread_id: tid.clone(),
        checkpoint_ns: body
            .checkpoint
            .as_ref()
            .and_then(|c| c.checkpoint_ns.clone())
            .unwrap_or_default(),
        checkpoint_id: body
            .checkpoint
            .as_ref()
            .and_then(|c| c.checkpoint_id.clone())
            .or(body.checkpoint_id),
    };
    let mut update = json!({"values": body.values});
    if let Some(node) = body.as_node {
        update["as_node"] = json!(node);
    }
    let updated = python_update(pool, graph_id, &at, json!([[update]]), "values").await?;
    let event = ThreadEvent {
        event: STATE_UPDATE_EVENT.into(),
        data: json!({"state": updated.snapshot, "thread_id": tid}),
    };
    let stored = state
        .storage
        .write_thread_state(scope, thread.thread_id, updated.state_write(), Some(event))
        .await?;
    if let Some(event) = stored.event {
        state
            .hub
            .publish(thread.thread_id, HubMessage::Event(Arc::new(event)));
    }
    let written = updated.written;
    Ok(Json(json!({
        "checkpoint": written,
        "configurable": written,
        "checkpoint_id": written["checkpoint_id"],
    })))
}

/// A Python graph's thread after an edit a worker made (LangGraph's `bulk_update_state`).
pub(crate) struct PythonUpdated {
    /// Where the new checkpoint is (`{thread_id, checkpoint_ns, checkpoint_id}`).
    pub written: Value,
    /// The thread's state after it, as the API shows it.
    pub snapshot: Value,
}

impl PythonUpdated {
    /// The thread's columns for that state (no checkpoints: the worker saved them).
    pub fn state_write(&self) -> StateWrite {
        StateWrite {
            checkpoints: Vec::new(),
            columns: python_reads::columns_of(&self.snapshot),
            expect_latest: None,
        }
    }
}

/// Applies `supersteps` (each a list of `{values, command?, as_node}`) to a Python graph's
/// thread from the checkpoint `at` names, then reads the thread's latest state back. An update
/// the graph refuses is a 422 on the body's `field`.
pub(crate) async fn python_update(
    pool: &Arc<spindle_execution::python::pool::PythonPool>,
    graph_id: &str,
    at: &python_reads::At,
    supersteps: Value,
    field: &str,
) -> ApiResult<PythonUpdated> {
    let written = python_reads::update(pool, graph_id, at, supersteps)
        .await
        .map_err(|e| match e {
            python_reads::ReadError::Invalid(msg) => {
                ApiError::field(vec![json!("body"), json!(field)], "invalid_update", msg)
            }
            other => python_read_failed(other),
        })?;
    let latest = python_reads::At {
        thread_id: at.thread_id.clone(),
        ..Default::default()
    };
    let snapshot = python_reads::state(pool, graph_id, &latest, false)
        .await
        .map_err(python_read_failed)?;
    Ok(PythonUpdated { written, snapshot })
}

/// A Python graph's thread state, as its worker reads it.
async fn python_state(
    state: &AppState,
    graph_id: &str,
    at: &python_reads::At,
    subgraphs: bool,
) -> ApiResult<Value> {
    let pool = python_pool(state)?;
    python_reads::state(pool, graph_id, at, subgraphs)
        .await
        .map_err(python_read_failed)
}

/// A page of a Python graph's thread history, as its worker reads it.
async fn python_history(
    state: &AppState,
    graph_id: &str,
    thread_id: String,
    ask: HistoryAsk,
) -> ApiResult<Vec<Value>> {
    let pool = python_pool(state)?;
    let at = python_reads::At {
        thread_id,
        checkpoint_ns: ask.checkpoint_ns,
        checkpoint_id: ask.only,
    };
    let limit = ask.filter.limit.unwrap_or(HISTORY_DEFAULT_LIMIT as usize);
    let before = ask.filter.before.as_deref();
    let filter = ask.filter.metadata.as_ref();
    python_reads::history(pool, graph_id, &at, limit, before, filter)
        .await
        .map_err(python_read_failed)
}

pub(crate) fn python_pool(
    state: &AppState,
) -> ApiResult<&Arc<spindle_execution::python::pool::PythonPool>> {
    state
        .workers
        .python()
        .ok_or_else(|| ApiError::conflict("this server has no Python workers"))
}

/// A worker's refusal as the API's error: the request's fault (422), the graph's (409), or
/// no worker to answer (503).
pub(crate) fn python_read_failed(err: python_reads::ReadError) -> ApiError {
    use python_reads::ReadError;
    match err {
        ReadError::Invalid(msg) => ApiError::new(crate::error::ErrorCode::InvalidRequest, msg),
        ReadError::NotLoaded(msg) => ApiError::conflict(msg),
        ReadError::Unavailable(msg) => ApiError::new(crate::error::ErrorCode::Unavailable, msg),
    }
}

fn history_limit(limit: Option<i64>) -> usize {
    limit
        .unwrap_or(HISTORY_DEFAULT_LIMIT)
        .clamp(1, HISTORY_MAX_LIMIT) as usize
}

#[utoipa::path(get, path = "/threads/{thread_id}/history", tag = "threads",
    params(("thread_id" = String, Path), HistoryQuery),
    responses((status = 200, description = "states, newest first", body = Vec<ThreadStateDoc>),
              (status = 404, body = ErrorBody), (status = 409, description = "the thread's graph is not loaded in this server", body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_history(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let id = path_thread_id(&thread_id)?;
    let ask = HistoryAsk {
        checkpoint_ns: String::new(),
        only: None,
        filter: ListFilter {
            before: query.before,
            limit: Some(history_limit(query.limit)),
            metadata: None,
        },
        subgraphs: false,
    };
    Ok(Json(read_history(&state, &scope, id, ask).await?))
}

#[utoipa::path(post, path = "/threads/{thread_id}/history", tag = "threads",
    request_body = Option<HistoryRequest>, params(("thread_id" = String, Path)),
    responses((status = 200, description = "states, newest first", body = Vec<ThreadStateDoc>),
              (status = 404, body = ErrorBody), (status = 409, description = "the thread's graph is not loaded in this server", body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn post_history(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiJson(body): ApiJson<HistoryRequest>,
) -> ApiResult<Json<Vec<Value>>> {
    let id = path_thread_id(&thread_id)?;
    let checkpoint = body.checkpoint.unwrap_or_default();
    let ask = HistoryAsk {
        checkpoint_ns: checkpoint
            .checkpoint_ns
            .or(body.checkpoint_ns)
            .unwrap_or_default(),
        only: checkpoint.checkpoint_id,
        filter: ListFilter {
            // Validated: a `before` that names no checkpoint was refused.
            before: before_id(body.before.as_ref()).unwrap_or_default(),
            limit: Some(history_limit(body.limit)),
            metadata: body.metadata.map(Value::Object),
        },
        subgraphs: body.subgraphs.unwrap_or(false),
    };
    Ok(Json(read_history(&state, &scope, id, ask).await?))
}

/// A prepared edit as storage saves it.
pub(crate) fn checkpoint_write(prepared: &PreparedUpdate) -> CheckpointWrite {
    CheckpointWrite {
        checkpoint_ns: prepared.at().checkpoint_ns.clone(),
        checkpoint: prepared.checkpoint.clone(),
        metadata: prepared.metadata.clone(),
        parent_id: prepared.parent_id.clone(),
        blobs: prepared.blobs.clone(),
    }
}

/// The 422 of an edit the graph refused, naming the field at fault.
pub(crate) fn refused_update(err: UpdateError, loc: Vec<Value>) -> ApiError {
    match err {
        UpdateError::Invalid(msg) => ApiError::field(loc, "invalid_update", msg),
        UpdateError::Checkpoint(err) => checkpoint_failed(err),
    }
}

/// Whether `node` can "write" an update to `graph`: one of its nodes, `__start__`, or
/// `__input__` (the input, as a run's). LangGraph's special `__end__` and `__copy__` updates
/// are not supported, so they are refused as unknown nodes.
pub(crate) fn is_node(graph: &Graph, node: &str) -> bool {
    node == spindle_graph::START || node == pregel::INPUT || graph.node_names().any(|n| n == node)
}

/// The graph whose state lives at `checkpoint_ns`: the thread's own for `""`, else the
/// subgraph there (422 naming the field when there is none).
fn graph_at(graph: &Arc<Graph>, checkpoint_ns: &str) -> ApiResult<Arc<Graph>> {
    if checkpoint_ns.is_empty() {
        return Ok(graph.clone());
    }
    pregel::subgraph_at(graph, checkpoint_ns).ok_or_else(|| {
        ApiError::field(
            vec![json!("body"), json!("checkpoint"), json!("checkpoint_ns")],
            "invalid_update",
            format!(
                "Subgraph {} not found",
                pregel::without_task_ids(checkpoint_ns)
            ),
        )
    })
}

/// The thread's state after an edit: the edit's own for the root graph; for a subgraph's,
/// the root state, which an edit inside a subgraph does not change.
async fn thread_state_after(
    state: &AppState,
    graph: &Graph,
    prepared: &PreparedUpdate,
) -> ApiResult<StateSnapshot> {
    let at = prepared.at();
    if at.checkpoint_ns.is_empty() {
        return Ok(prepared.snapshot(graph));
    }
    let saver = state.storage.checkpointer();
    let root = pregel::get_state(graph, saver.as_ref(), &at.thread_id, "", None)
        .await
        .map_err(checkpoint_failed)?;
    Ok(root.unwrap_or_else(|| StateSnapshot::empty(&at.thread_id, "")))
}

#[utoipa::path(post, path = "/threads/{thread_id}/state", tag = "threads",
    request_body = Option<StateUpdateRequest>, params(("thread_id" = String, Path)),
    responses((status = 200, description = "the new checkpoint", body = StateUpdateResponse),
              (status = 404, description = "no such thread, or no such checkpoint to edit", body = ErrorBody),
              (status = 400, description = "the thread has no graph", body = ErrorBody),
              (status = 409, description = "a run of the thread is pending or running, the state changed while the edit was made, or the thread's graph is not loaded in this server", body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn update_state(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiJson(body): ApiJson<StateUpdateRequest>,
) -> ApiResult<Json<Value>> {
    let id = path_thread_id(&thread_id)?;
    let thread = state.storage.get_thread(&scope, id).await?;
    let graph = match thread_graph_of(&state, &scope, &thread).await? {
        Some(ThreadGraph::Engine(graph)) => graph,
        Some(ThreadGraph::Python(graph_id)) => {
            return python_update_state(&state, &scope, &thread, &graph_id, body).await;
        }
        // The reference answers 400 (the thread has no graph to apply the edit with).
        None => {
            return Err(ApiError::new(
                ErrorCode::BadRequest,
                format!(
                    "thread {id} has no graph: make a run on it, or set `graph_id` in its metadata"
                ),
            ))
        }
    };
    let ns = body
        .checkpoint
        .as_ref()
        .and_then(|c| c.checkpoint_ns.clone())
        .unwrap_or_default();
    let target = graph_at(&graph, &ns)?;
    if let Some(node) = body.as_node.as_deref().filter(|n| !is_node(&target, n)) {
        return Err(ApiError::field(
            vec![json!("body"), json!("as_node")],
            "invalid_update",
            format!("Node {node} does not exist"),
        ));
    }
    let tid = id.to_string();
    let checkpoint_id = body
        .checkpoint
        .as_ref()
        .and_then(|c| c.checkpoint_id.clone())
        .or(body.checkpoint_id);
    let saver = state.storage.checkpointer();
    let base = saver
        .get_tuple(&tid, &ns, checkpoint_id.as_deref())
        .await
        .map_err(checkpoint_failed)?;
    if let (Some(cid), None) = (&checkpoint_id, &base) {
        return Err(crate::error::not_found_resource("checkpoint", cid));
    }
    let update = NodeUpdate {
        values: body.values.unwrap_or(Value::Null),
        as_node: body.as_node,
        goto: Vec::new(),
    };
    let prepared = pregel::prepare_update_at(&graph, &tid, &ns, base.as_ref(), &[update])
        .await
        .map_err(|e| refused_update(e, vec![json!("body"), json!("values")]))?;
    let snapshot = thread_state_after(&state, &graph, &prepared).await?;
    let event = ThreadEvent {
        event: STATE_UPDATE_EVENT.into(),
        data: json!({"state": snapshot.to_json(), "thread_id": tid}),
    };
    let write = StateWrite {
        checkpoints: vec![checkpoint_write(&prepared)],
        columns: state_columns(&snapshot),
        // An edit of the latest state (of its namespace) must still apply to the latest state
        // when it is saved; an edit of an older checkpoint forks from it whatever came since.
        expect_latest: checkpoint_id
            .is_none()
            .then(|| base.as_ref().map(|t| t.at.checkpoint_id.clone())),
    };
    let written = state
        .storage
        .write_thread_state(&scope, id, write, Some(event))
        .await?;
    if let Some(event) = written.event {
        state.hub.publish(id, HubMessage::Event(Arc::new(event)));
    }
    let at = prepared.at();
    let checkpoint = json!({
        "thread_id": at.thread_id, "checkpoint_ns": at.checkpoint_ns, "checkpoint_id": at.checkpoint_id,
    });
    Ok(Json(json!({
        "checkpoint": checkpoint,
        "configurable": checkpoint,
        "checkpoint_id": at.checkpoint_id,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_takes_an_id_a_checkpoint_or_a_config() {
        assert_eq!(before_id(None), Ok(None));
        assert_eq!(before_id(Some(&json!("c1"))), Ok(Some("c1".into())));
        assert_eq!(
            before_id(Some(&json!({"checkpoint_id": "c2"}))),
            Ok(Some("c2".into()))
        );
        assert_eq!(
            before_id(Some(&json!({"configurable": {"checkpoint_id": "c3"}}))),
            Ok(Some("c3".into()))
        );
        assert!(before_id(Some(&json!(5))).is_err());
        assert!(before_id(Some(&json!({"configurable": {}}))).is_err());
        assert!(before_id(Some(&json!({"other": 1}))).is_err());
    }

    #[test]
    fn history_limit_defaults_to_one() {
        assert_eq!(history_limit(None), 1);
        assert_eq!(history_limit(Some(10)), 10);
    }
}
