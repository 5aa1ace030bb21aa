//! Workers: claim pending runs from the database, execute them, log their events, end them.
//!
//! Each process runs `concurrency` worker loops. A loop looks for a run to claim (a read), and
//! only then takes one of the process's slots and claims the run with a lease, executes its
//! graph while a companion task renews the lease (and notices cancel requests made by any
//! process), and ends the run in one transaction with its thread's new state. A loop sleeps
//! until woken by a new run in this process or until the poll interval passes (runs created by
//! other processes, `after_seconds`, leases of dead workers).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use spindle_graph::checkpoint::{Checkpointer, WriteReceipt};
use spindle_graph::pregel::{self, StateSnapshot};
use spindle_graph::stream::StreamEvent;
use spindle_graph::{EventSink, Graph, RunEnv, RunError, RunOutcome};
use spindle_storage::{
    Assistant, Claim, ClaimedRun, QueueOutlook, Run, RunEnd, RunStatus, Scope, Storage,
    StorageError, StorageResult, ThreadStateColumns, ThreadStatus,
};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::event_pump::{logged, pump_events, ProtocolLog};
use crate::execute::{keys, resumed, run_config, run_input, Resumed};
use crate::graphs::{GraphRegistry, LoadedGraph};
use crate::hub::{EndedRun, EventHub, HubMessage};
use crate::logged_saves::LoggedSaves;
use crate::metrics::Metrics;
use crate::python::pool::PythonPool;
use crate::store::{GraphStore, StoreConfig};
use crate::v2_events::{self, normalize, normalize::Normalizer};
use crate::webhook::{self, Webhooks};
use futures::FutureExt;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Runs this process executes at once.
    pub concurrency: usize,
    /// How long a claim holds without renewal; a run whose worker died is resumed after it.
    pub lease: Duration,
    /// Attempts before a run whose workers keep dying ends `error`.
    pub max_attempts: i32,
    /// How often an idle worker looks for runs it was not woken for.
    pub poll_interval: Duration,
    /// How long a stopping process lets its running runs finish before it hands them back
    /// ([`RunWorkers::drain`]).
    pub shutdown_grace: Duration,
    /// A run still executing after this long ends `timeout`.
    pub run_timeout: Option<Duration>,
    /// Logged events of ended runs are kept this long; `None` keeps them forever.
    pub event_retention: Option<Duration>,
    /// The long-term store's settings, for the store a run's nodes reach.
    pub store: StoreConfig,
    /// A failed Python run's traceback is printed as the lines a person reads after its
    /// `run failed` line (`dev`), rather than kept in one field of that line (`serve`: log
    /// tools keep a record whole only when it is one line).
    pub readable_tracebacks: bool,
}

/// How long a drain waits for the runs it cancelled to be handed back.
const HAND_BACK_WAIT: Duration = Duration::from_secs(10);

/// How often the event log is swept for events past their retention.
const RETENTION_SWEEP: Duration = Duration::from_secs(600);

/// How often a process relying on announcements looks at the queue while a run is pending
/// (`watch_due`): the longest a run can wait for an announcement that never came.
const PENDING_RECHECK: Duration = Duration::from_secs(2);

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            // A run is a task that mostly waits (for a model, a tool, a Python worker), so a
            // process holds many at little cost; a run created while every slot is busy is
            // queued in the database and claimed later, which costs the database about twice
            // as much. Measured on PostgreSQL, 64 clients: 660 runs/s with 16 slots, 1,009
            // with 64.
            concurrency: 64,
            lease: Duration::from_secs(30),
            max_attempts: 3,
            poll_interval: Duration::from_millis(500),
            shutdown_grace: Duration::from_secs(30),
            run_timeout: None,
            event_retention: Some(Duration::from_secs(7 * 24 * 3600)),
            store: StoreConfig::default(),
            readable_tracebacks: false,
        }
    }
}

/// `kwargs.temporary` of a stateless background run: nobody waits for it, so the worker
/// deletes its thread when it ends (`on_completion=delete`).
pub const CLEANUP_BY_WORKER: &str = "worker";

pub struct RunWorkers {
    pub(crate) storage: Arc<dyn Storage>,
    graphs: Arc<GraphRegistry>,
    hub: Arc<EventHub>,
    webhooks: Arc<Webhooks>,
    config: WorkerConfig,
    worker_id: String,
    wake: Notify,
    /// Whether every new claimable run is announced ([`crate::wakeups`]): idle loops then
    /// sleep until woken, and one task (`watch_due`) wakes them for what only time brings.
    announced: std::sync::atomic::AtomicBool,
    /// Wakes `watch_due` to look again when the next due time may have moved.
    due_changed: Notify,
    /// Cancelled when the process stops claiming runs ([`RunWorkers::drain`]).
    claiming: CancellationToken,
    /// Set once the drain's grace is over: runs cancelled from then on are handed back to
    /// the queue, not ended.
    handing_back: std::sync::atomic::AtomicBool,
    /// Cancelled when the stop may not wait any longer ([`RunWorkers::stop_now`]): the drain
    /// ends its grace at once.
    hurry: CancellationToken,
    /// One permit per run this process may execute at once, taken by the claim loops and by
    /// runs claimed at their creation alike.
    slots: Arc<Semaphore>,
    /// Cancel tokens of the runs executing in this process, for immediate local cancels.
    executing: Mutex<HashMap<Uuid, CancellationToken>>,
    /// The workers that run Python graphs, when the server has any.
    python: OnceLock<Arc<PythonPool>>,
    /// The process's metrics (runs, and whatever else records into them).
    metrics: Arc<Metrics>,
}

