//! `/assistants`: versioned configurations of a graph.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use spindle_graph::Graph;
use spindle_storage::ResourceId;
use spindle_storage::{
    Assistant, AssistantFields, AssistantFilter, AssistantPatch, AssistantSearch, AssistantSortBy,
    AssistantVersion, NewAssistant, Owner, Scope, StorageError,
};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::filters::HandlerFilter;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::extract::{ApiJson, ApiQuery, Patch, Validate, Violations};
use crate::routes::state::python_read_failed;
use crate::state::{AppState, Caller};
use crate::wire::{
    page, pagination_headers, select_fields, validate_page, IfExistsWire, JsonObject, SortOrderWire,
};
use spindle_execution::graphs::LoadedGraph;
use spindle_execution::python::reads as python_reads;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_assistant))
        .routes(routes!(search_assistants))
        .routes(routes!(count_assistants))
        .routes(routes!(get_assistant, patch_assistant, delete_assistant))
        .routes(routes!(get_assistant_graph))
        .routes(routes!(get_assistant_schemas))
        .routes(routes!(get_assistant_subgraphs))
        .routes(routes!(get_assistant_subgraphs_of))
        .routes(routes!(list_assistant_versions))
        .routes(routes!(set_latest_version))
}

/// An assistant, at the version runs use.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantOut {
    pub assistant_id: ResourceId,
    pub graph_id: String,
    #[schema(value_type = Object)]
    pub config: JsonObject,
    #[schema(value_type = Object)]
    pub context: JsonObject,
    #[schema(value_type = Object)]
    pub metadata: JsonObject,
    pub name: String,
    pub description: Option<String>,
    pub version: i64,
    pub user_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<Assistant> for AssistantOut {
    fn from(a: Assistant) -> Self {
        Self {
            assistant_id: a.assistant_id,
            graph_id: a.fields.graph_id,
            config: a.fields.config,
            context: a.fields.context,
            metadata: a.fields.metadata,
            name: a.fields.name,
            description: a.fields.description,
            version: a.version,
            user_id: a.user_id,
            created_at: a.created_at,
            updated_at: a.updated_at,
        }
    }
}

