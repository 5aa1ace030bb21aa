//! The OpenAPI document, generated from the handlers' annotations, and the `/docs` page.
//!
//! Routes are registered through `utoipa_axum`'s `OpenApiRouter`, so a route cannot be served
//! without appearing in the document.

use axum::routing::get;
use axum::{Json, Router};
use utoipa::openapi::path::{OperationBuilder, PathItemBuilder};
use utoipa::openapi::{HttpMethod, OpenApi as OpenApiDoc, ResponseBuilder};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::{Config, SwaggerUi};

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

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(routes::system::router())
        .merge(routes::assistants::router())
        .merge(routes::threads::router())
        .merge(routes::state::router())
        .merge(routes::runs::router())
        .merge(routes::streams::router())
        .merge(routes::thread_events::router())
        .merge(routes::crons::router())
        .merge(routes::store::router())
}

/// `/openapi.json` and `/docs` (Swagger UI, its assets compiled into the binary: no CDN).
pub fn docs(mut api: OpenApiDoc) -> Router<AppState> {
    document_media_type(&mut api);
    document_self(&mut api);
    let json = api.clone();
    Router::new()
        .route("/openapi.json", get(move || async move { Json(json) }))
        .merge(SwaggerUi::new("/docs").config(Config::from("/openapi.json")))
}

/// Every operation that takes a body answers 415 to a body that is not JSON (see
/// `guard::check_media_type`), which no handler's annotation says since none of them sees it.
fn document_media_type(api: &mut OpenApiDoc) {
    use utoipa::openapi::{ContentBuilder, Ref};
    let response = ResponseBuilder::new()
        .description("the body is not JSON (Content-Type application/json or +json)")
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build();
    for item in api.paths.paths.values_mut() {
        for operation in [
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
        .filter(|op| op.request_body.is_some())
        {
            operation
                .responses
                .responses
                .entry("415".into())
                .or_insert_with(|| response.clone().into());
        }
    }
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
