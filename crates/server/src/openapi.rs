//! The OpenAPI document, generated from the handlers' annotations, and the `/docs` page.
//!
//! Routes are registered through `utoipa_axum`'s `OpenApiRouter`, so a route cannot be served
//! without appearing in the document.

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use utoipa::openapi::path::{Operation, OperationBuilder, PathItemBuilder};
use utoipa::openapi::schema::{AnyOfBuilder, ArrayItems, Object, SchemaType, Type};
use utoipa::openapi::{
    Components, Content, HttpMethod, OpenApi as OpenApiDoc, Ref, RefOr, Required, ResponseBuilder,
    Schema,
};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::{Config, SwaggerUi};

use crate::http_config::Disabled;
use crate::openapi_examples::request_example;
use crate::routes;
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "Spindle", description = "A self-hosted agent run server speaking the LangGraph agent-server API."),
    tags(
        (name = "assistants", description = "Versioned configurations of a graph"),
        (name = "threads", description = "State accumulated by runs"),
        (name = "runs", description = "Executions of an assistant on a thread"),
        (name = "crons", description = "Runs on a schedule"),
        (name = "store", description = "The long-term store: documents under namespaces"),
        (name = "system", description = "Health and service information"),
    )
)]
struct ApiDoc;

/// Every route (the tests that check each route's properties list them from it).
#[cfg(test)]
pub fn router() -> OpenApiRouter<AppState> {
    served(&Disabled::default())
}

/// A route module's routes.
type Group = fn() -> OpenApiRouter<AppState>;

/// The routes of the groups not `disabled`, grouped as LangGraph Platform's `http.disable_*`
/// group them: `/info` and `/metrics` go with the documentation (meta); a thread's state,
/// history and join stream go with threads; crons and the agent protocol's thread stream and
/// commands (which start runs) go with runs. The document lists exactly these.
pub fn served(disabled: &Disabled) -> OpenApiRouter<AppState> {
    let groups: [(bool, Group); 10] = [
        (disabled.meta, routes::system::meta_router),
        (disabled.meta, routes::metrics::router),
        (disabled.assistants, routes::assistants::router),
        (disabled.threads, routes::threads::router),
        (disabled.threads, routes::state::router),
        (disabled.threads, routes::streams::router),
        (disabled.runs, routes::runs::router),
        (disabled.runs, routes::crons::router),
        (
            disabled.runs || disabled.event_streaming,
            routes::thread_events::router,
        ),
        (disabled.store, routes::store::router),
    ];
    // The health checks stay whatever is turned off (as in the reference, where `/ok`
    // outlives `disable_meta`): probes must keep working.
    let health = routes::system::health_router();
    let served = groups.into_iter().filter(|(off, _)| !off);
    served.fold(
        OpenApiRouter::with_openapi(ApiDoc::openapi()).merge(health),
        |router, (_, group)| router.merge(group()),
    )
}

/// `/openapi.json` and `/docs` (Swagger UI, its assets compiled into the binary: no CDN).
/// With `webhooks_off` (`http.disable_webhooks`) run bodies have no `webhook`, as in the
/// reference's document: it would only be refused.
pub fn docs(mut api: OpenApiDoc, webhooks_off: bool) -> Router<AppState> {
    if webhooks_off {
        remove_webhook_field(&mut api);
    }
    document_media_type(&mut api);
    document_optional_bodies(&mut api);
    document_selected_fields(&mut api);
    document_self(&mut api);
    document_examples(&mut api);
    let mut json = serde_json::to_value(api).expect("the OpenAPI document serialises");
    document_uuid_syntax(&mut json);
    document_empty_query_values(&mut json);
    document_cancel_forms(&mut json);
    Router::new()
        .route("/openapi.json", get(move || async move { Json(json) }))
        .merge(SwaggerUi::new("/docs").config(Config::from("/openapi.json")))
}

/// Leaves `webhook` out of the run bodies' schema.
fn remove_webhook_field(api: &mut OpenApiDoc) {
    let schemas = api.components.as_mut().map(|c| &mut c.schemas);
    if let Some(RefOr::T(Schema::Object(run))) = schemas.and_then(|s| s.get_mut("RunCreate")) {
        run.properties.shift_remove("webhook");
        run.required.retain(|field| field != "webhook");
    }
}

