//! `/runs/crons` and `/threads/{thread_id}/runs/crons`: scheduled runs. Create (bound to a
//! thread, or making a new thread per run), get, update, delete, search and count.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};
use spindle_execution::crons::{firing_thread, FireCron, Schedule};
use spindle_execution::StartedRun;
use spindle_storage::ResourceId;
use spindle_storage::{
    Cron, CronFields, CronFilter, CronSearch, CronSortBy, NewCron, OnRunCompleted,
};
use spindle_storage::{CronFiring, MetadataCondition};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::runs::{
    check_webhook, locations, no_assistant, run_assistant, start_run, OnCompletion, RunCreate,
    RunOut,
};
use crate::auth::filters::HandlerFilter;
use crate::auth::AuthUser;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::extract::{parse_body, ApiJson, Patch, Validate, Violations};
use crate::routes::assistants::resolve_assistant_id;
use crate::state::{AppState, Caller};
use crate::wire::{
    page, path_thread_id, path_uuid, select_fields, validate_page, JsonObject, SortOrderWire,
};
use spindle_execution::execute::keys;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_thread_cron))
        .routes(routes!(create_cron))
        .routes(routes!(get_cron, patch_cron, delete_cron))
        .routes(routes!(search_crons))
        .routes(routes!(count_crons))
}

/// A cron as clients read it.
#[derive(Debug, Serialize, ToSchema)]
pub struct CronOut {
    pub cron_id: Uuid,
    pub assistant_id: ResourceId,
    pub thread_id: Option<ResourceId>,
    pub user_id: Option<String>,
    pub end_time: Option<DateTime<Utc>>,
    pub schedule: String,
    /// IANA time zone of the schedule; null is UTC.
    pub timezone: Option<String>,
    /// The run request made at each due time.
    #[schema(value_type = Object)]
    pub payload: JsonObject,
    /// The next due time, in UTC.
    pub next_run_date: Option<DateTime<Utc>>,
    #[schema(value_type = Object)]
    pub metadata: JsonObject,
    /// delete or keep (crons without a thread); null for a thread's cron.
    pub on_run_completed: Option<String>,
    pub enabled: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<Cron> for CronOut {
    fn from(c: Cron) -> Self {
        let f = c.fields;
        Self {
            cron_id: c.cron_id,
            assistant_id: c.assistant_id,
            thread_id: c.thread_id,
            user_id: c.user_id,
            end_time: f.end_time,
            schedule: f.schedule,
            timezone: f.timezone,
            payload: f.payload,
            next_run_date: f.next_run_date,
            metadata: f.metadata,
            on_run_completed: f.on_run_completed.map(|o| o.as_str().to_owned()),
            enabled: f.enabled,
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }
}

/// What a cron's creation answers (for the document only): its first run, with `cron_id`
/// added, or the cron itself when no run was started.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum CronCreated {
    Run(Box<CronFirstRun>),
    Cron(Box<CronOut>),
}

/// A cron's first run: a run with the cron's id.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct CronFirstRun {
    #[schema(inline)]
    #[serde(flatten)]
    run: RunOut,
    cron_id: Uuid,
}

/// A date-time with an offset, or without one (read as UTC), as Python's `isoformat` writes
/// either.
fn parse_time(raw: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M:%S%.f")
                .ok()
                .map(|t| t.and_utc())
        })
}

fn time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(raw) => parse_time(&raw).map(Some).ok_or_else(|| {
            serde::de::Error::custom(format!("Input should be a valid datetime, got {raw:?}"))
        }),
    }
}

fn patch_time<'de, D: Deserializer<'de>>(d: D) -> Result<Patch<DateTime<Utc>>, D::Error> {
    Ok(match time(d)? {
        Some(t) => Patch::Value(t),
        None => Patch::Null,
    })
}

