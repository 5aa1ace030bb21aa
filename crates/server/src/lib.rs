//! Spindle's HTTP API: the routes, their wire types, the error model and the OpenAPI document.
//!
//! The wire format (field names, error bodies, SSE framing) lives in this crate only; the
//! storage, execution and graph crates hand it typed values. A handler maps a request to calls
//! of storage and of run execution (`spindle_execution`), and their answers to responses.

pub mod auth;
pub mod connections;
pub mod cors;
pub mod error;
pub mod extract;
mod guard;
pub mod http_config;
mod openapi;
mod openapi_examples;
pub mod protocol;
pub mod routes;
pub mod runs;
pub mod sse;
pub mod state;
pub mod ttl;
pub mod wire;

use axum::middleware::from_fn_with_state;
use axum::Router;
use tokio::net::TcpListener;
use tower_http::trace::TraceLayer;

pub use state::AppState;
pub use ttl::ThreadTtlConfig;

/// The application: every route (but the groups `http.disable_*` turns off), the OpenAPI
/// document at `/openapi.json` and its rendering at `/docs` (unless `http.disable_meta`).
pub fn app(state: AppState) -> Router {
    let http = &state.http;
    let (mut router, api) = openapi::served(&http.disabled).split_for_parts();
    let mut docs = (!http.disabled.meta).then(|| openapi::docs(api, http.disable_webhooks));
    if state.auth.is_some() {
        // Inside routing, so the middleware knows the route (its action) and unknown paths
        // stay 404s.
        router = router.route_layer(from_fn_with_state(state.clone(), auth::require));
        docs = docs.map(|docs| {
            docs.route_layer(from_fn_with_state(state.clone(), auth::require_for_docs))
        });
    }
    let router = router
        .merge(docs.unwrap_or_default())
        .fallback(fallback)
        .layer(axum::middleware::from_fn(guard::guard));
    // Outside the guard: a preflight is answered here, whatever the route.
    let router = match &state.cors {
        Some(cors) => router.layer(cors.clone()),
        None => router,
    };
    router.layer(TraceLayer::new_for_http()).with_state(state)
}

async fn fallback(uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::not_found(format!("No route for {}", uri.path()))
}

/// Starts the run workers and serves `app` on `listener` until `shutdown` resolves; then
/// stops gracefully (see [`stop`]).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stop_workers = tokio_util::sync::CancellationToken::new();
    // Before the workers start: from their first idle moment they rely on announcements.
    if let Some(wakeups) = state.storage.wakeups() {
        spindle_execution::wakeups::start(
            wakeups,
            state.hub.clone(),
            state.workers.clone(),
            state.crons.clone(),
            stop_workers.clone(),
        );
    }
    state.workers.start(stop_workers.clone());
    tokio::spawn(ttl::sweep_threads(
        state.storage.clone(),
        state.thread_ttl,
        stop_workers.clone(),
    ));
    tokio::spawn(spindle_execution::crons::run_scheduler(
        state.storage.clone(),
        state.crons.clone(),
        std::sync::Arc::new(routes::crons::CronRuns(state.clone())),
        state.metrics.clone(),
        stop_workers.clone(),
    ));
    tokio::spawn(spindle_execution::store::sweep_items(
        state.storage.clone(),
        state.store.sweep_every,
        stop_workers.clone(),
    ));
    let stopping = tokio_util::sync::CancellationToken::new();
    let server = connections::serve(
        listener,
        app(state.clone()),
        stopping.clone(),
        state.connections,
    );
    let mut server = tokio::spawn(server);
    tokio::select! {
        // The server's task ended by itself (it panicked).
        served = &mut server => {
            stop_workers.cancel();
            return served.map_err(std::io::Error::other);
        }
        () = shutdown => {}
    }
    stop(&state, &stopping).await;
    stop_workers.cancel();
    tokio::select! {
        waited = tokio::time::timeout(REQUESTS_GRACE, server) => match waited {
            Ok(served) => served.map_err(std::io::Error::other),
            Err(_) => {
                tracing::warn!(
                    secs = REQUESTS_GRACE.as_secs(),
                    "requests still open after the drain; stopping anyway"
                );
                Ok(())
            }
        },
        // Told to stop now (`RunWorkers::stop_now`): open requests are not waited for either.
        () = state.workers.stopping_now() => Ok(()),
    }
}

/// How long requests still open after the drain (a `/wait` on a run handed back) may take.
const REQUESTS_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A graceful stop: no new connections (`stopping`), every stream this process serves ends
/// (clients resume them with `Last-Event-ID` on another process), no more runs are claimed,
/// and the running ones finish within the grace or are handed back to the queue, where
/// another process resumes them at once.
async fn stop(state: &AppState, stopping: &tokio_util::sync::CancellationToken) {
    tracing::info!(
        grace_secs = state.workers.shutdown_grace().as_secs(),
        "stopping: streams end, no run is claimed, running runs finish or are handed back"
    );
    stopping.cancel();
    state.hub.close_streams();
    state.workers.drain().await;
    tracing::info!("stopped: no run executes here");
}
