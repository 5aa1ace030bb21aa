//! `/store`: the long-term store. Put, get and delete items; search them under a namespace
//! prefix (by filter, and by meaning when an index is configured); list namespaces.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use spindle_storage::store::parse_filter;
use spindle_storage::{ItemSearch, NamespaceSearch, Page, PutItem, StoreItem};
use utoipa::openapi::schema::{Array, ArrayBuilder, ObjectBuilder, OneOfBuilder, SchemaType, Type};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::filters::StoreHandlerFilter;
use crate::error::{ApiError, ApiResult, ErrorBody, ErrorCode, ValidationErrorBody};
use crate::extract::{ApiJson, ApiQuery, Validate, Violations};
use crate::state::{AppState, Caller};
use crate::wire::{validate_page, JsonObject};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_item, get_item, delete_item))
        .routes(routes!(search_items))
        .routes(routes!(list_namespaces))
}

/// A stored item.
#[derive(Debug, Serialize, ToSchema)]
pub struct ItemOut {
    pub namespace: Vec<String>,
    pub key: String,
    #[schema(value_type = Object)]
    pub value: Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<StoreItem> for ItemOut {
    fn from(item: StoreItem) -> Self {
        Self {
            namespace: item.namespace,
            key: item.key,
            value: item.value,
            created_at: item.created_at,
            updated_at: item.updated_at,
        }
    }
}

/// A search result: the item and, for a search by meaning, its similarity to the query.
#[derive(Debug, Serialize, ToSchema)]
pub struct SearchItemOut {
    #[serde(flatten)]
    pub item: ItemOut,
    pub score: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SearchItemsResponse {
    pub items: Vec<SearchItemOut>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ListNamespacesResponse {
    pub namespaces: Vec<Vec<String>>,
}

/// A label as [`validate_labels`] takes it: not empty, no `.`, and not `*` but in listings.
fn label(wildcards: bool) -> ObjectBuilder {
    let pattern = if wildcards {
        "^[^.]+$"
    } else {
        r"^([^.*][^.]*|\*[^.]+)$"
    };
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
}

fn namespace() -> Array {
    ArrayBuilder::new().items(label(false)).build()
}

fn item_namespace() -> Array {
    ArrayBuilder::new()
        .items(label(false))
        .min_items(Some(1))
        .build()
}

fn nullable(mut labels: Array) -> Array {
    labels.schema_type = SchemaType::from_iter([Type::Array, Type::Null]);
    labels
}

fn optional_namespace() -> Array {
    nullable(namespace())
}

/// A namespace in a listing, where `*` matches any label.
fn namespace_pattern() -> Array {
    nullable(ArrayBuilder::new().items(label(true)).build())
}

/// `index` of a put: `false`, a list of field paths, or null.
fn index_schema() -> OneOfBuilder {
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Boolean)
                .enum_values(Some([false])),
        )
        .item(ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::String)))
        .item(ObjectBuilder::new().schema_type(Type::Null))
}

/// Checks each label of a namespace: non-empty, without `.` (`*` too when `wildcards`).
fn validate_labels(v: &mut Violations, field: &str, labels: &[String], wildcards: bool) {
    for (i, label) in labels.iter().enumerate() {
        let problem = if label.is_empty() {
            Some("Namespace labels must not be empty")
        } else if label.contains('.') {
            Some("Namespace labels must not contain '.'")
        } else if label == "*" && !wildcards {
            Some("'*' is a wildcard only in namespace listings")
        } else {
            None
        };
        if let Some(msg) = problem {
            v.push(
                &[field, &i.to_string()],
                "value_error",
                msg,
                json!(label),
                Value::Null,
            );
        }
    }
}

/// The TTL of a put: minutes, positive.
fn validate_ttl(v: &mut Violations, ttl: Option<f64>) {
    if let Some(minutes) = ttl.filter(|m| !(m.is_finite() && *m > 0.0)) {
        v.push(
            &["ttl"],
            "greater_than",
            "Input should be greater than 0 (minutes)",
            json!(minutes),
            json!({"gt": 0}),
        );
    }
}

/// The body of `PUT /store/items`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct PutItemRequest {
    /// At least one label; the first is not `langgraph` (reserved).
    #[schema(schema_with = item_namespace)]
    pub namespace: Vec<String>,
    pub key: String,
    /// A JSON object.
    #[schema(value_type = Object)]
    pub value: Value,
    /// `false`: not searchable by meaning; a list of paths: embed these fields instead of the
    /// index's; null or absent: the index's fields.
    #[serde(default)]
    #[schema(schema_with = index_schema)]
    pub index: Option<Value>,
    /// Minutes the item lives (reads that refresh it restart this); the server's default
    /// when absent.
    #[serde(default)]
    #[schema(exclusive_minimum = 0)]
    pub ttl: Option<f64>,
}