/// The body of a cron's creation: its schedule and the run to make at each due time.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CronCreate {
    /// An assistant's id or a graph's id.
    #[schema(value_type = ResourceId)]
    pub assistant_id: String,
    /// Five fields (minute hour day-of-month month day-of-week), or six with seconds first.
    pub schedule: String,
    /// IANA time zone the schedule is read in (default UTC).
    #[serde(default)]
    pub timezone: Option<String>,
    /// No run is due after this time.
    #[serde(default, deserialize_with = "time")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub end_time: Option<DateTime<Utc>>,
    /// Default true.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Crons without a thread: delete (default) or keep each run's thread.
    #[serde(default)]
    pub on_run_completed: Option<OnCompletion>,
    /// The cron's metadata, given to each of its runs.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    /// The run's fields, as `POST /threads/{id}/runs` takes them (input, config, context,
    /// interrupt_before, interrupt_after, webhook, multitask_strategy, stream_mode, ...).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub run: JsonObject,
}

/// The interface's length limits of the run fields a cron keeps.
fn validate_run_lengths(v: &mut Violations, run: &JsonObject) {
    for (field, max) in [("webhook", 2048), ("multitask_strategy", 256)] {
        v.max_len(field, run.get(field).and_then(Value::as_str), max);
    }
}

fn validate_schedule(v: &mut Violations, schedule: Option<&str>, timezone: Option<&str>) {
    v.max_len("schedule", schedule, 256);
    v.max_len("timezone", timezone, 64);
    if let Err(err) = Schedule::parse(schedule.unwrap_or("* * * * *"), timezone) {
        let input = if err.field == "timezone" {
            timezone
        } else {
            schedule
        };
        v.push(
            &[err.field],
            "value_error",
            err.message,
            json!(input),
            Value::Null,
        );
    }
}

impl Validate for CronCreate {
    fn validate(&self, v: &mut Violations) {
        v.max_len("assistant_id", Some(&self.assistant_id), 256);
        validate_schedule(v, Some(&self.schedule), self.timezone.as_deref());
        validate_run_lengths(v, &self.run);
    }
}

/// The body's `assistant_id` (an assistant's id or a graph's), or a 422 naming it when it can
/// be neither.
fn body_assistant_id(state: &AppState, raw: &str) -> ApiResult<ResourceId> {
    resolve_assistant_id(state, raw).map_err(|_| {
        ApiError::field(
            vec![json!("body"), json!("assistant_id")],
            "value_error",
            "Input should be an assistant's id or a graph's id (1 to 128 letters, digits and . _ : -)",
        )
    })
}

/// The run request each firing makes (the cron's payload with its metadata), checked as
/// `POST /threads/{id}/runs` checks a run, so that whatever a cron's runs would be refused
/// for is refused when the cron is created or changed (422s name the body's fields). The
/// scheduler builds each firing's run with it too.
pub(crate) fn run_of(payload: &JsonObject, metadata: &JsonObject) -> ApiResult<RunCreate> {
    let mut request = payload.clone();
    request.insert("metadata".into(), Value::Object(metadata.clone()));
    let bytes = serde_json::to_vec(&request).map_err(|e| ApiError::internal(e.to_string()))?;
    parse_body::<RunCreate>(&bytes)
}

/// [`run_of`], and the run's webhook checked as a run's is (where its host resolves): a cron
/// whose every firing would be refused is refused itself.
async fn checked_run(
    state: &AppState,
    payload: &JsonObject,
    metadata: &JsonObject,
) -> ApiResult<RunCreate> {
    let run = run_of(payload, metadata)?;
    check_webhook(state, &run, vec![json!("body"), json!("webhook")]).await?;
    Ok(run)
}

/// What a creation stores: the run's fields with the resolved assistant, the schedule and
/// time zone, and the cron's id in `config.configurable` (as the reference server writes it).
fn payload_of(body: &CronCreate, assistant_id: ResourceId, cron_id: Uuid) -> JsonObject {
    let mut payload = body.run.clone();
    payload.retain(|_, value| !value.is_null());
    payload.insert("assistant_id".into(), json!(assistant_id.to_string()));
    payload.insert("schedule".into(), json!(body.schedule));
    if let Some(timezone) = &body.timezone {
        payload.insert("timezone".into(), json!(timezone));
    }
    let config = payload.entry("config").or_insert_with(|| json!({}));
    if let Value::Object(config) = config {
        let configurable = config.entry("configurable").or_insert_with(|| json!({}));
        if let Value::Object(configurable) = configurable {
            configurable.insert("cron_id".into(), json!(cron_id.to_string()));
        }
    }
    payload
}