/// Every operation that takes a body answers 415 to a body that is not JSON (see
/// `guard::check_media_type`), which no handler's annotation says since none of them sees it.
fn document_media_type(api: &mut OpenApiDoc) {
    use utoipa::openapi::ContentBuilder;
    let response = ResponseBuilder::new()
        .description("the body is not JSON (Content-Type application/json or +json)")
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build();
    for operation in operations_mut(api).filter(|op| op.request_body.is_some()) {
        operation
            .responses
            .responses
            .entry("415".into())
            .or_insert_with(|| response.clone().into());
    }
}

/// Every operation of the document.
fn operations_mut(api: &mut OpenApiDoc) -> impl Iterator<Item = &mut Operation> {
    api.paths.paths.values_mut().flat_map(|item| {
        [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
    })
}

/// An optional body (`request_body = Option<T>`: `ApiJson` reads a missing body as `{}`) is
/// left out, never `null`: utoipa writes its schema `oneOf: [null, T]`, but a `null` body is
/// refused, so the schema is `T` alone.
fn document_optional_bodies(api: &mut OpenApiDoc) {
    let bodies = operations_mut(api).filter_map(|op| op.request_body.as_mut());
    for body in bodies.filter(|body| body.required != Some(Required::True)) {
        for content in body.content.values_mut() {
            if let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema {
                let mut not_null = one_of.items.iter().filter(|item| !is_null(item));
                if let (Some(only), None) = (not_null.next(), not_null.next()) {
                    content.schema = Some(only.clone());
                }
            }
        }
    }
}

fn is_null(schema: &RefOr<Schema>) -> bool {
    matches!(schema, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null))
}

/// A search with `select` answers only the named fields of each item, so the items of its
/// 200 response are the resource, or any part of it: `anyOf: [T, TSelected]`, where
/// `TSelected` is `T` with no field required.
fn document_selected_fields(api: &mut OpenApiDoc) {
    let Some(components) = api.components.as_mut() else {
        return;
    };
    for op in api
        .paths
        .paths
        .values_mut()
        .filter_map(|item| item.post.as_mut())
    {
        let selects = json_schema(op.request_body.as_ref().map(|b| &b.content))
            .and_then(|schema| component(components, schema))
            .is_some_and(|request| request.properties.contains_key("select"));
        let Some(items) = selects.then(|| ok_array_items(op)).flatten() else {
            continue;
        };
        let RefOr::Ref(full) = items.as_ref() else {
            continue;
        };
        let Some(mut partial) = component(components, items).cloned() else {
            continue;
        };
        let name = format!("{}Selected", schema_name(full));
        partial.required.clear();
        partial.description = Some(format!(
            "`{}` with the fields `select` named only",
            schema_name(full)
        ));
        components.schemas.insert(name.clone(), partial.into());
        let either = AnyOfBuilder::new()
            .item(full.clone())
            .item(Ref::from_schema_name(name));
        **items = either.into();
    }
}

/// The JSON schema of a request or response content.
fn json_schema<'a, I>(content: Option<I>) -> Option<&'a RefOr<Schema>>
where
    I: IntoIterator<Item = (&'a String, &'a Content)>,
{
    content?
        .into_iter()
        .find(|(media_type, _)| *media_type == "application/json")?
        .1
        .schema
        .as_ref()
}

/// The items of a 200 response that is a JSON array.
fn ok_array_items(op: &mut Operation) -> Option<&mut Box<RefOr<Schema>>> {
    let RefOr::T(ok) = op.responses.responses.get_mut("200")? else {
        return None;
    };
    match ok.content.get_mut("application/json")?.schema.as_mut()? {
        RefOr::T(Schema::Array(array)) => match &mut array.items {
            ArrayItems::RefOrSchema(items) => Some(items),
            _ => None,
        },
        _ => None,
    }
}

/// The object schema a `$ref` names among the components.
fn component<'a>(components: &'a Components, schema: &RefOr<Schema>) -> Option<&'a Object> {
    let RefOr::Ref(r) = schema else { return None };
    match components.schemas.get(schema_name(r))? {
        RefOr::T(Schema::Object(object)) => Some(object),
        _ => None,
    }
}

