//! `/threads`: state and outputs accumulated by runs. (State, history and runs arrive with the
//! runtime; this module holds the thread records themselves.)

use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use spindle_storage::{
    CancelAction, NewThread, RunFilter, RunStatus, Scope, Thread, ThreadFilter, ThreadSearch,
    ThreadSortBy, ThreadStatus,
};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::extract::{ApiJson, Validate, Violations};
use crate::state::{AppState, Caller};
use crate::wire::{
    page, pagination_headers, path_uuid, select_fields, validate_page, IfExistsWire, JsonObject,
    SortOrderWire, MAX_LIMIT,
};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_thread))
        .routes(routes!(search_threads))
        .routes(routes!(count_threads))
        .routes(routes!(get_thread, patch_thread, delete_thread))
        .routes(routes!(copy_thread))
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
    pub thread_id: Uuid,
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
    pub thread_id: Option<Uuid>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    #[serde(default)]
    pub if_exists: Option<IfExistsWire>,
    /// Not supported yet: refused rather than ignored.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub ttl: Option<Value>,
    /// Not supported yet: refused rather than ignored.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub supersteps: Option<Value>,
}

/// Refuses fields this server accepts the shape of but cannot honour yet, so that a client is
/// never told "done" for something that was dropped.
fn refuse_unsupported(v: &mut Violations, field: &str, value: &Option<Value>, what: &str) {
    if let Some(value) = value.as_ref().filter(|v| !v.is_null()) {
        v.push(
            &[field],
            "not_supported",
            format!("{what} is not supported by this server yet"),
            value.clone(),
            Value::Null,
        );
    }
}

impl Validate for ThreadCreate {
    fn validate(&self, v: &mut Violations) {
        refuse_unsupported(v, "ttl", &self.ttl, "thread TTL");
        refuse_unsupported(
            v,
            "supersteps",
            &self.supersteps,
            "creating a thread with supersteps",
        );
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ThreadPatch {
    /// Merged into the existing metadata.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    /// Not supported yet: refused rather than ignored.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub ttl: Option<Value>,
}

impl Validate for ThreadPatch {
    fn validate(&self, v: &mut Violations) {
        refuse_unsupported(v, "ttl", &self.ttl, "thread TTL");
    }
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
    pub ids: Option<Vec<Uuid>>,
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
    #[serde(default)]
    pub limit: Option<i64>,
    /// At least 0.
    #[serde(default)]
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

impl Validate for ThreadCountRequest {}

/// The body of `POST /threads/{id}/copy`: nothing is required.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ThreadCopyRequest {}

impl Validate for ThreadCopyRequest {}

#[utoipa::path(post, path = "/threads", tag = "threads", request_body = ThreadCreate,
    responses((status = 200, body = ThreadOut),
              (status = 409, description = "the thread exists and if_exists is raise", body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn create_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<ThreadCreate>,
) -> ApiResult<Json<ThreadOut>> {
    let new = NewThread {
        thread_id: body.thread_id.unwrap_or_else(Uuid::new_v4),
        metadata: body.metadata.unwrap_or_default(),
        if_exists: body.if_exists.unwrap_or_default().into(),
    };
    Ok(Json(state.storage.create_thread(&scope, new).await?.into()))
}

#[utoipa::path(post, path = "/threads/search", tag = "threads", request_body = ThreadSearchRequest,
    responses((status = 200, description = "matching threads; `X-Pagination-Total` holds the number of matches",
               body = Vec<ThreadOut>), (status = 422, body = ValidationErrorBody)))]
async fn search_threads(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<ThreadSearchRequest>,
) -> ApiResult<impl IntoResponse> {
    let search = ThreadSearch {
        filter: ThreadFilter {
            ids: body.ids,
            metadata: body.metadata,
            values: body.values,
            status: body.status.map(Into::into),
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

#[utoipa::path(post, path = "/threads/count", tag = "threads", request_body = ThreadCountRequest,
    responses((status = 200, description = "the number of matching threads", body = i64),
              (status = 422, body = ValidationErrorBody)))]
async fn count_threads(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<ThreadCountRequest>,
) -> ApiResult<Json<i64>> {
    let filter = ThreadFilter {
        ids: None,
        metadata: body.metadata,
        values: body.values,
        status: body.status.map(Into::into),
    };
    Ok(Json(state.storage.count_threads(&scope, filter).await?))
}

#[utoipa::path(get, path = "/threads/{thread_id}", tag = "threads",
    params(("thread_id" = Uuid, Path)),
    responses((status = 200, body = ThreadOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
) -> ApiResult<Json<ThreadOut>> {
    let id = path_uuid("thread_id", &thread_id)?;
    Ok(Json(state.storage.get_thread(&scope, id).await?.into()))
}

#[utoipa::path(patch, path = "/threads/{thread_id}", tag = "threads", request_body = ThreadPatch,
    params(("thread_id" = Uuid, Path)),
    responses((status = 200, body = ThreadOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn patch_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiJson(body): ApiJson<ThreadPatch>,
) -> ApiResult<Json<ThreadOut>> {
    let id = path_uuid("thread_id", &thread_id)?;
    let metadata = body.metadata.unwrap_or_default();
    Ok(Json(
        state
            .storage
            .update_thread(&scope, id, metadata)
            .await?
            .into(),
    ))
}

#[utoipa::path(delete, path = "/threads/{thread_id}", tag = "threads",
    params(("thread_id" = Uuid, Path)),
    responses((status = 200, description = "deleted; the body is an empty object", body = Object),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn delete_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let id = path_uuid("thread_id", &thread_id)?;
    state.storage.get_thread(&scope, id).await?;
    stop_active_runs(&state, &scope, id).await?;
    crate::runs::delete_thread(state.storage.as_ref(), &scope, id).await?;
    Ok(Json(json!({})))
}

/// Cancels the thread's pending and running runs: the interface cancels active runs before it
/// deletes their thread.
async fn stop_active_runs(state: &AppState, scope: &Scope, thread_id: Uuid) -> ApiResult<()> {
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

#[utoipa::path(post, path = "/threads/{thread_id}/copy", tag = "threads", request_body = ThreadCopyRequest,
    params(("thread_id" = Uuid, Path)),
    responses((status = 200, description = "the copy: a new id, the same metadata, idle", body = ThreadOut),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn copy_thread(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(thread_id): Path<String>,
    ApiJson(_body): ApiJson<ThreadCopyRequest>,
) -> ApiResult<Json<ThreadOut>> {
    let id = path_uuid("thread_id", &thread_id)?;
    let copy = state
        .storage
        .copy_thread(&scope, id, Uuid::new_v4())
        .await?;
    let checkpoints = state.storage.checkpointer();
    if let Err(err) = checkpoints
        .copy_thread(&id.to_string(), &copy.thread_id.to_string())
        .await
    {
        // Without its history the copy is not a copy: remove it and report the failure.
        let _ = state.storage.delete_thread(&scope, copy.thread_id).await;
        return Err(ApiError::internal(format!(
            "cannot copy the thread's checkpoints: {err}"
        )));
    }
    Ok(Json(copy.into()))
}
