//! `/threads`: the thread records themselves: create (with a TTL, or with supersteps that
//! build its history), search, count, get, patch, delete, copy and prune. A thread's state and
//! history are served by [`super::state`]; its runs by [`super::runs`].

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use spindle_execution::execute::goto_of;
use spindle_execution::graphs::LoadedGraph;
use spindle_execution::python::reads as python_reads;
use spindle_graph::pregel::{self, NodeUpdate};
use spindle_graph::Graph;
use spindle_storage::ResourceId;
use spindle_storage::{
    CancelAction, NewThread, RunFilter, RunStatus, Scope, StateWrite, StorageError, Thread,
    ThreadFilter, ThreadPatch, ThreadSearch, ThreadSortBy, ThreadStatus, ThreadTtl, TtlStrategy,
};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::filters::HandlerFilter;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::extract::{ApiJson, Validate, Violations};
use crate::state::{AppState, Caller};
use crate::wire::{
    page, pagination_headers, path_thread_id, select_fields, validate_page, IfExistsWire,
    JsonObject, SortOrderWire, MAX_LIMIT,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_thread))
        .routes(routes!(search_threads))
        .routes(routes!(count_threads))
        .routes(routes!(get_thread, patch_thread, delete_thread))
        .routes(routes!(copy_thread))
        .routes(routes!(prune_threads))
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TtlStrategyWire {
    /// Remove the thread with its runs, events and checkpoints.
    #[default]
    Delete,
    /// Keep the thread and only its latest checkpoint.
    KeepLatest,
}

impl From<TtlStrategyWire> for TtlStrategy {
    fn from(w: TtlStrategyWire) -> Self {
        match w {
            TtlStrategyWire::Delete => TtlStrategy::Delete,
            TtlStrategyWire::KeepLatest => TtlStrategy::KeepLatest,
        }
    }
}

/// A thread's time to live.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct TtlIn {
    /// delete (default) or keep_latest.
    #[serde(default)]
    pub strategy: Option<TtlStrategyWire>,
    /// Minutes from now (fractions allowed); must be positive.
    #[serde(default)]
    #[schema(value_type = f64, required = true, exclusive_minimum = 0)]
    pub ttl: Option<f64>,
}

impl TtlIn {
    fn validate(&self, v: &mut Violations) {
        match self.ttl {
            None => v.push(
                &["ttl", "ttl"],
                "missing",
                "Field required: the time to live in minutes",
                Value::Null,
                Value::Null,
            ),
            Some(minutes) if !(minutes.is_finite() && minutes > 0.0) => v.push(
                &["ttl", "ttl"],
                "greater_than",
                "Input should be greater than 0",
                json!(minutes),
                json!({"gt": 0}),
            ),
            Some(_) => {}
        }
    }

    /// The TTL, once validated.
    fn to_ttl(&self) -> Option<ThreadTtl> {
        Some(ThreadTtl {
            strategy: self.strategy.unwrap_or_default().into(),
            minutes: self.ttl?,
        })
    }
}

/// One node's update in a superstep.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct SuperstepUpdate {
    /// The writes, as if `as_node` had returned them.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub values: Option<Value>,
    /// A `Command` (`update`, `goto`) instead of plain values.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub command: Option<JsonObject>,
    pub as_node: String,
}

/// Updates applied together, as one step of the thread's history.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct Superstep {
    pub updates: Vec<SuperstepUpdate>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ThreadStatusWire {
    Idle,
    Busy,
    Interrupted,
    Error,
}

impl From<ThreadStatusWire> for ThreadStatus {
    fn from(w: ThreadStatusWire) -> Self {
        match w {
            ThreadStatusWire::Idle => ThreadStatus::Idle,
            ThreadStatusWire::Busy => ThreadStatus::Busy,
            ThreadStatusWire::Interrupted => ThreadStatus::Interrupted,
            ThreadStatusWire::Error => ThreadStatus::Error,
        }
    }
}