impl RunWorkers {
    pub fn new(
        storage: Arc<dyn Storage>,
        graphs: Arc<GraphRegistry>,
        hub: Arc<EventHub>,
        webhooks: Arc<Webhooks>,
        config: WorkerConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            storage,
            graphs,
            hub,
            webhooks,
            slots: Arc::new(Semaphore::new(config.concurrency.max(1))),
            config,
            worker_id: format!("{}-{}", std::process::id(), Uuid::new_v4().simple()),
            wake: Notify::new(),
            announced: std::sync::atomic::AtomicBool::new(false),
            due_changed: Notify::new(),
            claiming: CancellationToken::new(),
            handing_back: std::sync::atomic::AtomicBool::new(false),
            hurry: CancellationToken::new(),
            executing: Mutex::new(HashMap::new()),
            python: OnceLock::new(),
            metrics,
        }
    }

    /// The process's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// This process's run slots: (in use, total).
    pub fn slots(&self) -> (usize, usize) {
        let total = self.config.concurrency.max(1);
        (total.saturating_sub(self.slots.available_permits()), total)
    }

    /// The Python workers that run the registry's Python graphs (set once, at start-up).
    pub fn set_python(&self, pool: Arc<PythonPool>) {
        if self.python.set(pool).is_err() {
            tracing::warn!("the Python worker pool was set twice; keeping the first");
        }
    }

    /// The Python workers, when the server runs Python graphs.
    pub fn python(&self) -> Option<&Arc<PythonPool>> {
        self.python.get()
    }

    /// Starts the worker loops; they stop when `shutdown` is cancelled, or claim no more
    /// once the process drains ([`RunWorkers::drain`]).
    pub fn start(self: &Arc<Self>, shutdown: CancellationToken) {
        let claiming = self.claiming.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            claiming.cancel();
        });
        for _ in 0..self.config.concurrency.max(1) {
            let workers = self.clone();
            let claiming = self.claiming.clone();
            tokio::spawn(async move { workers.work(claiming).await });
        }
        if let Some(retention) = self.config.event_retention {
            tokio::spawn(super::retention::sweep_events(
                self.storage.clone(),
                retention,
                RETENTION_SWEEP,
                shutdown,
            ));
        }
    }

    /// A run was created: wake a sleeping worker.
    pub fn wake(&self) {
        self.wake.notify_one();
        self.due_changed.notify_one();
    }

    /// From now on every run that becomes claimable other than by time is announced
    /// ([`RunWorkers::wake`]), so idle loops stop polling; a task wakes them at the times a
    /// lease may run out or a delayed run comes due.
    pub fn set_announced(self: &Arc<Self>, shutdown: CancellationToken) {
        if !self
            .announced
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            tokio::spawn(self.clone().watch_due(shutdown));
        }
    }

    fn announced(&self) -> bool {
        self.announced.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Wakes a loop whenever a run may become claimable by time alone (a lease running out,
    /// a delayed run coming due), sleeping in between: with nothing active it reads nothing
    /// until a run is announced. While a run is pending it looks at least every
    /// [`PENDING_RECHECK`], so a run whose announcement went missing (a notification lost
    /// with its connection, a path that forgot one) waits seconds, not until the next one.
    async fn watch_due(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let wait = match self.storage.queue_outlook().await {
                Ok(outlook) => self.next_look(outlook),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read when runs come due; retrying");
                    Some(self.config.poll_interval)
                }
            };
            tokio::select! {
                () = crate::sleep_or_forever(wait) => self.wake.notify_one(),
                () = self.due_changed.notified() => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// How long `watch_due` may sleep after reading `outlook` (`None`: until woken), having
    /// woken a loop if a run is claimable now.
    fn next_look(&self, outlook: QueueOutlook) -> Option<Duration> {
        let wait = match outlook.due {
            // Claimable now: a loop is woken, and loops finishing a run look anyway; so while
            // every slot is busy this looks again only at the poll interval.
            Some(at) if at <= Utc::now() => {
                self.wake.notify_one();
                Some(self.config.poll_interval)
            }
            Some(at) => Some((at - Utc::now()).to_std().unwrap_or_default()),
            None => None,
        };
        match outlook.pending {
            true => Some(wait.map_or(PENDING_RECHECK, |wait| wait.min(PENDING_RECHECK))),
            false => wait,
        }
    }

    /// A free slot, if there is one, to offer a run being created: a run that can start now
    /// is then created claimed by this process ([`NewRun::claim`](spindle_storage::NewRun))
    /// and handed to [`RunWorkers::execute_now`], without waiting for a claim of its own.
    pub fn reserve(&self) -> Option<Slot> {
        if self.claiming.is_cancelled() {
            // Draining: runs created now wait in the queue for another process.
            return None;
        }
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        Some(Slot {
            _permit: permit,
            claim: Claim {
                worker_id: self.worker_id.clone(),
                lease: self.config.lease,
            },
        })
    }

    /// Executes a run created claimed with `slot`'s claim, in the background. `assistant` is
    /// the run's assistant as its creator just read it, so the worker need not read it again.
    pub fn execute_now(self: &Arc<Self>, slot: Slot, claimed: ClaimedRun, assistant: Assistant) {
        let workers = self.clone();
        tokio::spawn(async move {
            workers.execute(claimed, Some(assistant)).await;
            drop(slot);
        });
    }

    /// Stops the process's part in running runs, for a graceful shutdown: claims no more runs
    /// (runs created here from now on wait in the queue), lets those executing finish for
    /// up to the configured grace, then cancels the rest and hands them back to the queue,
    /// where another process resumes them from their last checkpoint at once instead of
    /// after their lease. Returns once no run executes here. [`RunWorkers::stop_now`] cuts
    /// the grace short.
    pub async fn drain(&self) {
        self.claiming.cancel();
        let left = tokio::select! {
            left = self.until_idle(self.config.shutdown_grace) => left,
            () = self.hurry.cancelled() => self.executing_count(),
        };
        if left == 0 {
            return;
        }
        match self.hurry.is_cancelled() {
            true => tracing::warn!(
                runs = left,
                "stopping now: handing the runs still executing back to the queue"
            ),
            false => tracing::warn!(
                runs = left,
                grace_secs = self.config.shutdown_grace.as_secs(),
                "runs still executing after the shutdown grace; handing them back to the queue"
            ),
        }
        self.handing_back
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let tokens: Vec<CancellationToken> = self
            .executing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for token in tokens {
            token.cancel();
        }
        // A cancelled run first waits for its saves (and a Python run for its worker's
        // grace): bounded, as the process is going away anyway.
        self.until_idle(HAND_BACK_WAIT).await;
    }

    /// Ends the drain's grace now (a second Ctrl-C): the runs still executing are handed back
    /// at once, to resume from their last checkpoint. Before a drain, the drain that follows
    /// has no grace.
    pub fn stop_now(&self) {
        self.hurry.cancel();
    }

    /// Resolves once [`RunWorkers::stop_now`] was called.
    pub async fn stopping_now(&self) {
        self.hurry.cancelled().await
    }

    /// Waits until no run executes here, for at most `within`; answers how many still do.
    async fn until_idle(&self, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = self.executing_count();
            if left == 0 || tokio::time::Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How long [`RunWorkers::drain`] lets running runs finish.
    pub fn shutdown_grace(&self) -> Duration {
        self.config.shutdown_grace
    }

    /// How many runs execute in this process now.
    pub fn executing_count(&self) -> usize {
        self.executing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether the run is executing in this process now.
    pub fn is_executing(&self, run_id: Uuid) -> bool {
        self.executing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&run_id)
    }

    /// Cancels runs executing in this process now (other processes see the database flag at
    /// their next lease renewal).
    pub fn cancel_local(&self, run_ids: &[Uuid]) {
        let executing = self.executing.lock().unwrap_or_else(|e| e.into_inner());
        for id in run_ids {
            if let Some(token) = executing.get(id) {
                token.cancel();
            }
        }
    }

    async fn work(self: Arc<Self>, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            // A look before a slot is taken: a slot held for a claim that finds nothing is one
            // a run being created cannot start in at once, and that run then waits for a claim.
            match self.storage.has_claimable_run().await {
                Ok(true) => {}
                Ok(false) => {
                    self.idle(&shutdown).await;
                    continue;
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot look for runs to claim; retrying");
                    tokio::time::sleep(self.config.poll_interval).await;
                    continue;
                }
            }
            // A free slot first: runs claimed at their creation hold slots too.
            let slot = tokio::select! {
                slot = self.slots.clone().acquire_owned() => slot,
                () = shutdown.cancelled() => return,
            };
            let Ok(slot) = slot else { return };
            let claimed = self
                .storage
                .claim_run(&self.worker_id, self.config.lease, self.config.max_attempts)
                .await;
            match claimed {
                // Straight back to looking afterwards: a loop sleeps only when it found
                // nothing, and each created run wakes one sleeper, so waking a sibling here
                // would only cost a look per run.
                Ok(Some(claimed)) => {
                    self.execute(claimed, None).await;
                    drop(slot);
                }
                // Another worker was quicker.
                Ok(None) => {
                    drop(slot);
                    self.idle(&shutdown).await;
                }
                Err(err) => {
                    drop(slot);
                    tracing::error!(error = %err, "cannot claim runs; retrying");
                    tokio::time::sleep(self.config.poll_interval).await;
                }
            }
        }
    }

    /// Waits for a created run's wake-up, the next poll (runs of other processes, delayed
    /// runs coming due, leases running out; unless those are announced) or the shutdown.
    async fn idle(&self, shutdown: &CancellationToken) {
        let poll = (!self.announced()).then_some(self.config.poll_interval);
        tokio::select! {
            () = self.wake.notified() => {}
            () = crate::sleep_or_forever(poll) => {}
            () = shutdown.cancelled() => {}
        }
    }

    async fn execute(&self, claimed: ClaimedRun, assistant: Option<Assistant>) {
        // Instrumented, not entered: a span guard held across `.await` would be entered on one
        // thread and left on another.
        let span = super::trace::run_span(&claimed.run);
        self.execute_in_span(&claimed, assistant)
            .instrument(span)
            .await;
    }

    async fn execute_in_span(&self, claimed: &ClaimedRun, assistant: Option<Assistant>) {
        let run = &claimed.run;
        let cancel = CancellationToken::new();
        self.executing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run.run_id, cancel.clone());
        let started = std::time::Instant::now();
        let result = self.execute_claimed(claimed, assistant, &cancel).await;
        self.executing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&run.run_id);
        match result {
            Ok(None) => {
                tracing::warn!("run handed back to the queue: it resumes from its last checkpoint");
                self.wake();
            }
            Ok(Some((status, ended))) => {
                tracing::info!(
                    status = status.as_str(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "run ended"
                );
                self.hub.publish(
                    run.thread_id,
                    HubMessage::RunEnded {
                        run_id: run.run_id,
                        status,
                        ended,
                    },
                );
            }
            // The end could not be written; the lease will expire and another worker (or this
            // one) resumes the run from its last checkpoint.
            Err(err) => {
                tracing::error!(error = %err, "cannot end run; it will be resumed after its lease expires")
            }
        }
    }

    async fn execute_claimed(
        &self,
        claimed: &ClaimedRun,
        assistant: Option<Assistant>,
        cancel: &CancellationToken,
    ) -> Result<Option<(RunStatus, Option<Arc<EndedRun>>)>, String> {
        let run = &claimed.run;
        let scope = Scope::new(run.user_id.clone().unwrap_or_default());
        // The engine's saves go through the event pump, which stores each with the events
        // emitted before it (see `logged_saves`).
        let (sink, events) = mpsc::channel::<StreamEvent>(1024);
        let sink = EventSink::from(sink);
        let (save_requests, saves) = mpsc::unbounded_channel();
        let checkpointer: Arc<dyn Checkpointer> = Arc::new(LoggedSaves::new(
            self.storage.checkpointer(),
            save_requests,
            sink.sent(),
        ));
        let prepared = self.prepare(run, &scope, assistant).await;
        // Every run logs its lifecycle (running, then its end) for the thread event stream,
        // named after its graph; a run started through the protocol logs the protocol's
        // events for what its graph streams as well (v2 events).
        let graph_name = prepared
            .as_ref()
            .ok()
            .map(|(assistant, _)| assistant.fields.graph_id.clone());
        let meters = self
            .metrics
            .run_started(graph_name.as_deref().unwrap_or_default(), run);
        let protocol_log = graph_name.clone().map(|graph_name| ProtocolLog {
            graph_name,
            normalizer: v2_events::is_v2_run(run).then(Normalizer::default),
        });
        // Why the run failed, set before the sink closes: the pump ends open messages with it.
        let failed = Arc::new(OnceLock::new());
        let pump = tokio::spawn(pump_events(
            self.storage.clone(),
            self.hub.clone(),
            claimed.clone(),
            events,
            saves,
            protocol_log,
            failed.clone(),
            meters.first_event(run),
        ));
        let renewal = tokio::spawn(renew_lease(
            self.storage.clone(),
            run.run_id,
            self.worker_id.clone(),
            self.config.lease,
            cancel.clone(),
        ));

        let mut ran = match &prepared {
            Ok((assistant, Executable::Engine(graph))) => {
                let env = RunEnv {
                    checkpointer: Some(checkpointer.clone()),
                    store: Some(Arc::new(GraphStore::new(
                        self.storage.clone(),
                        self.config.store.clone(),
                        scope.clone(),
                    ))),
                    sink: Some(sink.clone()),
                    cancel: cancel.clone(),
                };
                self.run_engine(claimed, assistant, graph, env).await
            }
            Ok((assistant, Executable::Python)) => {
                let route = crate::python::executor::RunRoute {
                    sink: sink.clone(),
                    saves: checkpointer.clone(),
                    scope: scope.clone(),
                };
                self.run_python(claimed, assistant, route, cancel).await
            }
            Err(msg) => Ran::NotStarted(Failure::Setup(msg.clone())),
        };
        if self.handing_back.load(std::sync::atomic::Ordering::SeqCst)
            && cancel.is_cancelled()
            && matches!(ran.failure(), Some(Failure::Run(RunError::Cancelled)))
        {
            ran = Ran::HandedBack("this process is shutting down".to_owned());
        }
        let failure = ran.failure();
        let timed_out =
            matches!(failure, Some(Failure::Run(RunError::Cancelled))) && !cancel.is_cancelled();
        // The run's `error` event (the error its end records); a cancel the caller asked for
        // is not one.
        let error = match failure {
            Some(Failure::Run(RunError::Cancelled)) if timed_out => Some(timeout_error()),
            Some(Failure::Run(RunError::Cancelled)) => None,
            Some(failure) => Some(failure.body()),
            None => None,
        };
        if let Some(body) = &error {
            let readable = self.config.readable_tracebacks;
            log_failure(run, graph_name.as_deref(), failure, body, readable);
            let message = body["message"].as_str().unwrap_or_default();
            let _ = failed.set(message.to_owned());
        }
        drop(sink);
        renewal.abort();
        let mut tail = pump.await.map_err(|e| e.to_string())??;
        if let Ran::HandedBack(why) = &ran {
            // As after a crash: the events after the last save are dropped (the next attempt
            // runs that step again, and tells of it again), and the run is claimable at once.
            tracing::warn!(reason = %why, "the run stopped before its end");
            tail.publisher.finish().await;
            self.release(run.run_id).await;
            return Ok(None);
        }
        // The run's last events, and those that tell of its end, reach live followers once
        // the end is committed, as every event once logged: a client that reads the thread's
        // state on `lifecycle completed` must find the run's last checkpoint there.
        let mut ending = Vec::new();
        if let Some(body) = error {
            tail.seq += 1;
            ending.push(logged(run, tail.seq, "error".into(), body));
        }

        let (columns, checkpoint) = match &ran {
            Ran::Engine {
                outcome: Ok(done), ..
            } if done.next.is_empty() && done.interrupts.is_empty() => finished_state(done),
            Ran::Engine { graph, .. } => {
                let snapshot = latest_state(graph, checkpointer.as_ref(), run).await;
                let checkpoint = snapshot
                    .as_ref()
                    .map(|s| s.checkpoint.checkpoint_id.clone());
                (
                    snapshot.as_ref().map(crate::threads::state_columns),
                    checkpoint,
                )
            }
            Ran::Python { columns, .. } => (columns.clone(), None),
            Ran::NotStarted(_) | Ran::HandedBack(_) => (None, None),
        };
        let mut end = run_end(ran.failure(), timed_out, columns);
        let saves = ran.take_saves();
        if let Some(graph) = &graph_name {
            // The run's lifecycle end, committed with the run's end.
            let (name, data) = normalize::terminal(
                graph,
                end.status,
                end.thread_status,
                end.error.as_ref(),
                checkpoint.as_deref(),
            );
            tail.seq += 1;
            ending.push(logged(run, tail.seq, name, data));
        }
        tail.events.extend(ending);
        let ending = tail.events.clone();
        end.events = tail.events;
        if saves.is_some() {
            // The end goes to the writer right behind the run's last saves, not after their
            // commit (one wait for the database instead of two), and only holds if they did.
            end.after_checkpoint = checkpoint;
        }
        let status = end.status;
        let webhook = run.kwargs.get(keys::WEBHOOK).and_then(Value::as_str);
        let final_values = webhook.and(end.thread_values.clone());
        // Kept for whoever follows the thread here (a waiter), who then needs no read.
        let followed = self
            .hub
            .is_followed(run.thread_id)
            .then(|| (end.thread_values.clone(), end.thread_interrupts.clone()));
        let ended = self
            .storage
            .finish_run(run.thread_id, run.run_id, &self.worker_id, end)
            .await;
        let ended = behind_saves(ended, saves).await;
        // A rolled-back run's events went with it.
        let logged = matches!(ended, Ok(Some(_)));
        if ended.is_ok() {
            // Counted before anyone following the run learns of its end.
            meters.ended(status);
        }
        tail.publisher
            .after(futures::future::ready(logged).boxed().shared(), ending);
        tail.publisher.finish().await;
        let ended = ended.map_err(|e| e.to_string())?;
        let announced = match (followed, &ended) {
            (Some((thread_values, thread_interrupts)), Some(run)) => Some(Arc::new(EndedRun {
                run: run.clone(),
                thread_values,
                thread_interrupts,
            })),
            _ => None,
        };
        if let Some(url) = webhook {
            self.send_webhook(run, ended, final_values, url);
        }
        if run.kwargs.get(keys::TEMPORARY).and_then(Value::as_str) == Some(CLEANUP_BY_WORKER) {
            if let Err(err) =
                crate::threads::delete_thread(self.storage.as_ref(), &scope, run.thread_id).await
            {
                tracing::warn!(error = %err, "cannot delete the stateless run's thread");
            }
        }
        Ok(Some((status, announced)))
    }

    /// Sends the run's end to its webhook in the background, once the end is committed: a
    /// slow or absent receiver never holds up the run or its worker.
    fn send_webhook(&self, claimed: &Run, ended: Option<Run>, values: Option<Value>, url: &str) {
        let payload = match &ended {
            Some(run) => webhook::run_payload(run, values),
            // A rolled-back run was deleted at its creator's request; the receiver still learns
            // that it is over, with the status the reference server sends for it.
            None => webhook::rollback_payload(claimed, Utc::now()),
        };
        self.webhooks.spawn(payload, url.to_owned(), claimed.run_id);
    }

    /// The run's assistant (read, unless its creator handed it over) and the graph it
    /// executes.
    async fn prepare(
        &self,
        run: &Run,
        scope: &Scope,
        known: Option<Assistant>,
    ) -> Result<(Assistant, Executable), String> {
        let assistant = match known {
            Some(assistant) => assistant,
            None => self
                .storage
                .get_assistant(scope, run.assistant_id)
                .await
                .map_err(|e| format!("assistant {}: {e}", run.assistant_id))?,
        };
        let graph_id = &assistant.fields.graph_id;
        let executable = match self.graphs.loaded(graph_id) {
            Some(LoadedGraph::Engine(graph)) => Executable::Engine(graph),
            Some(LoadedGraph::Python(_)) => Executable::Python,
            None => return Err(format!("graph '{graph_id}' is not loaded in this server")),
        };
        Ok((assistant, executable))
    }

    /// Runs a graph file's graph on Spindle's engine.
    async fn run_engine(
        &self,
        claimed: &ClaimedRun,
        assistant: &Assistant,
        graph: &Arc<Graph>,
        env: RunEnv,
    ) -> Ran {
        let run = &claimed.run;
        let checkpointer = env.checkpointer.clone();
        let resumed = match &checkpointer {
            Some(checkpointer) => resumed_from(checkpointer.as_ref(), run).await,
            None => Resumed::No,
        };
        let input = run_input(&run.kwargs, resumed);
        let mut config = run_config(run, assistant);
        config.new_thread = claimed.thread_is_new;
        if resumed == Resumed::FromItsCheckpoint {
            // A fork was made by the first attempt; go on from where it got to.
            config.checkpoint_id = None;
        }
        let future = pregel::run_leaving_saves(graph, input, config, env);
        let result = match self.config.run_timeout {
            Some(limit) => tokio::time::timeout(limit, future)
                .await
                .unwrap_or(Err(RunError::Cancelled)),
            None => future.await,
        };
        let (outcome, saves) = match result {
            Ok((done, saves)) => (Ok(done), saves),
            Err(e) => (Err(Failure::from(e)), None),
        };
        Ran::Engine {
            graph: graph.clone(),
            outcome,
            saves,
        }
    }

    /// Runs a Python graph on a worker of the pool.
    async fn run_python(
        &self,
        claimed: &ClaimedRun,
        assistant: &Assistant,
        route: crate::python::executor::RunRoute,
        cancel: &CancellationToken,
    ) -> Ran {
        use crate::python::executor::{self, PythonEnd};
        let Some(pool) = self.python.get() else {
            return Ran::NotStarted(Failure::Setup(
                "this server has no Python workers to run a Python graph".into(),
            ));
        };
        let run = &claimed.run;
        let resumed = resumed_from(route.saves.as_ref(), run).await;
        let start = crate::python::start::start_run(run, assistant, resumed);
        // A time limit stops the run as a cancel does; `cancel` itself stays unset, which is
        // how the end tells a timeout from a cancel request.
        let stop = cancel.child_token();
        let _timer = self.config.run_timeout.map(|limit| {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(limit).await;
                stop.cancel();
            })
            .abort_handle()
        });
        let key = (run.run_id, run.attempt);
        let end = executor::execute(pool, key, start, route, &stop).await;
        if let Some(timer) = _timer {
            timer.abort();
        }
        match end {
            PythonEnd::Done(done) => python_ran(done),
            PythonEnd::CancelUnconfirmed => Ran::Python {
                outcome: Err(Failure::Run(RunError::Cancelled)),
                // Its worker did not say where the run stopped: the thread's state as saved,
                // read through another worker.
                columns: python_thread_columns(pool, &assistant.fields.graph_id, run).await,
            },
            PythonEnd::WorkerLost(why) => Ran::HandedBack(why),
            PythonEnd::Refused(body) => Ran::NotStarted(Failure::Worker {
                body,
                traceback: None,
                summary: None,
                node: None,
            }),
        }
    }

    /// Gives up this process's claim on a run so that a claim loop takes it at once, as
    /// its next attempt (a lease that ends now is one any worker may take over).
    async fn release(&self, run_id: Uuid) {
        if let Err(err) = self.storage.hand_back_run(run_id, &self.worker_id).await {
            tracing::warn!(error = %err, "cannot hand the run back; it is resumed once its lease expires");
        }
    }
}