/// One stored version of an assistant.
#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantVersionOut {
    pub assistant_id: ResourceId,
    pub version: i64,
    pub graph_id: String,
    #[schema(value_type = Object)]
    pub config: JsonObject,
    #[schema(value_type = Object)]
    pub context: JsonObject,
    #[schema(value_type = Object)]
    pub metadata: JsonObject,
    pub name: String,
    pub description: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl From<AssistantVersion> for AssistantVersionOut {
    fn from(v: AssistantVersion) -> Self {
        Self {
            assistant_id: v.assistant_id,
            version: v.version,
            graph_id: v.fields.graph_id,
            config: v.fields.config,
            context: v.fields.context,
            metadata: v.fields.metadata,
            name: v.fields.name,
            description: v.fields.description,
            created_at: v.created_at,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct AssistantCreate {
    /// Defaults to a new random id.
    #[serde(default)]
    pub assistant_id: Option<ResourceId>,
    pub graph_id: String,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub config: Option<JsonObject>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub context: Option<JsonObject>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    #[serde(default)]
    pub if_exists: Option<IfExistsWire>,
    /// Defaults to "Untitled".
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
}

impl Validate for AssistantCreate {}

/// A partial update; each update creates a new version.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AssistantUpdate {
    /// Unchanged when omitted; null is refused.
    #[serde(default)]
    #[schema(value_type = String)]
    pub graph_id: Patch<String>,
    /// Unchanged when omitted; null is refused.
    #[serde(default)]
    #[schema(value_type = String)]
    pub name: Patch<String>,
    /// Unchanged when omitted; null clears it.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub description: Patch<String>,
    /// Unchanged when omitted; `{}` clears it; null reads as empty.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub config: Patch<JsonObject>,
    /// Unchanged when omitted; null reads as empty.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub context: Patch<JsonObject>,
    /// Merged into the existing metadata.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Patch<JsonObject>,
}

impl Validate for AssistantUpdate {
    fn validate(&self, v: &mut Violations) {
        for (field, patch) in [("graph_id", &self.graph_id), ("name", &self.name)] {
            if matches!(patch, Patch::Null) {
                v.push(
                    &[field],
                    "string_type",
                    "Input should be a valid string; null is not allowed",
                    Value::Null,
                    Value::Null,
                );
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AssistantSortField {
    AssistantId,
    GraphId,
    Name,
    CreatedAt,
    UpdatedAt,
}

impl From<AssistantSortField> for AssistantSortBy {
    fn from(f: AssistantSortField) -> Self {
        match f {
            AssistantSortField::AssistantId => AssistantSortBy::AssistantId,
            AssistantSortField::GraphId => AssistantSortBy::GraphId,
            AssistantSortField::Name => AssistantSortBy::Name,
            AssistantSortField::CreatedAt => AssistantSortBy::CreatedAt,
            AssistantSortField::UpdatedAt => AssistantSortBy::UpdatedAt,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AssistantSelectField {
    AssistantId,
    GraphId,
    Name,
    Description,
    Config,
    Context,
    CreatedAt,
    UpdatedAt,
    Metadata,
    Version,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct AssistantSearchRequest {
    /// Assistants whose metadata contains these key/value pairs.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    #[serde(default)]
    pub graph_id: Option<String>,
    /// Case-insensitive substring of the name.
    #[serde(default)]
    pub name: Option<String>,
    /// 1 to 1000, default 10.
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// At least 0.
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 0)]
    pub offset: Option<i64>,
    #[serde(default)]
    pub sort_by: Option<AssistantSortField>,
    #[serde(default)]
    pub sort_order: Option<SortOrderWire>,
    #[serde(default)]
    pub select: Option<Vec<AssistantSelectField>>,
}

impl Validate for AssistantSearchRequest {
    fn validate(&self, v: &mut Violations) {
        validate_page(v, self.limit, self.offset);
        v.filter_size("metadata", self.metadata.as_ref());
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct AssistantCountRequest {
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    #[serde(default)]
    pub graph_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

impl Validate for AssistantCountRequest {
    fn validate(&self, v: &mut Violations) {
        v.filter_size("metadata", self.metadata.as_ref());
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct AssistantVersionsRequest {
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonObject>,
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 0)]
    pub offset: Option<i64>,
}

impl Validate for AssistantVersionsRequest {
    fn validate(&self, v: &mut Violations) {
        validate_page(v, self.limit, self.offset);
        v.filter_size("metadata", self.metadata.as_ref());
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct SetLatestRequest {
    #[serde(deserialize_with = "crate::wire::integer")]
    #[schema(minimum = 1)]
    pub version: i64,
}

impl Validate for SetLatestRequest {
    fn validate(&self, v: &mut Violations) {
        v.range("version", Some(self.version), 1, None);
    }
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteAssistantQuery {
    /// Also delete the threads whose metadata names this assistant.
    #[serde(default, deserialize_with = "crate::wire::query_bool")]
    #[param(value_type = Option<bool>)]
    pub delete_threads: Option<bool>,
}

impl Validate for DeleteAssistantQuery {}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GraphQuery {
    /// `true`, or a depth greater than 0, to draw subgraphs' nodes inside their parent.
    #[serde(default)]
    #[param(value_type = Option<String>, pattern = "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|\\+?0*[1-9][0-9]{0,8})$")]
    pub xray: Option<String>,
}

impl Validate for GraphQuery {}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SubgraphsQuery {
    /// Also list the subgraphs of subgraphs (with a namespace: reach a nested one).
    #[serde(default, deserialize_with = "crate::wire::query_bool")]
    #[param(value_type = Option<bool>)]
    pub recurse: Option<bool>,
}

impl Validate for SubgraphsQuery {}

/// The schemas of a graph, as `/schemas` returns them.
#[derive(Debug, Serialize, ToSchema)]
pub struct GraphSchemasOut {
    pub graph_id: String,
    #[schema(value_type = Object)]
    pub input_schema: Value,
    #[schema(value_type = Object)]
    pub output_schema: Value,
    #[schema(value_type = Object)]
    pub state_schema: Value,
    #[schema(value_type = Object)]
    pub config_schema: Value,
    /// `null` when the graph declares no context schema (as LangGraph's).
    #[schema(value_type = Option<Object>)]
    pub context_schema: Value,
}

/// A path's assistant id: an assistant's id or a graph's. A string that can be neither names
/// no assistant: 404, as an unknown id does.
pub fn resolve_assistant_id(state: &AppState, raw: &str) -> ApiResult<ResourceId> {
    state
        .graphs
        .resolve_assistant_id(raw)
        .ok_or_else(|| StorageError::NotFound("assistant").into())
}

/// A graph's id names the graph's default assistant in every path and body, so an assistant
/// created with that id could never be reached.
fn refuse_graph_id(state: &AppState, id: Option<ResourceId>) -> ApiResult<()> {
    match id {
        Some(id) if state.graphs.contains(id.as_str()) => Err(ApiError::field(
            vec![json!("body"), json!("assistant_id")],
            "value_error",
            format!("\"{id}\" is a graph's id, which names that graph's default assistant"),
        )),
        _ => Ok(()),
    }
}

fn unknown_graph(state: &AppState, graph_id: &str) -> ApiError {
    let known = state.graphs.ids();
    ApiError::not_found(format!(
        "Graph '{graph_id}' not found. Expected one of: {known:?}"
    ))
    .with_detail("graph_id", json!(graph_id))
}

/// A graph this server runs, or the 404 naming the ones it does.
fn require_graph(state: &AppState, graph_id: &str) -> ApiResult<()> {
    match state.graphs.contains(graph_id) {
        true => Ok(()),
        false => Err(unknown_graph(state, graph_id)),
    }
}

/// The graph an assistant runs, for its drawing and schemas: a graph file's, which Spindle
/// reads itself, or a Python graph, which a worker reads (given the assistant's config, for
/// a graph made by a factory).
enum AssistantGraph {
    Engine(Arc<Graph>),
    Python {
        pool: Arc<spindle_execution::python::pool::PythonPool>,
        config: Value,
    },
}

/// Keeps `config.configurable` and `context` in step, as LangGraph does: context is the
/// modern name of the configurable values, so setting one sets the other.
fn sync_context(
    config: &mut JsonObject,
    context: &mut JsonObject,
    context_given: bool,
) -> ApiResult<()> {
    let configurable = config
        .get("configurable")
        .and_then(Value::as_object)
        .cloned();
    match configurable {
        Some(configurable) if context_given && !context.is_empty() && !configurable.is_empty() => {
            Err(ApiError::field(
                vec![json!("body"), json!("context")],
                "value_error",
                "Cannot specify both configurable and context; prefer setting context alone",
            ))
        }
        Some(configurable) if !configurable.is_empty() => {
            *context = configurable;
            Ok(())
        }
        _ => {
            if !context.is_empty() {
                config.insert("configurable".into(), Value::Object(context.clone()));
            }
            Ok(())
        }
    }
}

#[utoipa::path(post, path = "/assistants", tag = "assistants", request_body = AssistantCreate,
    responses((status = 200, body = AssistantOut), (status = 404, description = "unknown graph", body = ErrorBody),
              (status = 409, description = "the assistant exists and if_exists is raise", body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn create_assistant(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<AssistantCreate>,
) -> ApiResult<Json<AssistantOut>> {
    require_graph(&state, &body.graph_id)?;
    refuse_graph_id(&state, body.assistant_id)?;
    let mut config = body.config.unwrap_or_default();
    let context_given = body.context.is_some();
    let mut context = body.context.unwrap_or_default();
    sync_context(&mut config, &mut context, context_given)?;
    let new = NewAssistant {
        assistant_id: body.assistant_id.unwrap_or_else(ResourceId::generate),
        fields: AssistantFields {
            graph_id: body.graph_id,
            name: body.name.unwrap_or_else(|| "Untitled".into()),
            description: body.description,
            config,
            context,
            metadata: body.metadata.unwrap_or_default(),
        },
        if_exists: body.if_exists.unwrap_or_default().into(),
    };
    let assistant = state
        .storage
        .create_assistant(Owner::User(&scope), new)
        .await?;
    Ok(Json(assistant.into()))
}

#[utoipa::path(post, path = "/assistants/search", tag = "assistants", request_body = Option<AssistantSearchRequest>,
    responses((status = 200, description = "matching assistants; `X-Pagination-Total` holds the number of matches",
               body = Vec<AssistantOut>), (status = 422, body = ValidationErrorBody)))]
async fn search_assistants(
    State(state): State<AppState>,
    Caller(scope): Caller,
    HandlerFilter(condition): HandlerFilter,
    ApiJson(body): ApiJson<AssistantSearchRequest>,
) -> ApiResult<impl IntoResponse> {
    let search = AssistantSearch {
        filter: AssistantFilter {
            graph_id: body.graph_id,
            name: body.name,
            metadata: body.metadata,
            condition,
        },
        sort_by: body.sort_by.map(Into::into).unwrap_or_default(),
        sort_order: body.sort_order.map(Into::into).unwrap_or_default(),
        page: page(body.limit, body.offset),
    };
    let found = state
        .storage
        .search_assistants(&scope, search.clone())
        .await?;
    let headers = pagination_headers(&search.page, found.items.len(), found.total);
    let items: Vec<AssistantOut> = found.items.into_iter().map(Into::into).collect();
    Ok((headers, Json(select_fields(items, body.select.as_deref())?)))
}

#[utoipa::path(post, path = "/assistants/count", tag = "assistants", request_body = Option<AssistantCountRequest>,
    responses((status = 200, description = "the number of matching assistants", content_type = "application/json", body = i64),
              (status = 422, body = ValidationErrorBody)))]
async fn count_assistants(
    State(state): State<AppState>,
    Caller(scope): Caller,
    HandlerFilter(condition): HandlerFilter,
    ApiJson(body): ApiJson<AssistantCountRequest>,
) -> ApiResult<Json<i64>> {
    let filter = AssistantFilter {
        graph_id: body.graph_id,
        name: body.name,
        metadata: body.metadata,
        condition,
    };
    Ok(Json(state.storage.count_assistants(&scope, filter).await?))
}

#[utoipa::path(get, path = "/assistants/{assistant_id}", tag = "assistants",
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant")),
    responses((status = 200, body = AssistantOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_assistant(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(assistant_id): Path<String>,
) -> ApiResult<Json<AssistantOut>> {
    let id = resolve_assistant_id(&state, &assistant_id)?;
    Ok(Json(state.storage.get_assistant(&scope, id).await?.into()))
}

#[utoipa::path(patch, path = "/assistants/{assistant_id}", tag = "assistants", request_body = Option<AssistantUpdate>,
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant")),
    responses((status = 200, description = "the new version", body = AssistantOut), (status = 404, body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn patch_assistant(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(assistant_id): Path<String>,
    ApiJson(body): ApiJson<AssistantUpdate>,
) -> ApiResult<Json<AssistantOut>> {
    let id = resolve_assistant_id(&state, &assistant_id)?;
    if let Some(graph_id) = body.graph_id.as_value() {
        require_graph(&state, graph_id)?;
    }
    let patch = assistant_patch(body)?;
    Ok(Json(
        state
            .storage
            .update_assistant(&scope, id, patch)
            .await?
            .into(),
    ))
}

/// Applies the interface's rules for omitted, null and empty fields.
fn assistant_patch(body: AssistantUpdate) -> ApiResult<AssistantPatch> {
    let value = |p: Patch<JsonObject>| match p {
        Patch::Absent => None,
        Patch::Null => Some(JsonObject::new()),
        Patch::Value(v) => Some(v),
    };
    let context_given = !body.context.is_absent();
    let mut config = value(body.config);
    let mut context = value(body.context);
    if let Some(cfg) = config.as_mut() {
        let mut ctx = context.clone().unwrap_or_default();
        sync_context(cfg, &mut ctx, context_given)?;
        if context_given || !ctx.is_empty() {
            context = Some(ctx);
        }
    }
    Ok(AssistantPatch {
        graph_id: body.graph_id.as_value().cloned(),
        name: body.name.as_value().cloned(),
        description: match body.description {
            Patch::Absent => None,
            Patch::Null => Some(None),
            Patch::Value(d) => Some(Some(d)),
        },
        config,
        context,
        metadata: body.metadata.as_value().cloned(),
    })
}

#[utoipa::path(delete, path = "/assistants/{assistant_id}", tag = "assistants",
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant"), DeleteAssistantQuery),
    responses((status = 204, description = "deleted"), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn delete_assistant(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(assistant_id): Path<String>,
    ApiQuery(query): ApiQuery<DeleteAssistantQuery>,
) -> ApiResult<StatusCode> {
    let id = resolve_assistant_id(&state, &assistant_id)?;
    // One transaction: its active runs stop, its runs go (and, when asked, the threads its
    // runs named in their metadata), then the assistant; the workers running them are told.
    let delete_threads = query.delete_threads.unwrap_or(false);
    let stopped = state
        .storage
        .delete_assistant(&scope, id, delete_threads)
        .await?;
    if !stopped.is_empty() {
        tracing::info!(assistant_id = %id, runs = stopped.len(), "stopping the deleted assistant's running runs");
    }
    state.workers.cancel_local(&stopped);
    Ok(StatusCode::NO_CONTENT)
}

/// The graph an assistant runs.
async fn assistant_graph(
    state: &AppState,
    scope: &Scope,
    raw_id: &str,
) -> ApiResult<(String, AssistantGraph)> {
    let id = resolve_assistant_id(state, raw_id)?;
    let assistant = state.storage.get_assistant(scope, id).await?;
    let graph_id = assistant.fields.graph_id.clone();
    let graph = match state.graphs.loaded(&graph_id) {
        // A graph with variants is drawn as the one the assistant's runs choose.
        Some(LoadedGraph::Engine(graph)) => AssistantGraph::Engine(
            graph
                .for_run(
                    &Value::Object(assistant.fields.config.clone()),
                    &Value::Object(assistant.fields.context.clone()),
                )
                .map_err(ApiError::conflict)?,
        ),
        Some(LoadedGraph::Python(_)) => AssistantGraph::Python {
            pool: state
                .workers
                .python()
                .cloned()
                .ok_or_else(|| ApiError::conflict("this server has no Python workers"))?,
            config: python_read_config(&assistant),
        },
        None => return Err(unknown_graph(state, &graph_id)),
    };
    Ok((graph_id, graph))
}

/// The assistant's config as a Python graph's factory gets it: its context in
/// `configurable`, as LangGraph Platform passes it.
fn python_read_config(assistant: &Assistant) -> Value {
    let mut config = assistant.fields.config.clone();
    let configurable = config.entry("configurable").or_insert_with(|| json!({}));
    if let Value::Object(configurable) = configurable {
        for (key, value) in &assistant.fields.context {
            configurable.entry(key.clone()).or_insert(value.clone());
        }
    }
    Value::Object(config)
}

/// `?xray=`: `true`/`false`, or a depth greater than 0.
fn parse_xray(raw: Option<&str>) -> ApiResult<spindle_graph::XRay> {
    use spindle_graph::XRay;
    let bad = || {
        ApiError::validation(vec![crate::error::ValidationItem::new(
            vec![json!("query"), json!("xray")],
            "value_error",
            "xray must be true, false or an integer greater than 0",
        )
        .with_input(json!(raw))])
    };
    match raw.map(str::to_ascii_lowercase).as_deref() {
        None | Some("false") => Ok(XRay::Off),
        Some("true") => Ok(XRay::All),
        Some(n) => match n.parse::<u32>() {
            Ok(depth) if depth > 0 => Ok(XRay::Depth(depth)),
            _ => Err(bad()),
        },
    }
}

#[utoipa::path(get, path = "/assistants/{assistant_id}/graph", tag = "assistants",
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant"), GraphQuery),
    responses((status = 200, description = "a drawable graph: `{nodes, edges}`", body = Object),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_assistant_graph(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(assistant_id): Path<String>,
    ApiQuery(query): ApiQuery<GraphQuery>,
) -> ApiResult<Json<Value>> {
    let xray = parse_xray(query.xray.as_deref())?;
    let (graph_id, graph) = assistant_graph(&state, &scope, &assistant_id).await?;
    match graph {
        AssistantGraph::Engine(graph) => Ok(Json(graph.drawable(xray))),
        AssistantGraph::Python { pool, config } => {
            let xray = match xray {
                spindle_graph::XRay::Off => json!(false),
                spindle_graph::XRay::All => json!(true),
                spindle_graph::XRay::Depth(depth) => json!(depth),
            };
            let drawn = python_reads::draw(&pool, &graph_id, &config, xray)
                .await
                .map_err(python_read_failed)?;
            Ok(Json(drawn))
        }
    }
}

fn schemas_json(graph: &Graph) -> serde_json::Map<String, Value> {
    let s = graph.schemas();
    let mut map = serde_json::Map::new();
    map.insert("input_schema".into(), s.input_schema);
    map.insert("output_schema".into(), s.output_schema);
    map.insert("state_schema".into(), s.state_schema);
    map.insert("config_schema".into(), s.config_schema);
    map.insert("context_schema".into(), s.context_schema);
    map
}

#[utoipa::path(get, path = "/assistants/{assistant_id}/schemas", tag = "assistants",
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant")),
    responses((status = 200, body = GraphSchemasOut), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_assistant_schemas(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(assistant_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let (graph_id, graph) = assistant_graph(&state, &scope, &assistant_id).await?;
    let schemas = match graph {
        AssistantGraph::Engine(graph) => schemas_json(&graph),
        AssistantGraph::Python { pool, config } => python_reads::schemas(&pool, &graph_id, &config)
            .await
            .map_err(python_read_failed)?,
    };
    let mut body = serde_json::Map::new();
    body.insert("graph_id".into(), json!(graph_id));
    body.extend(schemas);
    Ok(Json(Value::Object(body)))
}

/// The schemas of subgraphs by namespace (`child`, `child|grandchild`), as LangGraph's
/// `get_subgraphs(namespace, recurse)` lists them.
fn subgraph_schemas(graph: &Graph, namespace: Option<&str>, recurse: bool) -> Value {
    let out = graph
        .subgraphs_at(namespace, recurse)
        .into_iter()
        .map(|(ns, sub)| (ns, Value::Object(schemas_json(&sub))))
        .collect();
    Value::Object(out)
}

#[utoipa::path(get, path = "/assistants/{assistant_id}/subgraphs", tag = "assistants",
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant"), SubgraphsQuery),
    responses((status = 200, description = "schemas of the subgraphs by namespace", body = Object),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_assistant_subgraphs(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(assistant_id): Path<String>,
    ApiQuery(query): ApiQuery<SubgraphsQuery>,
) -> ApiResult<Json<Value>> {
    let (graph_id, graph) = assistant_graph(&state, &scope, &assistant_id).await?;
    let recurse = query.recurse.unwrap_or(false);
    subgraphs_of(&graph_id, graph, None, recurse).await
}

#[utoipa::path(get, path = "/assistants/{assistant_id}/subgraphs/{namespace}", tag = "assistants",
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant"),
           ("namespace" = String, Path, description = "subgraph namespace, `|`-separated when nested"), SubgraphsQuery),
    responses((status = 200, description = "the schemas of the subgraph at that namespace (`{}` when there is none; a nested one needs `recurse`)", body = Object),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn get_assistant_subgraphs_of(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path((assistant_id, namespace)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<SubgraphsQuery>,
) -> ApiResult<Json<Value>> {
    let (graph_id, graph) = assistant_graph(&state, &scope, &assistant_id).await?;
    // Only the subgraph at exactly that namespace (a nested one needs `recurse`), as the
    // reference answers: `{}` when there is none.
    let recurse = query.recurse.unwrap_or(false);
    subgraphs_of(&graph_id, graph, Some(&namespace), recurse).await
}

async fn subgraphs_of(
    graph_id: &str,
    graph: AssistantGraph,
    namespace: Option<&str>,
    recurse: bool,
) -> ApiResult<Json<Value>> {
    match graph {
        AssistantGraph::Engine(graph) => Ok(Json(subgraph_schemas(&graph, namespace, recurse))),
        AssistantGraph::Python { pool, config } => {
            let found = python_reads::subgraphs(&pool, graph_id, &config, namespace, recurse)
                .await
                .map_err(python_read_failed)?;
            Ok(Json(found))
        }
    }
}

#[utoipa::path(post, path = "/assistants/{assistant_id}/versions", tag = "assistants", request_body = Option<AssistantVersionsRequest>,
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant")),
    responses((status = 200, description = "versions, newest first", body = Vec<AssistantVersionOut>),
              (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
async fn list_assistant_versions(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(assistant_id): Path<String>,
    ApiJson(body): ApiJson<AssistantVersionsRequest>,
) -> ApiResult<Json<Vec<AssistantVersionOut>>> {
    let id = resolve_assistant_id(&state, &assistant_id)?;
    let versions = state
        .storage
        .list_assistant_versions(&scope, id, body.metadata, page(body.limit, body.offset))
        .await?;
    Ok(Json(versions.into_iter().map(Into::into).collect()))
}

#[utoipa::path(post, path = "/assistants/{assistant_id}/latest", tag = "assistants", request_body = SetLatestRequest,
    params(("assistant_id" = String, Path, description = "an assistant's id, or a graph's id for its default assistant")),
    responses((status = 200, description = "the assistant at the pinned version", body = AssistantOut),
              (status = 404, description = "no such assistant or version", body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn set_latest_version(
    State(state): State<AppState>,
    Caller(scope): Caller,
    Path(assistant_id): Path<String>,
    ApiJson(body): ApiJson<SetLatestRequest>,
) -> ApiResult<Json<AssistantOut>> {
    let id = resolve_assistant_id(&state, &assistant_id)?;
    let assistant = state
        .storage
        .set_latest_assistant_version(&scope, id, body.version)
        .await?;
    Ok(Json(assistant.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn configurable_fills_context_and_back() {
        let mut config = obj(json!({"configurable": {"x": 1}}));
        let mut context = JsonObject::new();
        sync_context(&mut config, &mut context, false).unwrap();
        assert_eq!(Value::Object(context), json!({"x": 1}));

        let mut config = obj(json!({"tags": ["t"]}));
        let mut context = obj(json!({"c": 1}));
        sync_context(&mut config, &mut context, true).unwrap();
        assert_eq!(
            Value::Object(config),
            json!({"tags": ["t"], "configurable": {"c": 1}})
        );
    }

    #[test]
    fn both_configurable_and_context_is_refused() {
        let mut config = obj(json!({"configurable": {"x": 1}}));
        let mut context = obj(json!({"c": 1}));
        assert!(sync_context(&mut config, &mut context, true).is_err());
    }

    #[test]
    fn null_config_reads_as_empty_and_null_description_clears() {
        let body: AssistantUpdate =
            serde_json::from_value(json!({"config": null, "description": null})).unwrap();
        let patch = assistant_patch(body).unwrap();
        assert_eq!(patch.config, Some(JsonObject::new()));
        assert_eq!(patch.description, Some(None));
        assert_eq!(patch.name, None);
    }
}