/// Stores a cron and, when it is enabled, starts its first run and answers that run (with
/// the cron's id) instead of the cron: on the cron's thread, or on a new thread as each of
/// its firings would be.
async fn create(
    state: &AppState,
    caller: &AuthUser,
    thread_id: Option<ResourceId>,
    body: CronCreate,
) -> ApiResult<Response> {
    let scope = &caller.scope();
    // The body is checked whole (its run, webhook and schedule) before its assistant is
    // looked up, as the reference validates a body first: a cron no firing could make is a
    // 422 whatever assistant it names.
    let assistant_id = resolve_assistant_id(state, &body.assistant_id)
        .map_err(|_| no_assistant(&body.assistant_id))?;
    let cron_id = Uuid::now_v7();
    let mut payload = payload_of(&body, assistant_id, cron_id);
    keep_creator(&mut payload, caller);
    let metadata = body.metadata.unwrap_or_default();
    let first = checked_run(state, &payload, &metadata).await?;
    let schedule = Schedule::parse(&body.schedule, body.timezone.as_deref()).map_err(|e| {
        ApiError::field(
            vec![json!("body"), json!(e.field)],
            "value_error",
            e.message,
        )
    })?;
    run_assistant(state, scope, &body.assistant_id).await?;
    let enabled = body.enabled.unwrap_or(true);
    let on_run_completed = match (thread_id, body.on_run_completed) {
        (Some(_), _) => None,
        (None, Some(OnCompletion::Keep)) => Some(OnRunCompleted::Keep),
        (None, _) => Some(OnRunCompleted::Delete),
    };
    let new = NewCron {
        cron_id,
        assistant_id,
        thread_id,
        fields: CronFields {
            schedule: body.schedule,
            timezone: body.timezone,
            payload,
            metadata,
            on_run_completed,
            end_time: body.end_time,
            enabled,
            next_run_date: schedule.next_after(Utc::now()),
        },
    };
    let cron = state.storage.create_cron(scope, new).await?;
    state.crons.wake();
    // A cron created past its end time has no run to make, not even the first.
    let live = enabled && cron.fields.end_time.is_none_or(|end| end > Utc::now());
    if !live {
        return Ok(Json(CronOut::from(cron)).into_response());
    }
    let (run_thread, stateless) = firing_thread(&cron);
    match start_run(state, caller, run_thread, &first, stateless, None).await {
        Ok(StartedRun { run, .. }) => {
            let headers = locations(&run);
            let mut out = serde_json::to_value(RunOut::from(run))
                .map_err(|e| ApiError::internal(e.to_string()))?;
            out["cron_id"] = json!(cron_id.to_string());
            Ok((headers, Json(out)).into_response())
        }
        Err(err) => {
            // The first run was refused (a busy thread with reject, a webhook it may not
            // reach): the cron is not kept either.
            if let Err(e) = state.storage.delete_cron(scope, cron_id).await {
                tracing::warn!(%cron_id, error = %e, "cannot remove the cron whose first run failed");
            }
            Err(err)
        }
    }
}