impl From<ThreadStatus> for ThreadStatusWire {
    fn from(s: ThreadStatus) -> Self {
        match s {
            ThreadStatus::Idle => ThreadStatusWire::Idle,
            ThreadStatus::Busy => ThreadStatusWire::Busy,
            ThreadStatus::Interrupted => ThreadStatusWire::Interrupted,
            ThreadStatus::Error => ThreadStatusWire::Error,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadOut {
    pub thread_id: ResourceId,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub state_updated_at: DateTime<Utc>,
    #[schema(value_type = Object)]
    pub metadata: JsonObject,
    pub status: ThreadStatusWire,
    #[schema(value_type = Object)]
    pub config: JsonObject,
    /// The values of the latest checkpoint; null until the thread has one.
    #[schema(value_type = Option<Object>)]
    pub values: Option<Value>,
    #[schema(value_type = Object)]
    pub interrupts: JsonObject,
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub user_id: Option<String>,
}

impl From<Thread> for ThreadOut {
    fn from(t: Thread) -> Self {
        Self {
            thread_id: t.thread_id,
            created_at: t.created_at,
            updated_at: t.updated_at,
            state_updated_at: t.state_updated_at,
            metadata: t.metadata,
            status: t.status.into(),
            config: t.config,
            values: t.values,
            interrupts: t.interrupts,
            error: t.error,
            user_id: t.user_id,
        }
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ThreadCreate {
    /// Defaults to a new random id.
    #[serde(default)]
    pub thread_id: Option<ResourceId>,
    /// `graph_id` names the graph of the thread's state (needed by `supersteps`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    #[serde(default)]
    pub if_exists: Option<IfExistsWire>,
    /// Expire the thread this long after its creation.
    #[serde(default, deserialize_with = "crate::extract::opt_object")]
    pub ttl: Option<TtlIn>,
    /// History to start the thread with: each superstep becomes one checkpoint, as if its
    /// updates' nodes had run.
    #[serde(default)]
    pub supersteps: Option<Vec<Superstep>>,
}

impl Validate for ThreadCreate {
    fn validate(&self, v: &mut Violations) {
        if let Some(ttl) = &self.ttl {
            ttl.validate(v);
        }
        for (i, step) in self.supersteps.iter().flatten().enumerate() {
            let i = i.to_string();
            if step.updates.is_empty() {
                v.push(
                    &["supersteps", &i, "updates"],
                    "too_short",
                    "A superstep needs at least one update",
                    json!([]),
                    Value::Null,
                );
            }
            for (j, update) in step.updates.iter().enumerate() {
                let j = j.to_string();
                if update
                    .command
                    .as_ref()
                    .is_some_and(|c| c.contains_key("resume"))
                {
                    v.push(
                        &["supersteps", &i, "updates", &j, "command", "resume"],
                        "not_supported",
                        "a superstep cannot resume an interrupt; use update and goto",
                        Value::Null,
                        Value::Null,
                    );
                }
            }
        }
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ThreadPatchRequest {
    /// Merged into the existing metadata.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    /// Replaces the thread's TTL, counted from now.
    #[serde(default, deserialize_with = "crate::extract::opt_object")]
    pub ttl: Option<TtlIn>,
}

impl Validate for ThreadPatchRequest {
    fn validate(&self, v: &mut Violations) {
        if let Some(ttl) = &self.ttl {
            ttl.validate(v);
        }
    }
}

/// The body of `POST /threads/prune`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ThreadPruneRequest {
    pub thread_ids: Vec<ResourceId>,
    /// delete (default): remove the threads; keep_latest: keep each with only its latest
    /// checkpoint.
    #[serde(default)]
    pub strategy: Option<TtlStrategyWire>,
}

impl Validate for ThreadPruneRequest {}

/// What `POST /threads/prune` answers.
#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadPruneResponse {
    /// How many of the threads were pruned (unknown ids and, for keep_latest, threads with
    /// an active run are skipped).
    pub pruned_count: u64,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ThreadSortField {
    ThreadId,
    Status,
    CreatedAt,
    UpdatedAt,
    StateUpdatedAt,
}

impl From<ThreadSortField> for ThreadSortBy {
    fn from(f: ThreadSortField) -> Self {
        match f {
            ThreadSortField::ThreadId => ThreadSortBy::ThreadId,
            ThreadSortField::Status => ThreadSortBy::Status,
            ThreadSortField::CreatedAt => ThreadSortBy::CreatedAt,
            ThreadSortField::UpdatedAt => ThreadSortBy::UpdatedAt,
            ThreadSortField::StateUpdatedAt => ThreadSortBy::StateUpdatedAt,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ThreadSelectField {
    ThreadId,
    CreatedAt,
    UpdatedAt,
    StateUpdatedAt,
    Metadata,
    Config,
    Status,
    Values,
    Interrupts,
    Error,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ThreadSearchRequest {
    #[serde(default)]
    pub ids: Option<Vec<ResourceId>>,
    /// Threads whose metadata contains these key/value pairs.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    /// Threads whose current values contain these key/value pairs.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub values: Option<JsonObject>,
    #[serde(default)]
    pub status: Option<ThreadStatusWire>,
    /// 1 to 1000, default 10.
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// At least 0.
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 0)]
    pub offset: Option<i64>,
    #[serde(default)]
    pub sort_by: Option<ThreadSortField>,
    #[serde(default)]
    pub sort_order: Option<SortOrderWire>,
    #[serde(default)]
    pub select: Option<Vec<ThreadSelectField>>,
}

impl Validate for ThreadSearchRequest {
    fn validate(&self, v: &mut Violations) {
        validate_page(v, self.limit, self.offset);
        v.filter_size("metadata", self.metadata.as_ref());
        v.filter_size("values", self.values.as_ref());
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ThreadCountRequest {
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub values: Option<JsonObject>,
    #[serde(default)]
    pub status: Option<ThreadStatusWire>,
}

impl Validate for ThreadCountRequest {
    fn validate(&self, v: &mut Violations) {
        v.filter_size("metadata", self.metadata.as_ref());
        v.filter_size("values", self.values.as_ref());
    }
}

/// The body of `POST /threads/{id}/copy`: nothing is required.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ThreadCopyRequest {}

impl Validate for ThreadCopyRequest {}

#[utoipa::path(post, path = "/threads", tag = "threads", request_body = Option<ThreadCreate>,
    responses((status = 200, body = ThreadOut),
              (status = 409, description = "the thread exists and if_exists is raise", body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn create_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<ThreadCreate>,
) -> ApiResult<Json<ThreadOut>> {
    let thread_id = body.thread_id.unwrap_or_else(ResourceId::generate);
    let metadata = body.metadata.unwrap_or_default();
    let steps = body.supersteps.unwrap_or_default();
    let mut new = NewThread {
        thread_id,
        metadata,
        if_exists: body.if_exists.unwrap_or_default().into(),
        ttl: body.ttl.as_ref().and_then(TtlIn::to_ttl),
        state: None,
    };
    if !steps.is_empty() {
        match superstep_graph(&state, &new.metadata)? {
            (_, LoadedGraph::Engine(graph)) => {
                new.state = Some(superstep_history(&graph, thread_id, &steps).await?);
            }
            (graph_id, LoadedGraph::Python(_)) => {
                let thread =
                    python_superstep_thread(&state, &scope, new, &graph_id, &steps).await?;
                return Ok(Json(thread.into()));
            }
        }
    }
    Ok(Json(state.storage.create_thread(&scope, new).await?.into()))
}

/// The graph `supersteps` apply to: the one the thread's metadata names.
fn superstep_graph(state: &AppState, metadata: &JsonObject) -> ApiResult<(String, LoadedGraph)> {
    let graph_loc = || vec![json!("body"), json!("metadata"), json!("graph_id")];
    let Some(graph_id) = metadata.get("graph_id").and_then(Value::as_str) else {
        return Err(ApiError::field(
            graph_loc(),
            "missing",
            "supersteps need the thread's graph: set metadata.graph_id",
        ));
    };
    match state.graphs.loaded(graph_id) {
        Some(graph) => Ok((graph_id.to_owned(), graph)),
        None => Err(ApiError::field(
            graph_loc(),
            "unknown_graph",
            format!("graph '{graph_id}' is not loaded in this server"),
        )),
    }
}

/// A new thread of a Python graph with `supersteps` applied by a worker (LangGraph's
/// `bulk_update_state`), which saves their checkpoints itself: so the thread is created
/// first, and deleted again if the updates are refused (nothing half-made is left). A thread
/// that already exists (`if_exists: do_nothing`) is answered as it is.
async fn python_superstep_thread(
    state: &AppState,
    scope: &Scope,
    new: NewThread,
    graph_id: &str,
    steps: &[Superstep],
) -> ApiResult<Thread> {
    let pool = super::state::python_pool(state)?;
    let thread_id = new.thread_id;
    let existed = state.storage.get_thread(scope, thread_id).await.is_ok();
    let thread = state.storage.create_thread(scope, new).await?;
    if existed {
        return Ok(thread);
    }
    let at = python_reads::At {
        thread_id: thread_id.to_string(),
        ..Default::default()
    };
    let updates: Vec<Vec<Value>> = steps
        .iter()
        .map(|step| {
            let updates = step.updates.iter();
            updates
                .map(|u| json!({"values": u.values, "command": u.command, "as_node": u.as_node}))
                .collect()
        })
        .collect();
    let applied = async {
        let updated =
            super::state::python_update(pool, graph_id, &at, json!(updates), "supersteps").await?;
        let write = updated.state_write();
        ApiResult::Ok(
            state
                .storage
                .write_thread_state(scope, thread_id, write, None)
                .await?,
        )
    };
    match applied.await {
        Ok(written) => Ok(written.thread),
        Err(e) => {
            if let Err(deleted) = state.storage.delete_thread(scope, thread_id).await {
                tracing::error!(%thread_id, error = %deleted, "cannot delete a thread whose supersteps were refused");
            }
            Err(e)
        }
    }
}

/// The checkpoints `supersteps` make on a new thread of a graph file's graph, one per
/// superstep, and the thread's state after the last.
async fn superstep_history(
    graph: &Graph,
    thread_id: ResourceId,
    steps: &[Superstep],
) -> ApiResult<StateWrite> {
    let tid = thread_id.to_string();
    let mut checkpoints = Vec::new();
    let mut last: Option<pregel::PreparedUpdate> = None;
    for (i, step) in steps.iter().enumerate() {
        let loc = |rest: &[&str]| {
            let mut loc = vec![json!("body"), json!("supersteps"), json!(i)];
            loc.extend(rest.iter().map(|p| json!(p)));
            loc
        };
        let mut updates = Vec::new();
        for (j, u) in step.updates.iter().enumerate() {
            if !super::state::is_node(graph, &u.as_node) {
                return Err(ApiError::field(
                    loc(&["updates", &j.to_string(), "as_node"]),
                    "invalid_update",
                    format!("Node {} does not exist", u.as_node),
                ));
            }
            updates.push(node_update(u));
        }
        let base = last.as_ref().map(|p| &p.tuple);
        let prepared = pregel::prepare_update(graph, &tid, base, &updates)
            .await
            .map_err(|e| super::state::refused_update(e, loc(&[])))?;
        checkpoints.push(super::state::checkpoint_write(&prepared));
        last = Some(prepared);
    }
    let snapshot = last
        .as_ref()
        .map(|p| p.snapshot(graph))
        .ok_or_else(|| ApiError::internal("supersteps made no checkpoint"))?;
    Ok(StateWrite {
        checkpoints,
        columns: spindle_execution::threads::state_columns(&snapshot),
        // A new thread: nothing can have been written before.
        expect_latest: None,
    })
}

/// A superstep update as the engine takes it: plain values, or a command's update and gotos.
fn node_update(u: &SuperstepUpdate) -> NodeUpdate {
    let Some(command) = &u.command else {
        return NodeUpdate {
            values: u.values.clone().unwrap_or(Value::Null),
            as_node: Some(u.as_node.clone()),
            goto: Vec::new(),
        };
    };
    let goto = match command.get("goto") {
        Some(Value::Array(items)) => items.iter().filter_map(goto_of).collect(),
        Some(item) => goto_of(item).into_iter().collect(),
        None => Vec::new(),
    };
    NodeUpdate {
        values: command.get("update").cloned().unwrap_or(Value::Null),
        as_node: Some(u.as_node.clone()),
        goto,
    }
}

#[utoipa::path(post, path = "/threads/search", tag = "threads", request_body = Option<ThreadSearchRequest>,
    responses((status = 200, description = "matching threads; `X-Pagination-Total` holds the number of matches",
               body = Vec<ThreadOut>), (status = 422, body = ValidationErrorBody)))]
async fn search_threads(
    State(state): State<AppState>,
    Caller(scope): Caller,
    HandlerFilter(condition): HandlerFilter,
    ApiJson(body): ApiJson<ThreadSearchRequest>,
) -> ApiResult<impl IntoResponse> {
    let search = ThreadSearch {
        filter: ThreadFilter {
            ids: body.ids,
            metadata: body.metadata,
            values: body.values,
            status: body.status.map(Into::into),
            condition,
        },
        sort_by: body.sort_by.map(Into::into).unwrap_or_default(),
        sort_order: body.sort_order.map(Into::into).unwrap_or_default(),
        page: page(body.limit, body.offset),
    };
    let found = state.storage.search_threads(&scope, search.clone()).await?;
    let headers = pagination_headers(&search.page, found.items.len(), found.total);
    let items: Vec<ThreadOut> = found.items.into_iter().map(Into::into).collect();
    Ok((headers, Json(select_fields(items, body.select.as_deref())?)))
}

#[utoipa::path(post, path = "/threads/count", tag = "threads", request_body = Option<ThreadCountRequest>,
    responses((status = 200, description = "the number of matching threads", content_type = "application/json", body = i64),
              (status = 422, body = ValidationErrorBody)))]
async fn count_threads(
    State(state): State<AppState>,
    Caller(scope): Caller,
    HandlerFilter(condition): HandlerFilter,
    ApiJson(body): ApiJson<ThreadCountRequest>,
) -> ApiResult<Json<i64>> {
    let filter = ThreadFilter {
        ids: None,
        metadata: body.metadata,
        values: body.values,
        status: body.status.map(Into::into),
        condition,
    };
    Ok(Json(state.storage.count_threads(&scope, filter).await?))
}

#[utoipa::path(get, path = "/threads/{thread_id}", tag = "threads",
    params(("thread_id" = String, Path)),
    responses((status = 200, body = ThreadOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
) -> ApiResult<Json<ThreadOut>> {
    let id = path_thread_id(&thread_id)?;
    Ok(Json(state.storage.get_thread(&scope, id).await?.into()))
}

#[utoipa::path(patch, path = "/threads/{thread_id}", tag = "threads", request_body = Option<ThreadPatchRequest>,
    params(("thread_id" = String, Path)),
    responses((status = 200, body = ThreadOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn patch_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiJson(body): ApiJson<ThreadPatchRequest>,
) -> ApiResult<Json<ThreadOut>> {
    let id = path_thread_id(&thread_id)?;
    let patch = ThreadPatch {
        metadata: body.metadata.unwrap_or_default(),
        ttl: body.ttl.as_ref().and_then(TtlIn::to_ttl),
    };
    Ok(Json(
        state.storage.patch_thread(&scope, id, patch).await?.into(),
    ))
}

#[utoipa::path(delete, path = "/threads/{thread_id}", tag = "threads",
    params(("thread_id" = String, Path)),
    responses((status = 200, description = "deleted; the body is an empty object", body = Object),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn delete_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let id = path_thread_id(&thread_id)?;
    state.storage.get_thread(&scope, id).await?;
    stop_active_runs(&state, &scope, id).await?;
    spindle_execution::threads::delete_thread(state.storage.as_ref(), &scope, id).await?;
    Ok(Json(json!({})))
}

/// Cancels the thread's pending and running runs: the interface cancels active runs before it
/// deletes their thread.
async fn stop_active_runs(state: &AppState, scope: &Scope, thread_id: ResourceId) -> ApiResult<()> {
    let mut active = Vec::new();
    for status in [RunStatus::Pending, RunStatus::Running] {
        let filter = RunFilter {
            status: Some(status),
        };
        let runs = state
            .storage
            .list_runs(scope, thread_id, filter, page(Some(MAX_LIMIT), None))
            .await?;
        active.extend(runs.into_iter().map(|r| r.run_id));
    }
    if active.is_empty() {
        return Ok(());
    }
    let cancelled = state
        .storage
        .cancel_runs(scope, thread_id, &active, CancelAction::Interrupt)
        .await?;
    state.workers.cancel_local(&cancelled);
    Ok(())
}

#[utoipa::path(post, path = "/threads/{thread_id}/copy", tag = "threads", request_body = Option<ThreadCopyRequest>,
    params(("thread_id" = String, Path)),
    responses((status = 200, description = "the copy: a new id, the same metadata and checkpoint history, idle", body = ThreadOut),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn copy_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiJson(_body): ApiJson<ThreadCopyRequest>,
) -> ApiResult<Json<ThreadOut>> {
    let id = path_thread_id(&thread_id)?;
    // The thread row and its whole checkpoint history, in one transaction.
    let copy = state
        .storage
        .copy_thread(&scope, id, ResourceId::generate())
        .await?;
    Ok(Json(copy.into()))
}

/// Under authentication a prune names only the caller's threads: another user's is not found,
/// as on every route (LangGraph answers 404 under its handlers' filters), so a prune that names
/// one prunes nothing. (Without authentication, unknown ids are skipped, as in LangGraph.)
async fn every_thread_found(state: &AppState, scope: &Scope, ids: &[ResourceId]) -> ApiResult<()> {
    for &id in ids {
        match state.storage.get_thread(scope, id).await {
            Ok(_) => {}
            Err(StorageError::NotFound(_)) => {
                return Err(ApiError::not_found(
                    "At least one thread not found or not authorized",
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[utoipa::path(post, path = "/threads/prune", tag = "threads", request_body = ThreadPruneRequest,
    responses((status = 200, body = ThreadPruneResponse),
               (status = 404, description = "under authentication, a thread named is not the caller's", body = ErrorBody),
               (status = 422, body = ValidationErrorBody)))]
async fn prune_threads(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<ThreadPruneRequest>,
) -> ApiResult<Json<ThreadPruneResponse>> {
    let strategy: TtlStrategy = body.strategy.unwrap_or_default().into();
    if state.auth.is_some() {
        every_thread_found(&state, &scope, &body.thread_ids).await?;
    }
    if strategy == TtlStrategy::Delete {
        // As `DELETE /threads/{id}` does: active runs are cancelled before their thread goes.
        for &id in &body.thread_ids {
            if state.storage.get_thread(&scope, id).await.is_ok() {
                stop_active_runs(&state, &scope, id).await?;
            }
        }
    }
    let pruned_count = state
        .storage
        .prune_threads(&scope, &body.thread_ids, strategy)
        .await?;
    Ok(Json(ThreadPruneResponse { pruned_count }))
}