/// How long the end of a run whose cancel its worker did not confirm waits to read the
/// thread's state through another worker.
const UNCONFIRMED_STATE_WAIT: Duration = Duration::from_secs(5);

/// A Python graph's thread columns, as a worker reads its latest checkpoint; `None` when no
/// worker answers in time (the thread then shows no values until its next run or update).
async fn python_thread_columns(
    pool: &Arc<crate::python::pool::PythonPool>,
    graph_id: &str,
    run: &Run,
) -> Option<ThreadStateColumns> {
    use crate::python::reads;
    let at = reads::At {
        thread_id: run.thread_id.to_string(),
        ..Default::default()
    };
    match tokio::time::timeout(
        UNCONFIRMED_STATE_WAIT,
        reads::state(pool, graph_id, &at, false),
    )
    .await
    {
        Ok(Ok(state)) => Some(reads::columns_of(&state)),
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot read the cancelled run's thread state");
            None
        }
        Err(_) => {
            tracing::warn!("no Python worker read the cancelled run's thread state in time");
            None
        }
    }
}

/// What a run executes.
enum Executable {
    /// A graph file's graph, on Spindle's engine.
    Engine(Arc<Graph>),
    /// A Python graph, on a worker of the pool.
    Python,
}

/// How a run's execution went, whichever executor ran it.
enum Ran {
    Engine {
        graph: Arc<Graph>,
        outcome: Result<RunOutcome, Failure>,
        /// Saves the engine left queued when the run went to its end.
        saves: Option<WriteReceipt>,
    },
    Python {
        outcome: Result<(), Failure>,
        /// The thread's state after the run, as the worker read it.
        columns: Option<ThreadStateColumns>,
    },
    /// The run could not start (its assistant or graph is gone).
    NotStarted(Failure),
    /// Its worker died with it: back to the queue, to resume from its last checkpoint.
    HandedBack(String),
}

