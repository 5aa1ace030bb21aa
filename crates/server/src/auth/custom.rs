//! LangGraph's custom auth (`auth.path`: a Python `Auth` object), as LangGraph Platform
//! applies it, with the handlers run by the Python workers:
//!
//! 1. `@auth.authenticate` names the caller (or refuses, with its status and detail);
//! 2. the route's action ([`actions::of`]) goes to the most specific `@auth.on` handler with a
//!    `value` made of the route's path parameters and its body (LangGraph's field names);
//! 3. what the handler wrote into `value` replaces those fields of the request (the usual
//!    pattern: a create handler adds `metadata.owner`; a store handler prefixes the namespace);
//! 4. the filter it answered ([`filters`]: `$eq`, `$contains`, `$or`, `$and`) narrows what the
//!    request reaches: a search or count applies it besides the client's `metadata` filter
//!    (the route reads it as a [`HandlerFilter`]), and a thread, assistant or cron named in
//!    the path, or each thread a prune names, must meet it (else 404, as for another user's).
//!
//! Resources stay scoped by user as always: the handlers narrow further, never widen.

use axum::body::{to_bytes, Body};
use axum::extract::{FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use spindle_execution::python::auth as python_auth;
use spindle_execution::python::pool::PythonPool;
use spindle_execution::python::reads::ReadError;
use spindle_storage::{MetadataCondition, ResourceId, Scope};
use std::sync::Arc;

use super::actions::{self, Action};
use super::filters::{self, HandlerFilter, StoreHandlerFilter};
use super::{forbidden, unauthorized, Auth, AuthUser, Refusal};
use crate::error::{ApiError, ErrorCode};
use crate::state::AppState;

/// A refusal on its way to the client (boxed: a response is large, the happy path small).
type Denied = Box<Response>;

fn deny(error: impl IntoResponse) -> Denied {
    Box::new(error.into_response())
}

/// Why the custom auth said no: a handler refused (with its status and detail, as LangGraph
/// Platform answers them), or no worker could ask it.
enum Refused {
    Handler { status: u16, detail: String },
    Unavailable(String),
}

impl Refused {
    fn detail(self) -> String {
        match self {
            Refused::Handler { detail, .. } | Refused::Unavailable(detail) => detail,
        }
    }
}

impl From<Refused> for Denied {
    fn from(refused: Refused) -> Self {
        let (status, detail) = match refused {
            Refused::Unavailable(why) => return deny(ApiError::new(ErrorCode::Unavailable, why)),
            Refused::Handler { status, detail } => (status, detail),
        };
        Box::new(match status {
            401 => unauthorized(Refusal {
                message: detail,
                invalid_token: false,
            }),
            403 => ApiError::new(ErrorCode::Forbidden, detail).into_response(),
            404 => ApiError::not_found(detail).into_response(),
            other => {
                let code = StatusCode::from_u16(other).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                tracing::warn!(status = other, detail = %detail, "custom auth refused a request");
                let body = json!({"error": code.canonical_reason().unwrap_or("error"), "message": detail, "details": {}});
                (code, axum::Json(body)).into_response()
            }
        })
    }
}

/// The workers that run the handlers.
fn pool(state: &AppState) -> Result<&Arc<PythonPool>, Refused> {
    state.workers.python().ok_or_else(|| {
        Refused::Unavailable("the custom auth's Python workers are not running".to_owned())
    })
}

/// A worker's answer (`{ok: true, ...}` or `{ok: false, status, detail}`), or why there is none.
fn answered(answer: Result<Value, ReadError>) -> Result<Value, Refused> {
    let answer = answer.map_err(|e| Refused::Unavailable(e.to_string()))?;
    if answer["ok"].as_bool() == Some(true) {
        return Ok(answer);
    }
    Err(Refused::Handler {
        status: answer["status"].as_u64().unwrap_or(500) as u16,
        detail: answer["detail"].as_str().unwrap_or("refused").to_owned(),
    })
}

/// The `@auth.on` handler's answer for `user` doing `action` with `value`: `{filters, value}`.
async fn ask_handler(
    state: &AppState,
    user: &AuthUser,
    action: Action,
    value: &Value,
) -> Result<Value, Refused> {
    let ask = json!({
        "resource": action.resource,
        "action": action.action,
        "user": user.to_json(),
        "value": value,
    });
    answered(python_auth::authorize(pool(state)?, &ask).await)
}

/// The filter a handler's answer narrows the request by, when it gave one.
fn handler_filters(answer: &Value) -> Option<&Map<String, Value>> {
    answer["filters"].as_object().filter(|f| !f.is_empty())
}

/// Whether the thread `id` is `scope`'s and meets `condition` (a handler's filter).
async fn thread_meets(
    state: &AppState,
    scope: &Scope,
    id: ResourceId,
    condition: &MetadataCondition,
) -> Result<bool, spindle_storage::StorageError> {
    match state.storage.get_thread(scope, id).await {
        Ok(thread) => Ok(condition.holds(&Value::Object(thread.metadata))),
        Err(spindle_storage::StorageError::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the `@auth.on` handler lets `user` do `action` with `value`, for what is not a
/// route of its own (a protocol command on the thread `value` names): its changes are not
/// used, its filters must hold on the thread; a refusal says why.
pub async fn allows(
    state: &AppState,
    user: &AuthUser,
    action: Action,
    value: Value,
) -> Result<(), String> {
    let answer = ask_handler(state, user, action, &value)
        .await
        .map_err(Refused::detail)?;
    if let Some(filters) = handler_filters(&answer) {
        let condition = filters::parse(filters).map_err(|e| e.to_string())?;
        let thread = value["thread_id"].as_str().and_then(|id| id.parse().ok());
        if let Some(thread) = thread {
            let met = thread_meets(state, &user.scope(), thread, &condition).await;
            if !met.map_err(|e| e.to_string())? {
                return Err("the thread is not found or not authorized".into());
            }
        }
    }
    // A run started by a command (the agent protocol's `run.start`) needs read access to its
    // assistant too, as one started by a request does.
    if (action.resource, action.action) == ("threads", "create_run") {
        if let Err(denied) = check_run_assistants(state, user, Some(&value)).await {
            let status = denied.status();
            return Err(format!(
                "the run's assistant is not readable by this user ({status})"
            ));
        }
    }
    Ok(())
}

/// The largest body read to build an action's value (the API's own limit is larger for runs
/// only through their input; an auth handler needs no more).
const BODY_LIMIT: usize = 32 * 1024 * 1024;

/// The middleware under custom auth: `route` is the matched route's template (`None` for the
/// docs, which need only authentication).
pub async fn require(
    state: &AppState,
    auth: &Auth,
    route: Option<&str>,
    request: Request,
    next: Next,
) -> Response {
    match authorized(state, auth, route, request).await {
        Ok(request) => next.run(request).await,
        Err(denied) => *denied,
    }
}

async fn authorized(
    state: &AppState,
    auth: &Auth,
    route: Option<&str>,
    request: Request,
) -> Result<Request, Denied> {
    let (mut parts, body) = request.into_parts();
    let path_params = path_params(&mut parts, state).await;
    let user = authenticate(state, &parts, &path_params).await?;
    let action = route.and_then(|route| actions::of(&parts.method, route));
    if let Some(refused) = forbidden(auth, action, &user) {
        return Err(Box::new(refused));
    }
    let Some(action) = action else {
        parts.extensions.insert(Arc::new(user));
        return Ok(Request::from_parts(parts, body));
    };
    let bytes = to_bytes(body, BODY_LIMIT).await.map_err(|_| {
        deny(ApiError::new(
            ErrorCode::PayloadTooLarge,
            "the body is too large",
        ))
    })?;
    let mut body_json: Option<Value> = serde_json::from_slice(&bytes).ok();
    let had_body = body_json.is_some();
    let asked = Asked {
        user: &user,
        action,
        route,
        path_params: &path_params,
    };
    match body_json {
        // `/runs/batch`: each run is asked about on its own, as LangGraph creates them.
        Some(Value::Array(ref mut runs)) if action.action == "create_run" => {
            for run in runs {
                ask_about_batch_run(state, asked, &parts.uri, run).await?;
            }
        }
        _ => ask_about_request(state, asked, &mut parts, &mut body_json, had_body).await?,
    }
    if (action.resource, action.action) == ("threads", "create_run") {
        check_run_assistants(state, &user, body_json.as_ref()).await?;
    }
    let body = match body_json {
        Some(json) => {
            // The body changed length; a JSON body is what the route reads either way.
            parts.headers.remove(axum::http::header::CONTENT_LENGTH);
            if !had_body {
                parts.headers.insert(
                    axum::http::header::CONTENT_TYPE,
                    axum::http::HeaderValue::from_static("application/json"),
                );
            }
            Body::from(json.to_string())
        }
        None => Body::from(bytes),
    };
    parts.extensions.insert(Arc::new(user));
    Ok(Request::from_parts(parts, body))
}

/// What a request asks of the handlers: who, which action, on which route and path.
#[derive(Clone, Copy)]
struct Asked<'a> {
    user: &'a AuthUser,
    action: Action,
    route: Option<&'a str>,
    path_params: &'a Map<String, Value>,
}

/// The handler's answer for a request (a batch's runs aside): its changes to `value` written
/// back into the body (`had_body`: the client sent one) or the query, its filter applied.
async fn ask_about_request(
    state: &AppState,
    asked: Asked<'_>,
    parts: &mut Parts,
    body: &mut Option<Value>,
    had_body: bool,
) -> Result<(), Denied> {
    let value = value_of(asked.action, asked.path_params, &parts.uri, body.as_ref());
    // A request without a body (a GET) gets none: its route would not read it.
    let body_target = (had_body || parts.method != axum::http::Method::GET).then_some(&mut *body);
    let answer = ask_and_apply(state, asked, value, &mut parts.uri, body_target).await?;
    match handler_filters(&answer) {
        Some(filters) => apply_filters(state, asked, filters, parts, body.as_ref()).await,
        None => Ok(()),
    }
}

/// Asks the handler about `value` and writes what it changed back into `uri`'s query and
/// `body`; its answer.
async fn ask_and_apply(
    state: &AppState,
    asked: Asked<'_>,
    value: Value,
    uri: &mut Uri,
    body: Option<&mut Option<Value>>,
) -> Result<Value, Denied> {
    let answer = ask_handler(state, asked.user, asked.action, &value).await?;
    let changed = answer.get("value").cloned().unwrap_or(Value::Null);
    apply_changes(asked.action, &value, &changed, uri, body);
    Ok(answer)
}

/// A handler's filter: the resource the path names (or a prune's threads) must meet it, and a
/// search applies it. The store's items have values, not metadata: a store search meets the
/// filter in the store's syntax, and other store actions name no item to check.
async fn apply_filters(
    state: &AppState,
    asked: Asked<'_>,
    filters: &Map<String, Value>,
    parts: &mut Parts,
    body: Option<&Value>,
) -> Result<(), Denied> {
    let search = asked.action.action == "search";
    if asked.action.resource == "store" {
        let conditions = filters::store_conditions(filters).map_err(deny)?;
        if search {
            parts.extensions.insert(StoreHandlerFilter(conditions));
        }
        return Ok(());
    }
    let condition = filters::parse(filters).map_err(deny)?;
    if let Some(route) = asked.route {
        let scope = asked.user.scope();
        check_resource(state, &scope, route, asked.path_params, &condition).await?;
        check_pruned(state, &scope, route, body, &condition).await?;
    }
    if search {
        parts.extensions.insert(HandlerFilter(Some(condition)));
    }
    Ok(())
}

/// One run of `/runs/batch`: the handler's changes go into that run's body. Its filter names
/// no resource (each run gets a thread of its own), but must be one Spindle can apply.
async fn ask_about_batch_run(
    state: &AppState,
    asked: Asked<'_>,
    uri: &Uri,
    run: &mut Value,
) -> Result<(), Denied> {
    let value = value_of(asked.action, asked.path_params, uri, Some(run));
    let mut body = Some(run.take());
    let answer = ask_and_apply(state, asked, value, &mut uri.clone(), Some(&mut body)).await;
    *run = body.unwrap_or_default();
    let answer = answer?;
    if let Some(filters) = handler_filters(&answer) {
        filters::parse(filters).map_err(deny)?;
    }
    Ok(())
}

async fn path_params(parts: &mut Parts, state: &AppState) -> Map<String, Value> {
    match RawPathParams::from_request_parts(parts, state).await {
        Ok(params) => params
            .iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect(),
        Err(_) => Map::new(),
    }
}

/// Who the `@auth.authenticate` handler says the caller is.
async fn authenticate(
    state: &AppState,
    parts: &Parts,
    path_params: &Map<String, Value>,
) -> Result<AuthUser, Denied> {
    let headers: Vec<Value> = parts
        .headers
        .iter()
        .filter_map(|(k, v)| Some(json!([k.as_str(), v.to_str().ok()?])))
        .collect();
    let ask = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query().unwrap_or_default(),
        "headers": headers,
        "path_params": path_params,
    });
    let answer = answered(python_auth::authenticate(pool(state)?, &ask).await)?;
    AuthUser::from_json(&answer["user"]).ok_or_else(|| {
        deny(ApiError::internal(
            "the @auth.authenticate handler answered no identity",
        ))
    })
}

/// The store's wire names of a namespace for each action (LangGraph's value says `namespace`).
fn store_namespace_field(action: Action) -> &'static str {
    match action.action {
        "search" => "namespace_prefix",
        "list_namespaces" => "prefix",
        _ => "namespace",
    }
}