impl Validate for PutItemRequest {
    fn validate(&self, v: &mut Violations) {
        if self.namespace.is_empty() {
            v.push(
                &["namespace"],
                "too_short",
                "The namespace needs at least one label",
                json!([]),
                Value::Null,
            );
        } else if self.namespace[0] == "langgraph" {
            v.push(
                &["namespace", "0"],
                "value_error",
                "The root label 'langgraph' is reserved",
                json!("langgraph"),
                Value::Null,
            );
        }
        validate_labels(v, "namespace", &self.namespace, false);
        if !self.value.is_object() {
            v.push(
                &["value"],
                "dict_type",
                "Input should be a valid dictionary",
                self.value.clone(),
                Value::Null,
            );
        }
        match &self.index {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(Value::Array(paths)) if paths.iter().all(Value::is_string) => {}
            Some(other) => v.push(
                &["index"],
                "value_error",
                "Input should be false or a list of field paths",
                other.clone(),
                Value::Null,
            ),
        }
        validate_ttl(v, self.ttl);
    }
}

#[utoipa::path(put, path = "/store/items", tag = "store", request_body = PutItemRequest,
    responses((status = 204, description = "stored"), (status = 422, body = ValidationErrorBody)))]
async fn put_item(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<PutItemRequest>,
) -> ApiResult<StatusCode> {
    let vectors = match (&state.store.index, &body.index) {
        (None, _) | (_, Some(Value::Bool(false))) => Vec::new(),
        (Some(index), fields) => {
            let fields: Option<Vec<String>> = fields.as_ref().and_then(Value::as_array).map(|a| {
                a.iter()
                    .filter_map(|p| p.as_str().map(str::to_owned))
                    .collect()
            });
            index
                .vectors(&body.value, fields.as_deref())
                .await
                .map_err(embedding_failed)?
        }
    };
    let put = PutItem {
        namespace: body.namespace,
        key: body.key,
        value: body.value,
        ttl_minutes: body.ttl.or(state.store.default_ttl),
        vectors,
    };
    state.storage.put_item(&scope, put).await?;
    Ok(StatusCode::NO_CONTENT)
}

fn embedding_failed(message: String) -> ApiError {
    tracing::warn!(error = %message, "cannot embed for the store index");
    ApiError::new(ErrorCode::Unavailable, format!("cannot embed: {message}"))
}

/// `GET /store/items` parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GetItemQuery {
    /// The namespace: one dot-separated string (`a.b`) or the parameter repeated per label.
    #[serde(default)]
    #[param(schema_with = namespace)]
    pub namespace: Vec<String>,
    pub key: String,
    /// Restart the item's TTL (default: the server's `refresh_on_read`).
    #[serde(default, deserialize_with = "crate::wire::query_bool")]
    #[param(value_type = Option<bool>)]
    pub refresh_ttl: Option<bool>,
}

impl GetItemQuery {
    fn labels(&self) -> Vec<String> {
        match self.namespace.as_slice() {
            [one] => one.split('.').map(str::to_owned).collect(),
            many => many.to_vec(),
        }
    }
}

impl Validate for GetItemQuery {
    fn validate(&self, v: &mut Violations) {
        validate_labels(v, "namespace", &self.labels(), false);
    }
}

#[utoipa::path(get, path = "/store/items", tag = "store", params(GetItemQuery),
    responses((status = 200, body = ItemOut), (status = 404, description = "no item at that namespace and key", body = ErrorBody),
              (status = 422, body = ValidationErrorBody)))]
async fn get_item(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiQuery(query): ApiQuery<GetItemQuery>,
) -> ApiResult<Json<ItemOut>> {
    let refresh = query.refresh_ttl.unwrap_or(state.store.refresh_on_read);
    let item = state
        .storage
        .get_item(&scope, &query.labels(), &query.key, refresh)
        .await?;
    Ok(Json(item.into()))
}

/// The body of `DELETE /store/items`.
#[derive(Debug, Deserialize, ToSchema)]
pub struct DeleteItemRequest {
    #[schema(schema_with = namespace)]
    pub namespace: Vec<String>,
    pub key: String,
}

impl Validate for DeleteItemRequest {
    fn validate(&self, v: &mut Violations) {
        validate_labels(v, "namespace", &self.namespace, false);
    }
}

#[utoipa::path(delete, path = "/store/items", tag = "store", request_body = DeleteItemRequest,
    responses((status = 204, description = "deleted (also when there was nothing to delete)"), (status = 422, body = ValidationErrorBody)))]
async fn delete_item(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<DeleteItemRequest>,
) -> ApiResult<StatusCode> {
    state
        .storage
        .delete_item(&scope, &body.namespace, &body.key)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The body of `POST /store/items/search`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct SearchItemsRequest {
    /// Items whose namespace starts with these labels; all when absent.
    #[serde(default)]
    #[schema(schema_with = optional_namespace)]
    pub namespace_prefix: Option<Vec<String>>,
    /// `{field: value}` (nested objects match nested fields) or `{field: {"$gt": 1, ...}}`
    /// with `$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub filter: Option<JsonObject>,
    /// 1 to 1000, default 10.
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 0)]
    pub offset: Option<i64>,
    /// Rank by similarity to this text (when the server has a store index).
    #[serde(default)]
    pub query: Option<String>,
    /// Restart the TTL of the items returned (default: the server's `refresh_on_read`).
    #[serde(default)]
    pub refresh_ttl: Option<bool>,
}

