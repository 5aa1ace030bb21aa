//! What every handler shares: the database, the graphs, the run machinery, and who is calling.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use spindle_storage::{Scope, Storage};

use crate::auth::AuthUser;
use crate::error::ApiError;
use crate::sse::DEFAULT_KEEPALIVE_SECS;
use crate::ttl::ThreadTtlConfig;
use spindle_execution::crons::Scheduler;
use spindle_execution::graphs::GraphRegistry;
use spindle_execution::store::StoreConfig;
use spindle_execution::webhook::{WebhookConfig, Webhooks};
use spindle_execution::{EventHub, Metrics, RunWorkers, WorkerConfig};

#[derive(Clone)]
pub struct AppState {
    pub storage: Arc<dyn Storage>,
    pub graphs: Arc<GraphRegistry>,
    pub hub: Arc<EventHub>,
    pub workers: Arc<RunWorkers>,
    /// Interval of the keepalive comments on event streams.
    pub keepalive: Duration,
    /// Checks webhook URLs and delivers run ends to them.
    pub webhooks: Arc<Webhooks>,
    /// The default thread TTL and how often expired threads are swept.
    pub thread_ttl: ThreadTtlConfig,
    /// The long-term store's TTL defaults and semantic index.
    pub store: StoreConfig,
    /// Wakes the cron scheduler of this process.
    pub crons: Arc<Scheduler>,
    /// Cross-origin access for browsers (`http.cors`); `None` sends no CORS headers.
    pub cors: Option<crate::cors::CorsLayer>,
    /// Who may call (`auth`); `None`: everyone, as the one local user.
    pub auth: Option<Arc<crate::auth::Auth>>,
    /// Route groups turned off, headers copied into runs, webhooks off (`http`).
    pub http: crate::http_config::HttpConfig,
    /// The process's metrics (`GET /metrics`), shared with the run workers, webhooks and
    /// crons that record into them.
    pub metrics: Arc<Metrics>,
    /// How long a request head may take and how many connections `serve` keeps open.
    pub connections: crate::connections::ConnectionLimits,
}

impl AppState {
    pub fn new(storage: Arc<dyn Storage>, graphs: Arc<GraphRegistry>) -> Self {
        Self::with_workers(storage, graphs, WorkerConfig::default())
    }

    pub fn with_workers(
        storage: Arc<dyn Storage>,
        graphs: Arc<GraphRegistry>,
        config: WorkerConfig,
    ) -> Self {
        let metrics = Arc::default();
        Self::with_settings(storage, graphs, config, WebhookConfig::default(), metrics)
    }

    /// The state of a server whose metrics are `metrics` (made at start-up, and which the
    /// storage may already record into: `spindle_execution::metrics::MeteredStorage`).
    pub fn with_settings(
        storage: Arc<dyn Storage>,
        graphs: Arc<GraphRegistry>,
        config: WorkerConfig,
        webhooks: WebhookConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let hub = Arc::new(EventHub::default());
        let webhooks = Arc::new(Webhooks::new(webhooks, metrics.clone()));
        let workers = Arc::new(RunWorkers::new(
            storage.clone(),
            graphs.clone(),
            hub.clone(),
            webhooks.clone(),
            config,
            metrics.clone(),
        ));
        Self {
            storage,
            graphs,
            hub,
            workers,
            keepalive: Duration::from_secs(DEFAULT_KEEPALIVE_SECS),
            webhooks,
            thread_ttl: ThreadTtlConfig::default(),
            store: StoreConfig::default(),
            crons: Arc::new(Scheduler::default()),
            cors: None,
            auth: None,
            http: Default::default(),
            metrics,
            connections: Default::default(),
        }
    }
}

/// The identity a request acts for. Every storage call takes it, so a query never reaches
/// another user's resources. The caller is the user the request's credentials name (set by
/// `auth::require`), or, without authentication, the one local user.
pub struct Caller(pub Scope);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Caller(
            parts
                .extensions
                .get::<Arc<AuthUser>>()
                .map_or_else(Scope::local, |user| user.scope()),
        ))
    }
}