/// LangGraph's `value` for the action: the path's parameters and the body's fields (the store
/// item read by `GET` takes its namespace and key from the query).
fn value_of(
    action: Action,
    path_params: &Map<String, Value>,
    uri: &Uri,
    body: Option<&Value>,
) -> Value {
    let mut value = path_params.clone();
    if let Some(Value::Object(fields)) = body {
        for (k, v) in fields {
            value.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    if action.resource == "store" {
        if let Some(ns) = value.remove(store_namespace_field(action)) {
            value.insert("namespace".into(), ns);
        }
        for (k, v) in query_pairs(uri) {
            let v = match k.as_str() {
                "namespace" => json!(v.split('.').filter(|l| !l.is_empty()).collect::<Vec<_>>()),
                _ => json!(v),
            };
            value.entry(k).or_insert(v);
        }
    }
    Value::Object(value)
}

fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    uri.query()
        .map(|q| serde_html_form::from_str::<Vec<(String, String)>>(q).unwrap_or_default())
        .unwrap_or_default()
}

/// Writes back what the handler changed in `value`: into the body's fields (`body`: `None`
/// for a request that has none and gets none), or (a store item read by `GET`) into the query.
fn apply_changes(
    action: Action,
    before: &Value,
    after: &Value,
    uri: &mut Uri,
    mut body: Option<&mut Option<Value>>,
) {
    let Value::Object(after) = after else {
        return;
    };
    for (key, new) in after {
        if before.get(key) == Some(new) {
            continue;
        }
        let field = if action.resource == "store" && key == "namespace" {
            store_namespace_field(action)
        } else {
            key.as_str()
        };
        if action.resource == "store" && action.action == "get" {
            set_query(uri, field, new);
        } else if let Some(body) = body.as_deref_mut() {
            if let Value::Object(fields) = body.get_or_insert_with(|| json!({})) {
                fields.insert(field.to_owned(), new.clone());
            }
        }
    }
}

fn set_query(uri: &mut Uri, field: &str, value: &Value) {
    let text = match value {
        Value::Array(labels) => labels
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("."),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut pairs: Vec<(String, String)> = query_pairs(uri)
        .into_iter()
        .filter(|(k, _)| k != field)
        .collect();
    pairs.push((field.to_owned(), text));
    let query = serde_html_form::to_string(&pairs).unwrap_or_default();
    if let Ok(new) = format!("{}?{query}", uri.path()).parse() {
        *uri = new;
    }
}

/// A run needs read access to its assistant, as in LangGraph Platform: unless the server made
/// the assistant (`created_by: system`), the `@auth.on.assistants.read` handler is asked, and
/// an assistant outside its filter is not found. (`body`: a run's, or `/runs/batch`'s list.)
async fn check_run_assistants(
    state: &AppState,
    user: &AuthUser,
    body: Option<&Value>,
) -> Result<(), Denied> {
    let bodies = match body {
        Some(Value::Array(items)) => items.iter().collect(),
        Some(one) => vec![one],
        None => vec![],
    };
    let scope = user.scope();
    let read = Action {
        resource: "assistants",
        action: "read",
    };
    for raw in bodies.iter().filter_map(|b| b["assistant_id"].as_str()) {
        // One that does not exist is the route's 404 to answer.
        let Some(id) = state.graphs.resolve_assistant_id(raw) else {
            continue;
        };
        let Ok(assistant) = state.storage.get_assistant(&scope, id).await else {
            continue;
        };
        let metadata = Value::Object(assistant.fields.metadata);
        if metadata["created_by"] == "system" {
            continue;
        }
        let value = json!({"assistant_id": id.to_string()});
        let answer = ask_handler(state, user, read, &value).await?;
        if let Some(filters) = handler_filters(&answer) {
            if !filters::parse(filters).map_err(deny)?.holds(&metadata) {
                return Err(deny(crate::routes::runs::no_assistant(raw)));
            }
        }
    }
    Ok(())
}

/// The thread, assistant or cron the path names (a run's thread, for a run named alone) must
/// meet the filter; one that does not is not found, as another user's is. One that does not
/// exist is left to the route.
async fn check_resource(
    state: &AppState,
    scope: &Scope,
    route: &str,
    path_params: &Map<String, Value>,
    condition: &MetadataCondition,
) -> Result<(), Denied> {
    match named_metadata(state, scope, route, path_params).await {
        Some(metadata) if !condition.holds(&metadata) => {
            Err(deny(ApiError::not_found("Not found")))
        }
        _ => Ok(()),
    }
}

/// A prune under a handler's filter: every thread it names must be the caller's and meet the
/// filter, else nothing is pruned and the answer is 404, as LangGraph answers it (without a
/// filter, unknown ids are skipped).
async fn check_pruned(
    state: &AppState,
    scope: &Scope,
    route: &str,
    body: Option<&Value>,
    condition: &MetadataCondition,
) -> Result<(), Denied> {
    if route != "/threads/prune" {
        return Ok(());
    }
    let ids = body
        .and_then(|b| b["thread_ids"].as_array())
        .map(Vec::as_slice)
        .unwrap_or_default();
    for id in ids {
        // An id that is not one is the route's 422 to answer.
        let Some(id) = id.as_str().and_then(|id| id.parse::<ResourceId>().ok()) else {
            continue;
        };
        let found = thread_meets(state, scope, id, condition)
            .await
            .map_err(|e| deny(ApiError::from(e)))?;
        if !found {
            return Err(deny(ApiError::not_found(
                "At least one thread not found or not authorized",
            )));
        }
    }
    Ok(())
}

/// The metadata of the resource the path names, when it exists for `scope`.
async fn named_metadata(
    state: &AppState,
    scope: &Scope,
    route: &str,
    path_params: &Map<String, Value>,
) -> Option<Value> {
    let id = |name: &str| path_params.get(name).and_then(Value::as_str);
    let storage = &state.storage;
    let metadata = if route.contains("{thread_id}") {
        let thread_id: ResourceId = id("thread_id")?.parse().ok()?;
        storage.get_thread(scope, thread_id).await.ok()?.metadata
    } else if route.contains("{run_id}") {
        let run = storage
            .find_run(scope, id("run_id")?.parse().ok()?)
            .await
            .ok()?;
        storage
            .get_thread(scope, run.thread_id)
            .await
            .ok()?
            .metadata
    } else if route.contains("{assistant_id}") {
        // A graph's id names its default assistant.
        let assistant_id = state.graphs.resolve_assistant_id(id("assistant_id")?)?;
        storage
            .get_assistant(scope, assistant_id)
            .await
            .ok()?
            .fields
            .metadata
    } else if route.contains("{cron_id}") {
        let cron_id = id("cron_id")?.parse().ok()?;
        storage.get_cron(scope, cron_id).await.ok()?.fields.metadata
    } else {
        return None;
    };
    Some(Value::Object(metadata))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handlers_changes_go_back_into_the_body_or_the_query() {
        let put = Action {
            resource: "store",
            action: "put",
        };
        let uri: Uri = "/store/items".parse().unwrap();
        let body = json!({"namespace": ["notes"], "key": "k", "value": {}});
        let before = value_of(put, &Map::new(), &uri, Some(&body));
        let mut after = before.clone();
        after["namespace"] = json!(["ann", "notes"]);
        let (mut uri2, mut body2) = (uri.clone(), Some(body));
        apply_changes(put, &before, &after, &mut uri2, Some(&mut body2));
        assert_eq!(body2.unwrap()["namespace"], json!(["ann", "notes"]));

        let get = Action {
            resource: "store",
            action: "get",
        };
        let mut uri: Uri = "/store/items?namespace=notes&key=k".parse().unwrap();
        let before = value_of(get, &Map::new(), &uri, None);
        assert_eq!(before["namespace"], json!(["notes"]));
        let mut after = before.clone();
        after["namespace"] = json!(["ann", "notes"]);
        apply_changes(get, &before, &after, &mut uri, None);
        assert_eq!(uri.query(), Some("key=k&namespace=ann.notes"));
    }
}
