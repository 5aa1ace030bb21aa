//! Health, readiness and service information.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ErrorBody;
use crate::state::AppState;

/// The health checks: always served, and open to callers without credentials.
pub fn health_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(ok))
        .routes(routes!(health))
        .routes(routes!(live))
        .routes(routes!(ready))
}

/// `/info` and the graph file format's schema, which LangGraph's `http.disable_meta` turns
/// off with the documentation.
pub fn meta_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(info))
        .routes(routes!(graph_file_schema))
}

/// The JSON Schema of graph files (docs/graph-files.md), for editors: a YAML file that starts
/// with `# yaml-language-server: $schema=http://127.0.0.1:2024/graph-file.schema.json` is
/// checked and completed as it is typed.
#[utoipa::path(get, path = "/graph-file.schema.json", tag = "system",
    responses((status = 200, description = "the JSON Schema (draft-07) of graph files", body = Object,
        content_type = "application/schema+json")))]
async fn graph_file_schema() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/schema+json")],
        spindle_graph::spec::SCHEMA,
    )
}

#[derive(Serialize, ToSchema)]
pub struct Ok {
    pub ok: bool,
}

/// The process answers HTTP (what LangGraph clients probe).
#[utoipa::path(get, path = "/ok", tag = "system", responses((status = 200, body = Ok)))]
async fn ok() -> Json<Ok> {
    Json(Ok { ok: true })
}

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
}

/// The process is up.
#[utoipa::path(get, path = "/health", tag = "system", responses((status = 200, body = Health)))]
async fn health() -> Json<Health> {
    Json(Health { status: "healthy" })
}

/// Liveness probe: the process is not wedged.
#[utoipa::path(get, path = "/live", tag = "system", responses((status = 200, body = Health)))]
async fn live() -> Json<Health> {
    Json(Health { status: "alive" })
}

/// Readiness probe: the database answers a query, and its schema is this server's.
#[utoipa::path(get, path = "/ready", tag = "system",
    responses((status = 200, description = "ready", body = Object), (status = 503, description = "the database does not answer, or lacks the schema", body = ErrorBody)))]
async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let backend = state.storage.backend().as_str();
    match state.storage.ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"status": "ready", "database": backend})),
        ),
        Err(err) => {
            tracing::warn!(error = %err, "readiness check failed");
            let message = match err {
                spindle_storage::StorageError::Schema(why) => why,
                _ => format!("the {backend} database does not answer"),
            };
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({
                    "error": "unavailable",
                    "message": message,
                    "details": {"database": backend},
                })),
            )
        }
    }
}

/// The server's version and which features it serves.
#[utoipa::path(get, path = "/info", tag = "system", responses((status = 200, body = Object)))]
async fn info(State(state): State<AppState>) -> Json<Value> {
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "server": "spindle",
        "database": state.storage.backend().as_str(),
        "graphs": state.graphs.ids(),
        // Optional parts compiled into this build (cargo features).
        "features": if spindle_execution::store::LOCAL_EMBEDDINGS { vec!["local-embeddings"] } else { Vec::<&str>::new() },
        "flags": {
            "assistants": true,
            "crons": true,
            "store": true,
            "langsmith": false,
        },
    }))
}