impl Validate for SearchItemsRequest {
    fn validate(&self, v: &mut Violations) {
        validate_page(v, self.limit, self.offset);
        validate_labels(
            v,
            "namespace_prefix",
            self.namespace_prefix.as_deref().unwrap_or_default(),
            false,
        );
        v.filter_size("filter", self.filter.as_ref());
        if let Some(Err(err)) = self.filter.as_ref().map(parse_filter) {
            let mut loc = vec!["filter"];
            loc.extend(err.path.iter().map(String::as_str));
            v.push(&loc, "value_error", err.message, Value::Null, Value::Null);
        }
    }
}

#[utoipa::path(post, path = "/store/items/search", tag = "store", request_body = Option<SearchItemsRequest>,
    responses((status = 200, body = SearchItemsResponse), (status = 422, body = ValidationErrorBody)))]
async fn search_items(
    State(state): State<AppState>,
    Caller(scope): Caller,
    StoreHandlerFilter(handlers): StoreHandlerFilter,
    ApiJson(body): ApiJson<SearchItemsRequest>,
) -> ApiResult<Json<SearchItemsResponse>> {
    let mut filter = match &body.filter {
        Some(filter) => parse_filter(filter)
            .map_err(|e| ApiError::internal(format!("validated filter refused: {}", e.message)))?,
        None => Vec::new(),
    };
    // A custom-auth handler's filter holds besides the client's (both are lists of conditions
    // an item must all meet).
    filter.extend(handlers);
    let query = match (&state.store.index, body.query.as_deref()) {
        (Some(index), Some(text)) if !text.is_empty() => {
            let mut embedded = index
                .embed(&[text.to_owned()])
                .await
                .map_err(embedding_failed)?;
            embedded.pop()
        }
        _ => None,
    };
    let search = ItemSearch {
        prefix: body.namespace_prefix.unwrap_or_default(),
        filter,
        page: Page {
            limit: body.limit.unwrap_or(10),
            offset: body.offset.unwrap_or(0),
        },
        refresh_ttl: body.refresh_ttl.unwrap_or(state.store.refresh_on_read),
        query,
    };
    let items = state.storage.search_items(&scope, search).await?;
    Ok(Json(SearchItemsResponse {
        items: items
            .into_iter()
            .map(|item| SearchItemOut {
                score: item.score,
                item: item.into(),
            })
            .collect(),
    }))
}

/// The body of `POST /store/namespaces`.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct ListNamespacesRequest {
    /// Namespaces starting with these labels (`*` matches any label).
    #[serde(default)]
    #[schema(schema_with = namespace_pattern)]
    pub prefix: Option<Vec<String>>,
    /// Namespaces ending with these labels (`*` matches any label).
    #[serde(default)]
    #[schema(schema_with = namespace_pattern)]
    pub suffix: Option<Vec<String>>,
    /// Cut namespaces to this many labels (each listed once).
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 1)]
    pub max_depth: Option<i64>,
    /// 1 to 1000, default 100.
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    #[serde(default, deserialize_with = "crate::wire::opt_integer")]
    #[schema(minimum = 0)]
    pub offset: Option<i64>,
}

impl Validate for ListNamespacesRequest {
    fn validate(&self, v: &mut Violations) {
        validate_page(v, self.limit, self.offset);
        v.range("max_depth", self.max_depth, 1, None);
        for (field, labels) in [("prefix", &self.prefix), ("suffix", &self.suffix)] {
            validate_labels(v, field, labels.as_deref().unwrap_or_default(), true);
        }
    }
}

#[utoipa::path(post, path = "/store/namespaces", tag = "store", request_body = Option<ListNamespacesRequest>,
    responses((status = 200, body = ListNamespacesResponse), (status = 422, body = ValidationErrorBody)))]
async fn list_namespaces(
    State(state): State<AppState>,
    Caller(scope): Caller,
    ApiJson(body): ApiJson<ListNamespacesRequest>,
) -> ApiResult<Json<ListNamespacesResponse>> {
    let search = NamespaceSearch {
        prefix: body.prefix.unwrap_or_default(),
        suffix: body.suffix.unwrap_or_default(),
        max_depth: body.max_depth.map(|d| d as usize),
        page: Page {
            limit: body.limit.unwrap_or(100),
            offset: body.offset.unwrap_or(0),
        },
    };
    let namespaces = state.storage.list_namespaces(&scope, search).await?;
    Ok(Json(ListNamespacesResponse { namespaces }))
}