impl Ran {
    fn failure(&self) -> Option<&Failure> {
        match self {
            Ran::Engine { outcome, .. } => outcome.as_ref().err(),
            Ran::Python { outcome, .. } => outcome.as_ref().err(),
            Ran::NotStarted(failure) => Some(failure),
            Ran::HandedBack(_) => None,
        }
    }

    fn take_saves(&mut self) -> Option<WriteReceipt> {
        match self {
            Ran::Engine { saves, .. } => saves.take(),
            _ => None,
        }
    }
}

/// A Python run's end as the worker reported it.
fn python_ran(done: crate::python::calls::RunDone) -> Ran {
    let columns = done
        .final_state
        .as_ref()
        .and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok())
        .map(final_columns);
    let outcome = match done.status.as_str() {
        "success" | "interrupted" => Ok(()),
        "cancelled" => Err(Failure::Run(RunError::Cancelled)),
        _ => Err(Failure::Worker {
            body: done.error.unwrap_or_else(
                || json!({"error": "WorkerError", "message": format!("the run ended {}", done.status)}),
            ),
            traceback: done.traceback,
            summary: done.summary,
            node: done.node,
        }),
    };
    Ran::Python { outcome, columns }
}

/// The thread's columns from a worker's `final`: `{values, next, interrupts}`.
fn final_columns(state: Value) -> ThreadStateColumns {
    let next = state["next"].as_array().is_some_and(|n| !n.is_empty());
    ThreadStateColumns {
        status: if next {
            ThreadStatus::Interrupted
        } else {
            ThreadStatus::Idle
        },
        values: Some(state["values"].clone()),
        interrupts: state["interrupts"].as_object().cloned().unwrap_or_default(),
    }
}

