//! `GET /metrics`: the process's metrics for Prometheus.
//!
//! Served with the meta routes (`http.disable_meta` turns it off, as LangGraph's does), and
//! open to callers without credentials like the health checks, since Prometheus scrapes
//! without them, unless `auth.public_metrics` is false. What it reports is listed in the
//! README's "Metrics" section and made in `spindle_execution::metrics`.

use axum::extract::State;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use spindle_execution::metrics::Format;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// The process's metrics in Prometheus's text format (version 0.0.4), or in OpenMetrics text
/// when the `Accept` header asks for `application/openmetrics-text`: runs by status and graph,
/// the queue, run and first-event latencies, open streams, worker slots, Python workers, the
/// database's pools and call latencies, webhook deliveries and cron firings.
#[utoipa::path(get, path = "/metrics", tag = "system",
    responses((status = 200, description = "the metrics, in the format the Accept header chose",
        content(
            (String = "text/plain; version=0.0.4; charset=utf-8"),
            (String = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        ))))]
async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::accepted(accept);
    let text = state.workers.scrape_metrics(format).await;
    ([(CONTENT_TYPE, format.content_type())], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document names the media types the route answers in, so a client (and the
    /// fuzzer) finds every response described.
    #[test]
    fn the_document_lists_the_formats_served() {
        let (_, api) = crate::openapi::router().split_for_parts();
        let get = api.paths.paths["/metrics"].get.clone().unwrap();
        let ok = match &get.responses.responses["200"] {
            utoipa::openapi::RefOr::T(response) => response.clone(),
            utoipa::openapi::RefOr::Ref(_) => panic!("a 200 of its own, not a reference"),
        };
        let documented: Vec<&str> = ok.content.keys().map(String::as_str).collect();
        assert_eq!(
            documented,
            [
                Format::PROMETHEUS_CONTENT_TYPE,
                Format::OPENMETRICS_CONTENT_TYPE
            ]
        );
    }
}
