//! Run execution, apart from HTTP: the queue's workers that claim runs and execute their
//! graphs, the event pump that logs and streams what a run emits, the live event hub, the
//! cron scheduler, webhook delivery, the long-term store as graphs reach it, the graphs
//! this process serves, and the metrics of all of them (`GET /metrics`).
//!
//! The HTTP server (`spindle-server`) maps requests to calls here and to storage; nothing here
//! knows HTTP. Starting a run (`RunWorkers::start_run`) is the one way every run begins: from
//! the run routes, and from crons when they fire.

pub mod crons;
mod event_pump;
pub mod execute;
pub mod graphs;
pub mod hub;
mod logged_saves;
pub mod metrics;
pub mod python;
pub mod retention;
pub mod run_view;
pub mod start;
pub mod store;
pub mod threads;
pub mod trace;
pub mod v2_events;
pub mod wakeups;
pub mod webhook;
pub mod worker;

pub use event_pump::start_event;
pub use graphs::{default_assistant_id, GraphRegistry};
pub use hub::{EndedRun, EventHub, HubMessage, Subscription};
pub use metrics::Metrics;
pub use start::{RunRequest, StartedRun, Stateless};
pub use store::StoreConfig;
pub use webhook::{WebhookConfig, Webhooks};
pub use worker::{RunWorkers, WorkerConfig, CLEANUP_BY_WORKER};

/// A random duration below `limit` (whole milliseconds; zero for a limit under one), to spread
/// out what would otherwise happen together: retries of webhooks that failed together, the
/// keepalives of streams opened together.
pub fn random_below(limit: std::time::Duration) -> std::time::Duration {
    let millis = (limit.as_millis() as u64).max(1);
    // A v4 UUID's low 62 bits are random.
    std::time::Duration::from_millis((uuid::Uuid::new_v4().as_u128() as u64) % millis)
}

/// Sleeps for `wait`, or forever without one (a wait that only a wake-up ends).
pub(crate) async fn sleep_or_forever(wait: Option<std::time::Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}