/// A slot of this process's run concurrency, reserved for a run being created, with the claim
/// that run is created with when it can start at once.
pub struct Slot {
    /// Given back when the slot is dropped, after the run.
    _permit: OwnedSemaphorePermit,
    pub claim: Claim,
}

/// Why a run did not finish normally.
enum Failure {
    Run(RunError),
    /// The run could not start (its assistant or graph is gone).
    Setup(String),
    /// A Python worker's `{error, message}`: the exception the graph raised (with the
    /// traceback and the node the worker sent), or why the worker could not run it.
    Worker {
        body: Value,
        traceback: Option<String>,
        /// The exception's class and message and those it came from (`run.done.summary`).
        summary: Option<String>,
        node: Option<String>,
    },
}

impl From<RunError> for Failure {
    fn from(e: RunError) -> Self {
        Failure::Run(e)
    }
}

impl Failure {
    fn body(&self) -> Value {
        match self {
            Failure::Run(e) => {
                let mut body = json!({"error": e.class(), "message": e.message()});
                // Where it failed goes beside the message (which the node chose, and clients
                // compare), as a field of its own.
                if let Some(location) = e.location() {
                    body["location"] = json!(location);
                }
                body
            }
            Failure::Setup(msg) => json!({"error": "RunSetupError", "message": msg}),
            Failure::Worker { body, .. } => body.clone(),
        }
    }

