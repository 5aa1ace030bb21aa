//! The process's metrics, which `GET /metrics` serves in Prometheus's text format.
//!
//! One [`Metrics`] is made at start-up and handed to what records into it: the run workers
//! (runs by status and graph, executing runs, queue wait, run duration, first-event latency),
//! webhook delivery, the cron scheduler, the server's event streams, and the storage, whose
//! every call is timed by [`MeteredStorage`]. Recording is an atomic addition (counters,
//! gauges, [`Histogram`]); a metric labelled by graph or storage operation is found in its
//! family under a read lock held for the lookup alone. What is cheaper to read than to track
//! (worker slots, Python workers, connection pools, SQLite's write queue, and the queue's
//! runs, one count over an index) is read when the endpoint is scraped
//! ([`RunWorkers::scrape_metrics`]).
//!
//! Names, types and labels are listed in the README's "Metrics" section.

pub mod histogram;
mod storage;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spindle_storage::{PoolStats, QueuedRuns, Run, RunStatus};

pub use histogram::Histogram;
pub use storage::MeteredStorage;

use crate::python::pool::WorkerState;
use crate::RunWorkers;

/// Bounds of the run duration histogram, in seconds: from quick graphs to hour-long agents.
pub const RUN_SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];
/// Bounds of the queue wait and first-event latency histograms, in seconds.
pub const WAIT_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Bounds of the storage call latency histogram, in seconds.
pub const STORAGE_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
];

/// How long a scrape waits for the count of the queue's runs.
const QUEUE_COUNT_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GraphLabels {
    graph: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunEndLabels {
    graph: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolStateLabels {
    pool: &'static str,
    state: &'static str,
}

/// A family of histograms that all have the same bounds.
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The kinds of event stream a client holds open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// The SSE stream of a run created by the request (`.../runs/stream`).
    Run,
    /// The SSE stream of a run joined by id (`GET .../runs/{run_id}/stream`).
    RunJoin,
    /// A thread's SSE stream (`GET /threads/{thread_id}/stream`).
    Thread,
    /// The agent protocol v2 event stream over SSE (`POST /threads/{thread_id}/stream/events`).
    Protocol,
    /// The agent protocol v2 WebSocket (`GET /threads/{thread_id}/stream/events`).
    WebSocket,
}

impl StreamKind {
    pub const ALL: [StreamKind; 5] = [
        StreamKind::Run,
        StreamKind::RunJoin,
        StreamKind::Thread,
        StreamKind::Protocol,
        StreamKind::WebSocket,
    ];

    /// The `kind` label.
    pub fn label(self) -> &'static str {
        match self {
            StreamKind::Run => "run",
            StreamKind::RunJoin => "run_join",
            StreamKind::Thread => "thread",
            StreamKind::Protocol => "protocol",
            StreamKind::WebSocket => "websocket",
        }
    }
}

/// How a webhook delivery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// The receiver answered 2xx.
    Success,
    /// The receiver refused it, or every attempt failed.
    Failed,
    /// The URL was not allowed (any more); nothing was sent.
    Refused,
}

impl WebhookOutcome {
    const ALL: [WebhookOutcome; 3] = [
        WebhookOutcome::Success,
        WebhookOutcome::Failed,
        WebhookOutcome::Refused,
    ];

    fn label(self) -> &'static str {
        match self {
            WebhookOutcome::Success => "success",
            WebhookOutcome::Failed => "failed",
            WebhookOutcome::Refused => "refused",
        }
    }
}

/// The `outcome` labels of cron firings: a run was created, or none was.
const CRON_OUTCOMES: [&str; 2] = ["run_created", "no_run"];

/// The encodings `/metrics` answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus's text format, version 0.0.4: what scrapers read by default.
    Prometheus,
    /// OpenMetrics 1.0 text, for scrapers that ask for it (`Accept:
    /// application/openmetrics-text`).
    OpenMetrics,
}

