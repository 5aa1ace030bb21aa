//! The pool of Python workers a server runs its Python graphs on, and their supervision.
//!
//! Each worker executes up to `runs_per_worker` runs at once; a run goes to the worker with
//! the fewest. The supervisor pings every worker (every 10 s by default); one that misses 3 in
//! a row (its event loop is blocked) gets no new runs until it answers again. A worker that
//! exits is replaced at once (with a growing pause when replacements keep dying at start); the
//! runs it had are handed back by their executors (see `executor`). A worker that has started
//! `recycle_after_runs` runs, or whose memory passed `max_rss_bytes`, is recycled: it takes no
//! new runs, a replacement starts, and it is closed once its last run ends.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::calls::SpindleCalls;
use super::process::{InitReport, SpawnError, WorkerError, WorkerProcess, WorkerSpec};

/// The longest pause between attempts to replace a worker that keeps dying at start.
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(30);
/// How long a worker may take to close when the server stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How the pool starts its workers.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub python: PathBuf,
    pub project_dir: PathBuf,
    /// The config's `env`, for the workers' environment.
    pub env: BTreeMap<String, String>,
    /// Graph id -> `./path/file.py:name` or `package.module:name`.
    pub graphs: BTreeMap<String, String>,
    /// LangGraph's custom auth, `./auth.py:auth`, loaded by every worker.
    pub auth: Option<String>,
    pub workers: usize,
    pub runs_per_worker: u32,
    /// A worker is replaced after starting this many runs (`None`: never).
    pub recycle_after_runs: Option<u64>,
    /// A worker is replaced once its memory (as its pings report it) passes this.
    pub max_rss_bytes: Option<u64>,
    /// How often each worker is pinged, and how many missed pings in a row mean its event
    /// loop is blocked.
    pub ping_every: Duration,
    pub missed_pings: u32,
}

impl PoolSettings {
    /// How often workers are pinged unless set.
    pub const PING_EVERY: Duration = Duration::from_secs(10);
    /// Missed pings in a row before a worker gets no new runs, unless set.
    pub const MISSED_PINGS: u32 = 3;
}

/// Why the pool could not start.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("the Python worker did not load the graphs: {0}")]
    Init(#[from] WorkerError),
}

/// One worker of the pool.
pub struct PoolWorker {
    process: WorkerProcess,
    /// Runs it executes now.
    active: AtomicU32,
    /// Runs it was given since it started.
    started_runs: AtomicU64,
    /// Answers its pings (a blocked event loop does not).
    healthy: AtomicBool,
    /// Being recycled: no new runs; closed once its last run ends.
    retiring: AtomicBool,
}

impl PoolWorker {
    pub fn process(&self) -> &WorkerProcess {
        &self.process
    }

    fn takes_runs(&self) -> bool {
        self.healthy.load(Ordering::Acquire) && !self.retiring.load(Ordering::Acquire)
    }
}

/// A worker of the pool at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerState {
    pub pid: Option<u32>,
    pub active_runs: u32,
    /// Healthy and not being recycled.
    pub takes_runs: bool,
}

/// A run's place on a worker; given back when dropped.
pub struct RunSlot {
    pub worker: Arc<PoolWorker>,
    pool: Arc<PythonPool>,
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        let left = self.worker.active.fetch_sub(1, Ordering::AcqRel) - 1;
        if left == 0 && self.worker.retiring.load(Ordering::Acquire) {
            self.worker.process.close();
        }
        self.pool.changed.notify_waiters();
    }
}

pub struct PythonPool {
    settings: PoolSettings,
    calls: Arc<SpindleCalls>,
    workers: Mutex<Vec<Arc<PoolWorker>>>,
    /// A slot was freed or a worker came (back).
    changed: Notify,
    started: AtomicUsize,
    /// Set by `supervise`: replacements are watched until it is cancelled.
    shutdown: std::sync::OnceLock<CancellationToken>,
}