    /// The node the run failed in, when known: the engine's failed task, or the node a
    /// Python worker named.
    fn node(&self) -> Option<&str> {
        match self {
            Failure::Run(e) => e.node(),
            Failure::Worker { node, .. } => node.as_deref(),
            Failure::Setup(_) => None,
        }
    }
}

/// The one line an operator reads about a run that ended in error (a node's failure, a time
/// limit, a run that could not start): first what failed (the exception's class and message,
/// and for a Python graph the exceptions it came from), then which run, thread, graph and
/// node, the error as the run's client reads it (`body`), and a Python graph's traceback:
/// with `readable_traceback` as its own lines after the fields, for a person at a terminal,
/// else a field of the line with its newlines escaped, one record for log tools.
fn log_failure(
    run: &Run,
    graph: Option<&str>,
    failure: Option<&Failure>,
    body: &Value,
    readable_traceback: bool,
) {
    let (traceback, summary) = match failure {
        Some(Failure::Worker {
            traceback, summary, ..
        }) => (traceback.as_deref(), summary.as_deref()),
        _ => (None, None),
    };
    let error = body["error"].as_str().unwrap_or("Error");
    // Not `message`: that name is the event's own text in tracing's output.
    let error_message = body["message"].as_str().unwrap_or_default();
    let summary = summary.map_or_else(|| format!("{error}: {error_message}"), str::to_owned);
    let traceback = traceback.map(|tb| match readable_traceback {
        true => tracing::field::display(TracebackText::Lines(tb)),
        false => tracing::field::display(TracebackText::Escaped(tb)),
    });
    tracing::warn!(
        run_id = %run.run_id,
        thread_id = %run.thread_id,
        assistant_id = %run.assistant_id,
        graph = graph.unwrap_or("-"),
        node = failure.and_then(Failure::node).unwrap_or("-"),
        error,
        error_message,
        location = body["location"].as_str(),
        traceback,
        "run failed: {summary}"
    );
}