impl Format {
    pub const PROMETHEUS_CONTENT_TYPE: &'static str = "text/plain; version=0.0.4; charset=utf-8";
    pub const OPENMETRICS_CONTENT_TYPE: &'static str =
        "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// OpenMetrics when the `Accept` header names it, else Prometheus's text format.
    pub fn accepted(accept: Option<&str>) -> Self {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => Self::PROMETHEUS_CONTENT_TYPE,
            Format::OpenMetrics => Self::OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// The registry and a handle on every metric in it.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    runs_ended: Family<RunEndLabels, Counter>,
    runs_executing: Family<GraphLabels, Gauge>,
    run_duration: Histograms<GraphLabels>,
    first_event: Histograms<GraphLabels>,
    queue_wait: Histogram,
    /// By [`StreamKind`], in [`StreamKind::ALL`]'s order.
    streams: Vec<Gauge>,
    /// By [`WebhookOutcome`], in [`WebhookOutcome::ALL`]'s order.
    webhooks: Vec<Counter>,
    /// By [`CRON_OUTCOMES`].
    crons: Vec<Counter>,
    storage_calls: Histograms<OpLabels>,
    storage_errors: Family<OpLabels, Counter>,
    sampled: Sampled,
}

/// What a scrape reads rather than what is tracked.
#[derive(Debug, Default)]
struct Sampled {
    slots: Gauge,
    slots_in_use: Gauge,
    python_workers: Gauge,
    python_workers_taking_runs: Gauge,
    python_runs: Gauge,
    python_run_slots: Gauge,
    db_connections: Family<PoolStateLabels, Gauge>,
    db_connections_max: Family<PoolLabels, Gauge>,
    /// One unlabelled gauge, on SQLite only.
    writer_queue: Family<Vec<(&'static str, &'static str)>, Gauge>,
    queue_runs: Family<StatusLabels, Gauge>,
    queue_count_failures: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("spindle");
        let runs_ended = Family::<RunEndLabels, Counter>::default();
        registry.register(
            "runs_ended",
            "Runs this process's workers ended, by graph and status (success, error, timeout, interrupted)",
            runs_ended.clone(),
        );
        let runs_executing = Family::<GraphLabels, Gauge>::default();
        registry.register(
            "runs_executing",
            "Runs executing in this process now, by graph",
            runs_executing.clone(),
        );
        let run_duration: Histograms<GraphLabels> =
            Family::new_with_constructor(|| Histogram::new(RUN_SECONDS));
        registry.register(
            "run_duration_seconds",
            "Execution time of the runs this process ended, from the start of their execution to their end, by graph",
            run_duration.clone(),
        );
        let first_event: Histograms<GraphLabels> =
            Family::new_with_constructor(|| Histogram::new(WAIT_SECONDS));
        registry.register(
            "run_first_event_seconds",
            "Time from when a run could start (its creation, or after_seconds later) to the first event its graph streamed, by graph; first attempts",
            first_event.clone(),
        );
        let queue_wait = Histogram::new(WAIT_SECONDS);
        registry.register(
            "run_queue_wait_seconds",
            "Time from when a run could start (its creation, or after_seconds later) to the start of its execution in this process; first attempts",
            queue_wait.clone(),
        );
        let streams = Family::<KindLabels, Gauge>::default();
        registry.register(
            "streams_open",
            "Event streams clients hold open on this process, by kind (run, run_join, thread, protocol, websocket)",
            streams.clone(),
        );
        let webhooks = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook deliveries by outcome (success; failed: refused by the receiver or every attempt failed; refused: the URL is not allowed)",
            webhooks.clone(),
        );
        let crons = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "cron_firings",
            "Cron due times this process fired, by outcome (run_created, no_run)",
            crons.clone(),
        );
        let storage_calls: Histograms<OpLabels> =
            Family::new_with_constructor(|| Histogram::new(STORAGE_SECONDS));
        registry.register(
            "storage_call_duration_seconds",
            "Latency of the calls to the storage, by operation (the storage trait's method)",
            storage_calls.clone(),
        );
        let storage_errors = Family::<OpLabels, Counter>::default();
        registry.register(
            "storage_call_errors",
            "Storage calls that failed, by operation",
            storage_errors.clone(),
        );
        let sampled = Sampled::default();
        sampled.register(&mut registry);
        // Every kind and outcome from the start, at 0: a rate over a series that appears only
        // with its first event misses that event.
        let streams = StreamKind::ALL
            .iter()
            .map(|kind| streams.get_or_create_owned(&KindLabels { kind: kind.label() }))
            .collect();
        let webhooks = WebhookOutcome::ALL
            .iter()
            .map(|o| webhooks.get_or_create_owned(&OutcomeLabels { outcome: o.label() }))
            .collect();
        let crons = CRON_OUTCOMES
            .iter()
            .map(|&outcome| crons.get_or_create_owned(&OutcomeLabels { outcome }))
            .collect();
        Self {
            registry,
            runs_ended,
            runs_executing,
            run_duration,
            first_event,
            queue_wait,
            streams,
            webhooks,
            crons,
            storage_calls,
            storage_errors,
            sampled,
        }
    }

    /// A run starts executing here, running `graph` (empty when its assistant or graph is
    /// gone). It counts among the executing runs until the returned meters are dropped.
    pub fn run_started(self: &Arc<Self>, graph: &str, run: &Run) -> RunMeters {
        let labels = GraphLabels {
            graph: graph.to_owned(),
        };
        let executing = self.runs_executing.get_or_create_owned(&labels);
        executing.inc();
        if run.attempt <= 1 {
            self.queue_wait.observe(since(ready_at(run)));
        }
        RunMeters {
            metrics: self.clone(),
            labels,
            executing,
            started: Instant::now(),
        }
    }

    /// An event stream opened; it counts as open until the returned guard is dropped.
    pub fn stream_opened(&self, kind: StreamKind) -> OpenStream {
        let index = StreamKind::ALL.iter().position(|k| *k == kind);
        let gauge = self.streams[index.unwrap_or_default()].clone();
        gauge.inc();
        OpenStream(gauge)
    }

    pub fn webhook_delivered(&self, outcome: WebhookOutcome) {
        let index = WebhookOutcome::ALL.iter().position(|o| *o == outcome);
        self.webhooks[index.unwrap_or_default()].inc();
    }

    /// A cron's due time fired: its run was created, or not.
    pub fn cron_fired(&self, run_created: bool) {
        self.crons[usize::from(!run_created)].inc();
    }

    /// A storage call took `elapsed`, and failed or not.
    pub fn storage_call(&self, op: &'static str, elapsed: Duration, failed: bool) {
        let labels = OpLabels { op };
        self.storage_calls.get_or_create(&labels).observe(elapsed);
        if failed {
            self.storage_errors.get_or_create(&labels).inc();
        }
    }

    /// Sets the sampled metrics from what a scrape read.
    pub fn record(&self, sample: &Sample) {
        let s = &self.sampled;
        s.slots.set(gauge_value(sample.slots));
        s.slots_in_use.set(gauge_value(sample.slots_in_use));
        if let Some(python) = &sample.python {
            let taking = python.workers.iter().filter(|w| w.takes_runs).count();
            let runs: u64 = python
                .workers
                .iter()
                .map(|w| u64::from(w.active_runs))
                .sum();
            s.python_workers.set(gauge_value(python.workers.len()));
            s.python_workers_taking_runs.set(gauge_value(taking));
            s.python_runs.set(i64::try_from(runs).unwrap_or(i64::MAX));
            let slots = python.workers.len() as u64 * u64::from(python.runs_per_worker);
            s.python_run_slots
                .set(i64::try_from(slots).unwrap_or(i64::MAX));
        }
        for pool in &sample.pools.pools {
            let in_use = pool.open.saturating_sub(pool.idle);
            for (state, value) in [("idle", pool.idle), ("in_use", in_use)] {
                let labels = PoolStateLabels {
                    pool: pool.name,
                    state,
                };
                s.db_connections.get_or_create(&labels).set(value.into());
            }
            let labels = PoolLabels { pool: pool.name };
            s.db_connections_max
                .get_or_create(&labels)
                .set(pool.max.into());
        }
        if let Some(queued) = sample.pools.writer_queue {
            s.writer_queue
                .get_or_create(&Vec::new())
                .set(gauge_value(queued));
        }
        match sample.queued {
            Some(queued) => {
                for (status, value) in [("pending", queued.pending), ("running", queued.running)] {
                    s.queue_runs
                        .get_or_create(&StatusLabels { status })
                        .set(value);
                }
            }
            None => {
                s.queue_count_failures.inc();
            }
        }
    }

    /// Every metric, in `format`.
    pub fn encode(&self, format: Format) -> String {
        let mut text = String::new();
        let encoded = match format {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, &self.registry)
            }
        };
        // Writing to a String does not fail, and the metrics encode whatever they hold.
        if let Err(err) = encoded {
            tracing::error!(error = %err, "cannot encode the metrics");
        }
        text
    }
}