impl PythonPool {
    /// Starts the workers and loads the graphs in each; the first worker's report says how
    /// each graph loaded (every worker loads the same files).
    pub async fn start(
        settings: PoolSettings,
        calls: Arc<SpindleCalls>,
    ) -> Result<(Arc<PythonPool>, InitReport), PoolError> {
        let pool = Arc::new(PythonPool {
            settings,
            calls,
            workers: Mutex::new(Vec::new()),
            changed: Notify::new(),
            started: AtomicUsize::new(0),
            shutdown: std::sync::OnceLock::new(),
        });
        let mut report = None;
        for _ in 0..pool.settings.workers.max(1) {
            let (worker, init) = pool.spawn_worker().await?;
            report.get_or_insert(init);
            pool.lock().push(worker);
        }
        let report = report.expect("at least one worker");
        Ok((pool, report))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PoolWorker>>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn spawn_worker(&self) -> Result<(Arc<PoolWorker>, InitReport), PoolError> {
        let n = self.started.fetch_add(1, Ordering::Relaxed) + 1;
        let spec = WorkerSpec {
            name: format!("python-{n}"),
            python: self.settings.python.clone(),
            project_dir: self.settings.project_dir.clone(),
            env: self.settings.env.clone(),
            max_runs: self.settings.runs_per_worker,
        };
        let process = WorkerProcess::spawn(spec, self.calls.clone())?;
        let report = process
            .init_project(&self.settings.graphs, self.settings.auth.as_deref())
            .await?;
        let worker = Arc::new(PoolWorker {
            process,
            active: AtomicU32::new(0),
            started_runs: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            retiring: AtomicBool::new(false),
        });
        Ok((worker, report))
    }

    /// Supervises the workers until `shutdown`: pings them, replaces those that exit, and
    /// closes them all at the end.
    pub fn supervise(self: &Arc<Self>, shutdown: CancellationToken) {
        let _ = self.shutdown.set(shutdown.clone());
        let workers: Vec<Arc<PoolWorker>> = self.lock().clone();
        for worker in workers {
            self.watch(worker, shutdown.clone());
        }
        let pool = self.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            let workers: Vec<Arc<PoolWorker>> = std::mem::take(&mut *pool.lock());
            for worker in workers {
                worker.process.close();
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, worker.process.exited()).await;
            }
        });
    }

    /// Pings `worker` while it lives; replaces it once it exits.
    fn watch(self: &Arc<Self>, worker: Arc<PoolWorker>, shutdown: CancellationToken) {
        let pool = self.clone();
        tokio::spawn(async move {
            let exit = tokio::select! {
                exit = worker.process.exited() => exit,
                () = pool.ping_until_exit(&worker) => return,
                () = shutdown.cancelled() => return,
            };
            let was_listed = pool.forget(&worker);
            if worker.retiring.load(Ordering::Acquire) {
                tracing::info!(worker = %worker.process.name(), %exit, "recycled Python worker closed");
                return;
            }
            tracing::error!(worker = %worker.process.name(), %exit, "Python worker died; its runs are handed back and a new worker starts");
            if was_listed {
                pool.replace(shutdown).await;
            }
        });
    }

    /// Takes the worker out of the pool; false when it was not in it any more.
    fn forget(&self, worker: &Arc<PoolWorker>) -> bool {
        let mut workers = self.lock();
        let before = workers.len();
        workers.retain(|w| !Arc::ptr_eq(w, worker));
        let removed = workers.len() < before;
        drop(workers);
        self.changed.notify_waiters();
        removed
    }

    /// Recycles a worker: no new runs, a replacement starts now, and it is closed once its
    /// last run ends (at once when it has none).
    fn retire(self: &Arc<Self>, worker: &Arc<PoolWorker>, why: &str) {
        if worker.retiring.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::info!(worker = %worker.process.name(), reason = why, "recycling Python worker");
        self.forget(worker);
        if worker.active.load(Ordering::Acquire) == 0 {
            worker.process.close();
        }
        if let Some(shutdown) = self.shutdown.get().cloned() {
            let pool = self.clone();
            tokio::spawn(async move { pool.replace(shutdown).await });
        }
    }

    async fn replace(self: &Arc<Self>, shutdown: CancellationToken) {
        let mut pause = Duration::from_millis(100);
        while !shutdown.is_cancelled() {
            match self.spawn_worker().await {
                Ok((worker, _)) => {
                    tracing::info!(worker = %worker.process.name(), "replacement Python worker ready");
                    self.lock().push(worker.clone());
                    self.changed.notify_waiters();
                    self.watch(worker, shutdown);
                    return;
                }
                Err(error) => {
                    tracing::error!(%error, ?pause, "cannot start a replacement Python worker; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = shutdown.cancelled() => return,
                    }
                    pause = (pause * 2).min(MAX_RESTART_PAUSE);
                }
            }
        }
    }

    /// Replaces every worker with a new one that loads the graphs again (`spindle dev`, when
    /// the project's files changed). The new workers start first; then the old ones are
    /// closed, and the runs they had are handed back by their executors, to resume from their
    /// last checkpoint on the new workers, with the new code. Answers the new workers' report.
    pub async fn reload(self: &Arc<Self>) -> Result<InitReport, PoolError> {
        let mut fresh = Vec::with_capacity(self.settings.workers.max(1));
        let mut report = None;
        for _ in 0..self.settings.workers.max(1) {
            let (worker, init) = self.spawn_worker().await?;
            report.get_or_insert(init);
            fresh.push(worker);
        }
        let old = std::mem::replace(&mut *self.lock(), fresh.clone());
        if let Some(shutdown) = self.shutdown.get() {
            for worker in fresh {
                self.watch(worker, shutdown.clone());
            }
        }
        for worker in old {
            worker.retiring.store(true, Ordering::Release);
            worker.process.close();
        }
        self.changed.notify_waiters();
        Ok(report.expect("at least one worker"))
    }

    /// A place for a run on the healthy worker with the fewest runs, waiting while every
    /// worker is full (or being replaced).
    pub async fn acquire(self: &Arc<Self>) -> RunSlot {
        loop {
            let changed = self.changed.notified();
            if let Some(worker) = self.least_loaded(true) {
                return RunSlot {
                    worker,
                    pool: self.clone(),
                };
            }
            // Bounded: a worker's health comes back without a notification.
            let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
        }
    }

    /// A worker for a read (state, schemas): the healthy one with the fewest runs, full or
    /// not (reads are short and run beside runs); `None` while there is none.
    pub fn reader(self: &Arc<Self>) -> Option<Arc<PoolWorker>> {
        self.least_loaded(false)
    }

    /// Waits up to `wait` for a worker to read with (one may be being replaced).
    pub async fn reader_within(self: &Arc<Self>, wait: Duration) -> Option<Arc<PoolWorker>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let changed = self.changed.notified();
            if let Some(worker) = self.reader() {
                return Some(worker);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }

    fn least_loaded(self: &Arc<Self>, take_slot: bool) -> Option<Arc<PoolWorker>> {
        let workers = self.lock();
        let limit = self.settings.runs_per_worker.max(1);
        let worker = workers
            .iter()
            .filter(|w| w.takes_runs())
            .filter(|w| !take_slot || w.active.load(Ordering::Acquire) < limit)
            .min_by_key(|w| w.active.load(Ordering::Acquire))?
            .clone();
        if !take_slot {
            return Some(worker);
        }
        // Under the lock: two runs looking at once must not both take a worker's last slot
        // (the worker would refuse the second, "worker is full").
        worker.active.fetch_add(1, Ordering::AcqRel);
        drop(workers);
        let started = worker.started_runs.fetch_add(1, Ordering::AcqRel) + 1;
        if self
            .settings
            .recycle_after_runs
            .is_some_and(|limit| started >= limit)
        {
            self.retire(&worker, "it has run as many runs as it may");
        }
        Some(worker)
    }

    pub fn calls(&self) -> &Arc<SpindleCalls> {
        &self.calls
    }

    /// Runs one worker executes at once.
    pub fn runs_per_worker(&self) -> u32 {
        self.settings.runs_per_worker.max(1)
    }

    /// Each worker in the pool, as an operator (or a test) sees it.
    pub fn workers(&self) -> Vec<WorkerState> {
        self.lock()
            .iter()
            .map(|w| WorkerState {
                pid: w.process.pid(),
                active_runs: w.active.load(Ordering::Acquire),
                takes_runs: w.takes_runs(),
            })
            .collect()
    }

    /// Pings the worker (never returns while it lives); marks it unhealthy after
    /// `missed_pings` missed in a row and healthy again once it answers; recycles it when its
    /// memory passed the limit.
    async fn ping_until_exit(self: &Arc<Self>, worker: &Arc<PoolWorker>) {
        let every = self.settings.ping_every;
        let mut missed = 0;
        loop {
            tokio::time::sleep(every).await;
            match tokio::time::timeout(every, worker.process.ping()).await {
                Ok(Ok(health)) => {
                    missed = 0;
                    if !worker.healthy.swap(true, Ordering::AcqRel) {
                        tracing::info!(worker = %worker.process.name(), ?health, "Python worker answers again; it gets runs again");
                        self.changed.notify_waiters();
                    }
                    if self
                        .settings
                        .max_rss_bytes
                        .is_some_and(|limit| health.rss_bytes > limit)
                    {
                        self.retire(worker, "its memory passed the limit");
                    }
                }
                Ok(Err(WorkerError::Exited { .. })) => std::future::pending::<()>().await,
                _ => {
                    missed += 1;
                    if missed >= self.settings.missed_pings
                        && worker.healthy.swap(false, Ordering::AcqRel)
                    {
                        tracing::warn!(worker = %worker.process.name(), missed, "Python worker does not answer its pings (is its event loop blocked?); it gets no new runs");
                    }
                }
            }
        }
    }
}