/// A traceback as a field's value: escaped into one line (quoted, as tracing shows text), or
/// its own lines, starting on the line after the record's fields.
enum TracebackText<'a> {
    Escaped(&'a str),
    Lines(&'a str),
}

impl std::fmt::Display for TracebackText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TracebackText::Escaped(tb) => write!(f, "{tb:?}"),
            TracebackText::Lines(tb) => write!(f, "\n{}", tb.trim_end()),
        }
    }
}

/// The run's status and its thread's new state, as api-facts describes: the thread is `error`
/// if the run raised, else `interrupted` when the checkpoint has next nodes, else `idle`.
fn run_end(
    failure: Option<&Failure>,
    timed_out: bool,
    columns: Option<ThreadStateColumns>,
) -> RunEnd {
    let idle_or_interrupted = columns.as_ref().map_or(ThreadStatus::Idle, |c| c.status);
    let (thread_values, thread_interrupts) = columns
        .map(|c| (c.values, c.interrupts))
        .unwrap_or_default();
    let (status, error, thread_status) = match failure {
        None => (RunStatus::Success, None, idle_or_interrupted),
        Some(Failure::Run(RunError::Cancelled)) if timed_out => (
            RunStatus::Timeout,
            Some(timeout_error()),
            ThreadStatus::Error,
        ),
        Some(Failure::Run(RunError::Cancelled)) => {
            (RunStatus::Interrupted, None, idle_or_interrupted)
        }
        Some(failure) => (RunStatus::Error, Some(failure.body()), ThreadStatus::Error),
    };
    RunEnd {
        status,
        error,
        thread_status,
        thread_values,
        thread_interrupts,
        events: Vec::new(),
        after_checkpoint: None,
    }
}

/// What a run stopped at its time limit ends with, in its `error` event and its record.
fn timeout_error() -> Value {
    json!({"error": "TimeoutError", "message": "the run exceeded its time limit"})
}

/// The outcome of a run's end written behind the saves the engine left queued (by then they
/// are done: the database applies writes in order). A refused end is explained by the save
/// that failed; the run is then resumed from its last stored checkpoint once its lease
/// expires, as after a crash.
async fn behind_saves(
    ended: StorageResult<Option<Run>>,
    saves: Option<WriteReceipt>,
) -> StorageResult<Option<Run>> {
    let Some(saves) = saves else {
        return ended;
    };
    match (saves.await, ended) {
        (Err(save), Err(_)) => Err(StorageError::Checkpoint(format!(
            "saving the run's last steps failed: {save}"
        ))),
        // Only a batch of pending writes without a checkpoint can fail unseen by the end's
        // condition: the step they belong to is saved, but its history lacks them.
        (Err(save), Ok(ended)) => {
            tracing::error!(error = %save, "a save of the run failed after its end was written");
            Ok(ended)
        }
        (Ok(()), ended) => ended,
    }
}

/// How far the earlier attempts of `run` got (a read only for a later attempt). When the
/// checkpoint cannot be read, the run continues from whatever is there, as it always did.
async fn resumed_from(checkpointer: &dyn Checkpointer, run: &Run) -> Resumed {
    if run.attempt <= 1 {
        return Resumed::No;
    }
    let thread_id = run.thread_id.to_string();
    let how = match checkpointer.get_tuple(&thread_id, "", None).await {
        Ok(latest) => resumed(
            run.attempt,
            run.run_id,
            latest.as_ref().map(|t| &t.metadata),
        ),
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the checkpoint a resumed run starts from");
            Resumed::FromItsCheckpoint
        }
    };
    log_resumed(how);
    how
}