fn schema_name(r: &Ref) -> &str {
    r.ref_location.rsplit('/').next().unwrap_or_default()
}

/// What `Uuid::parse_str` takes, which reads every UUID of a request: 32 hex digits, or the
/// hyphenated form, bare, in braces or after `urn:uuid:`.
const UUID_PATTERN: &str = concat!(
    "^([0-9a-fA-F]{32}",
    "|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "|\\{[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\\}",
    "|[Uu][Rr][Nn]:[Uu][Uu][Ii][Dd]:",
    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$"
);

/// `format: uuid` is an annotation in JSON Schema 2020-12, which a validator need not check;
/// every string of that format also gets the pattern the server checks it by, so the document
/// says which strings are refused.
fn document_uuid_syntax(doc: &mut Value) {
    match doc {
        Value::Object(map) => {
            if map.get("format").and_then(Value::as_str) == Some("uuid") {
                map.entry("pattern").or_insert_with(|| json!(UUID_PATTERN));
            }
            map.values_mut().for_each(document_uuid_syntax);
        }
        Value::Array(items) => items.iter_mut().for_each(document_uuid_syntax),
        _ => {}
    }
}

/// `ApiQuery` reads an optional parameter given with an empty value (`?limit=`) as left out,
/// so an empty value is allowed for those (not for a list, where `""` is an item).
fn document_empty_query_values(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    let parameters = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(|op| op.get_mut("parameters").and_then(Value::as_array_mut))
        .flatten();
    for parameter in parameters {
        let optional_query = parameter["in"] == "query" && parameter["required"] != true;
        if optional_query && parameter["schema"]["type"] != "array" {
            parameter["allowEmptyValue"] = json!(true);
        }
    }
}

/// Gives each request body its working example ([`request_example`]).
fn document_examples(api: &mut OpenApiDoc) {
    for (path, item) in api.paths.paths.iter_mut() {
        let operations = [
            ("GET", &mut item.get),
            ("POST", &mut item.post),
            ("PUT", &mut item.put),
            ("PATCH", &mut item.patch),
            ("DELETE", &mut item.delete),
        ];
        for (method, operation) in operations {
            let body = operation.as_mut().and_then(|op| op.request_body.as_mut());
            let content = body.and_then(|body| body.content.get_mut("application/json"));
            if let Some(content) = content {
                content.example = request_example(method, path);
            }
        }
    }
}

/// `POST /runs/cancel` takes one of two forms (`CancelManyRequest::validate`): a `status`, or a
/// `thread_id` with `run_ids` (at least one). Said as `oneOf`, so that clients and fuzzers
/// generate only bodies the server takes.
fn document_cancel_forms(doc: &mut Value) {
    let Some(request) = doc.pointer_mut("/components/schemas/CancelManyRequest") else {
        return;
    };
    let absent = json!({"type": "null"});
    request["oneOf"] = json!([
        {
            "title": "by status",
            "required": ["status"],
            "properties": {
                "status": {"$ref": "#/components/schemas/CancelStatus"},
                "thread_id": absent,
                "run_ids": absent,
            },
        },
        {
            "title": "runs of a thread",
            "required": ["thread_id", "run_ids"],
            "properties": {
                "status": absent,
                "thread_id": {"$ref": "#/components/schemas/ResourceId"},
                "run_ids": {"type": "array", "minItems": 1},
            },
        },
    ]);
}

/// Lists the two documentation routes in the document itself.
fn document_self(api: &mut OpenApiDoc) {
    for (path, summary, content_type) in [
        ("/openapi.json", "This OpenAPI document", "application/json"),
        (
            "/docs",
            "The API reference, rendered from this document",
            "text/html",
        ),
    ] {
        let response = ResponseBuilder::new()
            .description(summary)
            .content(content_type, Default::default())
            .build();
        let operation = OperationBuilder::new()
            .summary(Some(summary))
            .tag("system")
            .response("200", response)
            .build();
        api.paths.paths.insert(
            path.into(),
            PathItemBuilder::new()
                .operation(HttpMethod::Get, operation)
                .build(),
        );
    }
}