#[utoipa::path(post, path = "/threads/{thread_id}/runs/crons", tag = "crons", request_body = CronCreate,
    params(("thread_id" = String, Path)),
    responses((status = 200, description = "the cron's first run, with `cron_id` (or, with enabled false, the cron)", body = CronCreated),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn create_thread_cron(
    State(state): State<AppState>,
    caller: AuthUser,
    Path(thread_id): Path<String>,
    ApiJson(body): ApiJson<CronCreate>,
) -> ApiResult<Response> {
    let thread_id = path_thread_id(&thread_id)?;
    create(&state, &caller, Some(thread_id), body).await
}

#[utoipa::path(post, path = "/runs/crons", tag = "crons", request_body = CronCreate,
    responses((status = 200, description = "the cron's first run, on a new thread, with `cron_id` (or, with enabled false, the cron); each firing runs on a new thread", body = CronCreated),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn create_cron(
    State(state): State<AppState>,
    caller: AuthUser,
    ApiJson(body): ApiJson<CronCreate>,
) -> ApiResult<Response> {
    create(&state, &caller, None, body).await
}

#[utoipa::path(get, path = "/runs/crons/{cron_id}", tag = "crons", params(("cron_id" = Uuid, Path)),
    responses((status = 200, body = CronOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_cron(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(cron_id): Path<String>,
) -> ApiResult<Json<CronOut>> {
    let cron_id = path_uuid("cron_id", &cron_id)?;
    Ok(Json(state.storage.get_cron(&scope, cron_id).await?.into()))
}

#[utoipa::path(delete, path = "/runs/crons/{cron_id}", tag = "crons", params(("cron_id" = Uuid, Path)),
    responses((status = 204, description = "deleted"), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn delete_cron(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(cron_id): Path<String>,
) -> ApiResult<StatusCode> {
    let cron_id = path_uuid("cron_id", &cron_id)?;
    state.storage.delete_cron(&scope, cron_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The body of a cron's update: only the fields given change.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CronPatch {
    #[serde(default)]
    pub schedule: Option<String>,
    /// Null clears it (the schedule ends never).
    #[serde(default, deserialize_with = "patch_time")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub end_time: Patch<DateTime<Utc>>,
    /// Null reads the schedule in UTC.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub timezone: Patch<String>,
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub on_run_completed: Option<OnCompletion>,
    /// Replaces the cron's metadata.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    /// Run fields (input, config, context, webhook, interrupt_before, interrupt_after,
    /// multitask_strategy, stream_mode, stream_subgraphs, durability, ...) replace those of
    /// the payload; a null removes one.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub run: JsonObject,
}

impl Validate for CronPatch {
    fn validate(&self, v: &mut Violations) {
        if self.schedule.is_some() || !self.timezone.is_absent() {
            validate_schedule(
                v,
                self.schedule.as_deref(),
                self.timezone.as_value().map(String::as_str),
            );
        }
        validate_run_lengths(v, &self.run);
        if let Some(value) = self.run.get("assistant_id") {
            v.push(
                &["assistant_id"],
                "extra_forbidden",
                "A cron's assistant cannot change; create another cron",
                value.clone(),
                Value::Null,
            );
        }
    }
}

#[utoipa::path(patch, path = "/runs/crons/{cron_id}", tag = "crons", request_body = Option<CronPatch>,
    params(("cron_id" = Uuid, Path)),
    responses((status = 200, body = CronOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn patch_cron(
    State(state): State<AppState>,
    caller: AuthUser,
    Path(cron_id): Path<String>,
    ApiJson(body): ApiJson<CronPatch>,
) -> ApiResult<Json<CronOut>> {
    let scope = caller.scope();
    let cron_id = path_uuid("cron_id", &cron_id)?;
    let current = state.storage.get_cron(&scope, cron_id).await?;
    let mut fields = current.fields.clone();
    for (key, value) in body.run {
        if value.is_null() {
            fields.payload.remove(&key);
        } else {
            fields.payload.insert(key, value);
        }
    }
    // After the body's fields: a client cannot name the user the firings run as.
    keep_creator(&mut fields.payload, &caller);
    if let Some(schedule) = body.schedule {
        fields.payload.insert("schedule".into(), json!(schedule));
        fields.schedule = schedule;
    }
    match body.timezone {
        Patch::Absent => {}
        Patch::Null => {
            fields.payload.remove("timezone");
            fields.timezone = None;
        }
        Patch::Value(tz) => {
            fields.payload.insert("timezone".into(), json!(tz));
            fields.timezone = Some(tz);
        }
    }
    match body.end_time {
        Patch::Absent => {}
        Patch::Null => fields.end_time = None,
        Patch::Value(end) => fields.end_time = Some(end),
    }
    if let Some(enabled) = body.enabled {
        fields.enabled = enabled;
    }
    if let (Some(on), None) = (body.on_run_completed, current.thread_id) {
        fields.on_run_completed = Some(match on {
            OnCompletion::Keep => OnRunCompleted::Keep,
            OnCompletion::Delete => OnRunCompleted::Delete,
        });
    }
    if let Some(metadata) = body.metadata {
        fields.metadata = metadata;
    }
    checked_run(&state, &fields.payload, &fields.metadata).await?;
    // A changed schedule, or a cron enabled again, counts from now.
    let rescheduled = fields.schedule != current.fields.schedule
        || fields.timezone != current.fields.timezone
        || (fields.enabled && !current.fields.enabled);
    if rescheduled {
        let schedule =
            Schedule::parse(&fields.schedule, fields.timezone.as_deref()).map_err(|e| {
                ApiError::field(
                    vec![json!("body"), json!(e.field)],
                    "value_error",
                    e.message,
                )
            })?;
        fields.next_run_date = schedule.next_after(Utc::now());
    }
    let cron = state.storage.update_cron(&scope, cron_id, fields).await?;
    state.crons.wake();
    Ok(Json(cron.into()))
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CronSortField {
    CronId,
    AssistantId,
    ThreadId,
    CreatedAt,
    UpdatedAt,
    NextRunDate,
    EndTime,
}

impl From<CronSortField> for CronSortBy {
    fn from(f: CronSortField) -> Self {
        match f {
            CronSortField::CronId => CronSortBy::CronId,
            CronSortField::AssistantId => CronSortBy::AssistantId,
            CronSortField::ThreadId => CronSortBy::ThreadId,
            CronSortField::CreatedAt => CronSortBy::CreatedAt,
            CronSortField::UpdatedAt => CronSortBy::UpdatedAt,
            CronSortField::NextRunDate => CronSortBy::NextRunDate,
            CronSortField::EndTime => CronSortBy::EndTime,
        }
    }
}

/// Fields a search may select.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CronSelectField {
    CronId,
    AssistantId,
    ThreadId,
    EndTime,
    Schedule,
    Timezone,
    CreatedAt,
    UpdatedAt,
    UserId,
    Payload,
    NextRunDate,
    Metadata,
    OnRunCompleted,
    Enabled,
    /// Accepted for compatibility; a cron has no such field.
    Now,
}

/// Which crons a search or count is about.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct CronSearchRequest {
    /// An assistant's id or a graph's id.
    #[serde(default)]
    #[schema(value_type = Option<ResourceId>)]
    pub assistant_id: Option<String>,
    #[serde(default)]
    pub thread_id: Option<ResourceId>,
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Containment: crons whose metadata holds every given key and value.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 0)]
    pub offset: Option<i64>,
    /// Default created_at.
    #[serde(default)]
    pub sort_by: Option<CronSortField>,
    /// Default desc.
    #[serde(default)]
    pub sort_order: Option<SortOrderWire>,
    #[serde(default)]
    pub select: Option<Vec<CronSelectField>>,
}

impl Validate for CronSearchRequest {
    fn validate(&self, v: &mut Violations) {
        validate_page(v, self.limit, self.offset);
        v.filter_size("metadata", self.metadata.as_ref());
    }
}

/// The crons a search asks for, under the condition a custom-auth handler's filter sets.
fn filter_of(
    state: &AppState,
    body: &CronSearchRequest,
    condition: Option<MetadataCondition>,
) -> ApiResult<CronFilter> {
    let assistant_id = match body.assistant_id.as_deref() {
        None => None,
        Some(raw) => Some(body_assistant_id(state, raw)?),
    };
    Ok(CronFilter {
        assistant_id,
        thread_id: body.thread_id,
        enabled: body.enabled,
        metadata: body.metadata.clone(),
        condition,
    })
}

#[utoipa::path(post, path = "/runs/crons/search", tag = "crons", request_body = Option<CronSearchRequest>,
    responses((status = 200, description = "matching crons, newest first unless sorted otherwise", body = Vec<CronOut>),
              (status = 422, body = ValidationErrorBody)))]
async fn search_crons(
    State(state): State<AppState>,
    Caller(scope): Caller,
    HandlerFilter(condition): HandlerFilter,
    ApiJson(body): ApiJson<CronSearchRequest>,
) -> ApiResult<Json<Vec<Value>>> {
    let search = CronSearch {
        filter: filter_of(&state, &body, condition)?,
        sort_by: body.sort_by.map(Into::into).unwrap_or_default(),
        sort_order: body.sort_order.map(Into::into).unwrap_or_default(),
        page: page(body.limit, body.offset),
    };
    let crons: Vec<CronOut> = state
        .storage
        .search_crons(&scope, search)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(Json(select_fields(crons, body.select.as_deref())?))
}

#[utoipa::path(post, path = "/runs/crons/count", tag = "crons", request_body = Option<CronSearchRequest>,
    responses((status = 200, description = "how many crons match", content_type = "application/json", body = i64), (status = 422, body = ValidationErrorBody)))]
async fn count_crons(
    State(state): State<AppState>,
    Caller(scope): Caller,
    HandlerFilter(condition): HandlerFilter,
    ApiJson(body): ApiJson<CronSearchRequest>,
) -> ApiResult<Json<i64>> {
    let filter = filter_of(&state, &body, condition)?;
    Ok(Json(state.storage.count_crons(&scope, filter).await?))
}

/// Keeps in the payload the user a cron's firings run as (under the key a run keeps it):
/// its owner, as the last request that wrote the cron authenticated them.
fn keep_creator(payload: &mut JsonObject, caller: &AuthUser) {
    payload.insert(keys::AUTH_USER.into(), caller.to_json());
}

/// The user a cron's firings run as: the one its payload keeps, else (a cron made before
/// crons kept one) its owner, with no permissions.
fn cron_user(cron: &Cron) -> AuthUser {
    let owner = cron.user_id.clone().unwrap_or_default();
    cron.fields
        .payload
        .get(keys::AUTH_USER)
        .and_then(AuthUser::from_json)
        .filter(|user| user.identity == owner)
        .unwrap_or_else(|| AuthUser::authenticated(owner, None, Vec::new()))
}

/// What a due cron does: starts the run its payload asks for, as `POST /threads/{id}/runs`
/// (or `POST /runs` for a cron without a thread) would, with the payload checked as at the
/// cron's creation.
pub struct CronRuns(pub AppState);

#[async_trait::async_trait]
impl FireCron for CronRuns {
    async fn fire(&self, firing: &CronFiring) -> Result<Uuid, String> {
        let cron = &firing.cron;
        let caller = cron_user(cron);
        let body = run_of(&cron.fields.payload, &cron.fields.metadata)
            .map_err(|e| format!("invalid payload: {}", e.message()))?;
        let (thread_id, stateless) = firing_thread(cron);
        start_run(
            &self.0,
            &caller,
            thread_id,
            &body,
            stateless,
            Some(firing.id()),
        )
        .await
        .map(|started| started.run.run_id)
        .map_err(|e| e.message().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_with_and_without_offsets() {
        assert_eq!(
            parse_time("2030-01-01T00:00:00+02:00")
                .unwrap()
                .to_rfc3339(),
            "2029-12-31T22:00:00+00:00"
        );
        assert_eq!(
            parse_time("2030-01-01T00:00:00.5").unwrap().to_rfc3339(),
            "2030-01-01T00:00:00.500+00:00"
        );
        assert!(parse_time("tomorrow").is_none());
    }

    #[test]
    fn payload_keeps_run_fields_and_names_the_cron() {
        let body: CronCreate = serde_json::from_value(json!({
            "assistant_id": "echo", "schedule": "* * * * *", "input": {"x": 1},
            "config": {"configurable": {"k": 1}}, "webhook": null,
        }))
        .unwrap();
        let cron_id = Uuid::new_v4();
        let payload = payload_of(&body, ResourceId::from(Uuid::nil()), cron_id);
        assert_eq!(payload["input"], json!({"x": 1}));
        assert_eq!(payload["config"]["configurable"]["k"], json!(1));
        assert_eq!(
            payload["config"]["configurable"]["cron_id"],
            json!(cron_id.to_string())
        );
        assert!(!payload.contains_key("webhook"));
        assert!(run_of(&payload, &JsonObject::new()).is_ok());
    }
}