impl Sampled {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "worker_slots",
            "Runs this process may execute at once (--workers)",
            self.slots.clone(),
        );
        registry.register(
            "worker_slots_in_use",
            "Slots of this process held by executing runs or by claims in progress",
            self.slots_in_use.clone(),
        );
        registry.register(
            "python_workers",
            "Python worker processes alive in this process's pool",
            self.python_workers.clone(),
        );
        registry.register(
            "python_workers_taking_runs",
            "Python workers that take new runs (healthy and not being recycled)",
            self.python_workers_taking_runs.clone(),
        );
        registry.register(
            "python_runs",
            "Runs executing on this process's Python workers",
            self.python_runs.clone(),
        );
        registry.register(
            "python_run_slots",
            "Runs this process's Python workers may execute at once (workers times runs per worker)",
            self.python_run_slots.clone(),
        );
        registry.register(
            "db_connections",
            "Open database connections of this process's pools, by pool and state (idle, in_use)",
            self.db_connections.clone(),
        );
        registry.register(
            "db_connections_max",
            "The most connections each pool opens",
            self.db_connections_max.clone(),
        );
        registry.register(
            "db_writer_queue",
            "Writes handed to SQLite's writer thread and not answered yet (queued, or in the transaction being committed); SQLite only",
            self.writer_queue.clone(),
        );
        registry.register(
            "queue_runs",
            "Runs of every process in the database's queue, by status (pending, running), counted at scrape time",
            self.queue_runs.clone(),
        );
        registry.register(
            "queue_count_failures",
            "Scrapes at which the queue's runs could not be counted in time (queue_runs then keeps its last values)",
            self.queue_count_failures.clone(),
        );
    }
}