/// Says that a run is taken up again (its earlier attempt's process stopped, handed it back
/// or died), and from where: otherwise a restarted server calls a run's model again with no
/// word of why. In the run's span, which names the run and its thread.
fn log_resumed(how: Resumed) {
    match how {
        Resumed::FromItsCheckpoint => tracing::info!(
            "resuming the run from its last checkpoint (its earlier attempt was interrupted)"
        ),
        Resumed::BeforeItsCheckpoint => tracing::info!(
            "starting the run again from its input (its earlier attempt was interrupted before \
             its first checkpoint)"
        ),
        Resumed::No => {}
    }
}

/// The thread's columns after a run that went to its end, from the engine's final state:
/// what a read of the latest checkpoint would give (nothing is next, so no task and no
/// interrupt; the values are the output channels), without that read.
fn finished_state(done: &RunOutcome) -> (Option<ThreadStateColumns>, Option<String>) {
    let columns = ThreadStateColumns {
        status: ThreadStatus::Idle,
        values: Some(done.values.clone()),
        interrupts: Default::default(),
    };
    let checkpoint = done.checkpoint.as_ref().map(|c| c.checkpoint_id.clone());
    (Some(columns), checkpoint)
}

async fn latest_state(
    graph: &Graph,
    checkpointer: &dyn Checkpointer,
    run: &Run,
) -> Option<StateSnapshot> {
    match pregel::get_state(graph, checkpointer, run.thread_id.as_str(), "", None).await {
        Ok(snapshot) => snapshot,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the thread's state after the run");
            None
        }
    }
}

/// Renews the run's lease until aborted; cancels the run when the lease is lost or someone
/// asked it to stop.
async fn renew_lease(
    storage: Arc<dyn Storage>,
    run_id: Uuid,
    worker_id: String,
    lease: Duration,
    cancel: CancellationToken,
) {
    let every = lease / 3;
    loop {
        tokio::time::sleep(every).await;
        match storage.renew_lease(run_id, &worker_id, lease).await {
            Ok(Some(run)) if run.cancel.is_some() => cancel.cancel(),
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!(%run_id, "lost the run's lease; stopping it");
                cancel.cancel();
                return;
            }
            Err(err) => tracing::warn!(%run_id, error = %err, "cannot renew the run's lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use spindle_graph::checkpoint::{CheckpointError, InMemoryCheckpointer};
    use spindle_graph::{examples, Durability, RunConfig, RunEnv, RunInput};

    use super::*;

    /// A run that went to its end sets its thread's columns from the engine's final state;
    /// they must be what reading the thread's latest checkpoint gives, for every durability,
    /// with fan-out, subgraphs and list channels.
    #[tokio::test]
    async fn a_finished_runs_state_is_what_its_latest_checkpoint_reads() {
        let cases = [
            ("chain", json!({"n": 1})),
            ("fanout", json!({"items": ["a", "b", "c"]})),
            (
                "nested",
                json!({"messages": [{"type": "human", "content": "hi"}]}),
            ),
            (
                "echo",
                json!({"messages": [{"type": "human", "content": "hi"}]}),
            ),
        ];
        for (graph_id, input) in cases {
            for durability in [Durability::Sync, Durability::Async, Durability::Exit] {
                let graph = Arc::new(examples::get(graph_id).unwrap().unwrap());
                let saver = Arc::new(InMemoryCheckpointer::new());
                let thread = "thread";
                for turn in 0..2 {
                    let config = RunConfig {
                        thread_id: Some(thread.to_owned()),
                        durability,
                        ..Default::default()
                    };
                    let env = RunEnv {
                        checkpointer: Some(saver.clone()),
                        ..Default::default()
                    };
                    let input = RunInput::Values(input.clone());
                    let done = pregel::run(&graph, input, config, env).await.unwrap();
                    let case = format!("{graph_id}, {durability:?}, turn {turn}");
                    assert!(done.next.is_empty() && done.interrupts.is_empty(), "{case}");
                    let snapshot = pregel::get_state(&graph, saver.as_ref(), thread, "", None)
                        .await
                        .unwrap()
                        .unwrap();
                    let (columns, checkpoint) = finished_state(&done);
                    assert_eq!(
                        columns,
                        Some(crate::threads::state_columns(&snapshot)),
                        "{case}"
                    );
                    assert_eq!(
                        checkpoint,
                        Some(snapshot.checkpoint.checkpoint_id),
                        "{case}"
                    );
                }
            }
        }
    }

    /// A run's end written behind its saves: when it is refused (its checkpoint is not
    /// stored), the error names the save that failed; a refusal for another reason stays
    /// that reason.
    #[tokio::test]
    async fn a_refused_end_behind_saves_is_explained_by_the_save_that_failed() {
        let failed: WriteReceipt =
            Box::pin(async { Err(CheckpointError::Backend("disk I/O error".into())) });
        let refused = Err(StorageError::Checkpoint("not stored".into()));
        let explained = behind_saves(refused, Some(failed)).await.unwrap_err();
        assert!(
            explained.to_string().contains("disk I/O error"),
            "{explained}"
        );

        let saved: WriteReceipt = Box::pin(async { Ok(()) });
        let lost = behind_saves(Err(StorageError::NotFound("run")), Some(saved)).await;
        assert!(
            matches!(lost, Err(StorageError::NotFound("run"))),
            "{lost:?}"
        );
    }
}