/// What a scrape reads of the process.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub slots: usize,
    pub slots_in_use: usize,
    pub python: Option<PythonSample>,
    pub pools: PoolStats,
    /// `None` when the count failed or took too long.
    pub queued: Option<QueuedRuns>,
}

/// The Python worker pool, as a scrape reads it.
#[derive(Debug, Clone, Default)]
pub struct PythonSample {
    pub workers: Vec<WorkerState>,
    pub runs_per_worker: u32,
}

/// A run executing in this process: counted among its graph's executing runs until dropped.
pub struct RunMeters {
    metrics: Arc<Metrics>,
    labels: GraphLabels,
    executing: Gauge,
    started: Instant,
}

impl RunMeters {
    /// What the run's event pump records its first event with; `None` for a later attempt,
    /// whose creation is no measure of it.
    pub fn first_event(&self, run: &Run) -> Option<FirstEvent> {
        (run.attempt <= 1).then(|| FirstEvent {
            histogram: self.metrics.first_event.get_or_create_owned(&self.labels),
            ready_at: ready_at(run),
        })
    }

    /// The run ended with `status` (its end is committed).
    pub fn ended(&self, status: RunStatus) {
        let labels = RunEndLabels {
            graph: self.labels.graph.clone(),
            status: status.as_str(),
        };
        self.metrics.runs_ended.get_or_create(&labels).inc();
        self.metrics
            .run_duration
            .get_or_create(&self.labels)
            .observe(self.started.elapsed());
    }
}

impl Drop for RunMeters {
    fn drop(&mut self) {
        self.executing.dec();
    }
}

/// Records the latency of a run's first event, once.
pub struct FirstEvent {
    histogram: Histogram,
    ready_at: DateTime<Utc>,
}

impl FirstEvent {
    pub fn observe(self) {
        self.histogram.observe(since(self.ready_at));
    }
}

/// An open event stream, counted until dropped.
#[derive(Debug)]
pub struct OpenStream(Gauge);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// When a run could start: its creation, or `after_seconds` later.
fn ready_at(run: &Run) -> DateTime<Utc> {
    run.created_at.max(run.run_after)
}

fn since(at: DateTime<Utc>) -> Duration {
    (Utc::now() - at).to_std().unwrap_or_default()
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl RunWorkers {
    /// Reads what is sampled (slots, Python workers, pools, the queue's runs) and encodes
    /// every metric in `format`.
    pub async fn scrape_metrics(&self, format: Format) -> String {
        let (slots_in_use, slots) = self.slots();
        let python = self.python().map(|pool| PythonSample {
            workers: pool.workers(),
            runs_per_worker: pool.runs_per_worker(),
        });
        // The pools first: the count's own connection is not yet back in its pool after it.
        let pools = self.storage.pool_stats();
        let queued = tokio::time::timeout(QUEUE_COUNT_TIMEOUT, self.storage.count_queued_runs());
        let queued = match queued.await {
            Ok(Ok(queued)) => Some(queued),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "cannot count the queue's runs for /metrics");
                None
            }
            Err(_) => {
                tracing::warn!("counting the queue's runs for /metrics took too long");
                None
            }
        };
        let sample = Sample {
            slots,
            slots_in_use,
            python,
            pools,
            queued,
        };
        let metrics = self.metrics();
        metrics.record(&sample);
        metrics.encode(format)
    }
}

#[cfg(test)]
mod tests;
