//! The writes of runs in progress on PostgreSQL, grouped into shared transactions.
//!
//! A run writes at every step (its saves with the events before them), between steps (event
//! batches) and at its end. One transaction each cost a `BEGIN`, a `COMMIT` and a WAL flush
//! per write, and PostgreSQL's own CPU went mostly to that bookkeeping. Here, as SQLite's
//! writer does (`sqlite_writer`), writes queue; each of a few writer tasks takes everything
//! queued for it and applies it in one transaction, in queue order, and answers every caller
//! after the `COMMIT`. A thread's writes always go to the same writer (by a hash of its id),
//! so they are applied in the order they were queued, which the event log's seqs and a save's
//! history rely on; writers of different threads run side by side on their own connections.
//!
//! A group that fails (one write's statement failed, or the commit) is rolled back whole and
//! its writes applied again one transaction each, so only the faulty one fails; a save after
//! a failed save of the same thread then fails too: a checkpoint is never stored without the
//! history it continues.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Connection, PgConnection};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

mod batch;

use crate::checkpoints::{as_storage_error, store_logged_pg, Save};
use crate::pg_notify::{self, Announcer};
use crate::runs::{end_run_pg, insert_events_pg, EndPrepared};
use crate::{LoggedEvent, LoggedSave, ResourceId, Run, RunEnd, StorageError, StorageResult};
use batch::Batch;

/// How many writer tasks a process runs when not told ([`crate::ConnectOptions`]), each with
/// its own connection: one per two cores of this machine, 1 to 4. A connection applies one
/// statement at a time, so more writers let PostgreSQL's cores share the work; but they split
/// the same writes into smaller groups, and a group's cost is mostly per statement, not per
/// row, so every extra writer costs CPU per run. Measured on 2 cores (PostgreSQL on the same
/// machine, create + wait, `bench/pair.py`, 3 alternating pairs): at 16 clients 1 writer
/// against 2 did 861 against 821 runs/s, with 12 % less of Spindle's CPU per run and 14 % less
/// of PostgreSQL's; at 64 clients, where groups are large anyway, 1 writer was 4 % slower (956
/// against 1,000 runs/s). With more cores the cores are not what is short, and a single
/// connection would be what limits.
pub fn default_writer_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    (cores / 2).clamp(1, 4)
}

/// Most writes one transaction applies: a bound on the locks it holds and on how long its
/// first caller waits.
const MAX_GROUP: usize = 256;

/// A write of a run in progress.
pub(crate) enum Write {
    /// A save with the events before it ([`LoggedSave`]).
    Save(LoggedSave),
    /// Events of a run's log ([`crate::RunStore::append_events`]).
    Events(Vec<LoggedEvent>),
    /// A run's end ([`crate::RunStore::finish_run`]).
    End(Box<EndWrite>),
}

/// A run's end as its worker reports it.
pub(crate) struct EndWrite {
    thread_id: ResourceId,
    run_id: Uuid,
    worker_id: String,
    end: RunEnd,
}

impl Write {
    /// Whether applying it logs events (its thread's followers elsewhere are told).
    fn logs_events(&self) -> bool {
        match self {
            Write::Save(save) => !save.events.is_empty(),
            Write::Events(events) => !events.is_empty(),
            Write::End(_) => true,
        }
    }
}

/// What a write answers.
pub(crate) enum Written {
    Done,
    Ended(Option<Box<Run>>),
}

struct Job {
    write: Write,
    /// The thread the write is for, which picks its writer.
    thread: String,
    reply: oneshot::Sender<StorageResult<Written>>,
}

/// The queues of the writer tasks.
pub(crate) struct PgWriter {
    queues: Vec<mpsc::UnboundedSender<Job>>,
    /// Names this process in the writers' notifications (`pg_notify::LOG`).
    origin: String,
    /// Sends the notifications of what the writers (and others) committed.
    announcer: Arc<Announcer>,
}

impl PgWriter {
    /// Starts `writers` writer tasks (at least one) on the current runtime; they stop when the
    /// writer is dropped.
    pub(crate) fn start(pool: PgPool, writers: usize) -> Self {
        let origin = Uuid::new_v4().simple().to_string();
        let announcer = Arc::new(Announcer::start(pool.clone()));
        let queues = (0..writers.max(1))
            .map(|_| {
                let (queue, jobs) = mpsc::unbounded_channel();
                tokio::spawn(write_groups(
                    pool.clone(),
                    origin.clone(),
                    announcer.clone(),
                    jobs,
                ));
                queue
            })
            .collect();
        Self {
            queues,
            origin,
            announcer,
        }
    }

    /// Sends a notification once the caller's transaction has committed ([`Announcer`]).
    pub(crate) fn announce(&self, channel: &'static str, line: String) {
        self.announcer.send(channel, line);
    }

    /// What names this process in its writers' notifications.
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// Queues `write` (before this returns, so writes queued one after the other by one
    /// caller are applied in that order); the future resolves once it is committed.
    pub(crate) fn submit(
        &self,
        thread: String,
        write: Write,
    ) -> impl std::future::Future<Output = StorageResult<Written>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let queue = &self.queues[writer_of(&thread, self.queues.len())];
        let queued = queue.send(Job {
            write,
            thread,
            reply,
        });
        async move {
            queued.map_err(|_| gone())?;
            answer.await.map_err(|_| gone())?
        }
    }

    /// Queues a save with its events.
    pub(crate) fn save(
        &self,
        save: LoggedSave,
    ) -> impl std::future::Future<Output = StorageResult<()>> + Send + 'static {
        let (thread, _, _) = Save::of(&save.write).key();
        let thread = thread.to_owned();
        let done = self.submit(thread, Write::Save(save));
        async move { done.await.map(|_| ()) }
    }

    /// Queues events for their thread's log (before this returns).
    pub(crate) fn queue_events(
        &self,
        events: Vec<LoggedEvent>,
    ) -> impl std::future::Future<Output = StorageResult<()>> + Send + 'static {
        let thread = events.first().map(|first| first.thread_id.to_string());
        let queued = thread.map(|thread| self.submit(thread, Write::Events(events)));
        async move {
            match queued {
                Some(written) => written.await.map(|_| ()),
                None => Ok(()),
            }
        }
    }

    /// Queues a run's end, behind the writes queued for its thread before it.
    pub(crate) async fn end(
        &self,
        thread_id: ResourceId,
        run_id: Uuid,
        worker_id: String,
        end: RunEnd,
    ) -> StorageResult<Option<Run>> {
        let thread = thread_id.to_string();
        let write = Write::End(Box::new(EndWrite {
            thread_id,
            run_id,
            worker_id,
            end,
        }));
        match self.submit(thread, write).await? {
            Written::Ended(run) => Ok(run.map(|run| *run)),
            Written::Done => Ok(None),
        }
    }
}

fn gone() -> StorageError {
    StorageError::Commit("the PostgreSQL writer stopped".to_owned())
}

fn writer_of(thread: &str, writers: usize) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    thread.hash(&mut hasher);
    (hasher.finish() % writers as u64) as usize
}

/// One writer task: takes what is queued, applies it as one group, answers, again.
async fn write_groups(
    pool: PgPool,
    origin: String,
    announcer: Arc<Announcer>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    let mut conn = None;
    let mut logged = Vec::new();
    while jobs.recv_many(&mut group, MAX_GROUP).await > 0 {
        let results = match connected(&pool, &mut conn).await {
            Ok(conn) => apply(conn, &group, &origin, &mut logged).await,
            Err(error) => group
                .iter()
                .map(|_| Err(StorageError::Commit(error.to_string())))
                .collect(),
        };
        if results.iter().any(Result::is_err) {
            // The connection may be what failed: the next group starts on a new one.
            conn = None;
        }
        for line in logged.drain(..) {
            announcer.send(pg_notify::LOG, line);
        }
        for (job, result) in group.drain(..).zip(results) {
            // The caller may have stopped waiting; its write stands.
            let _ = job.reply.send(result);
        }
    }
}

/// The writer's own connection, opened on first use: outside the pool, so that its session
/// settings ([`index_lookups_only`]) and its prepared statements are the writer's alone.
async fn connected<'c>(
    pool: &PgPool,
    conn: &'c mut Option<PgConnection>,
) -> StorageResult<&'c mut PgConnection> {
    if conn.is_none() {
        let options = index_lookups_only((*pool.connect_options()).clone());
        *conn = Some(PgConnection::connect_with(&options).await?);
    }
    Ok(conn.as_mut().expect("connected above"))
}

/// Plans the writers' statements once each (a generic plan, kept by the connection's prepared
/// statement) and as lookups by index, one small input row at a time, whatever the tables'
/// size. Their inputs are arrays of a few rows (`UNNEST`, `= ANY`), whose size a generic plan
/// cannot know: plans made while the tables were small scanned them whole, hashing or merging
/// the inputs, and kept doing so as they grew (create + wait fell from 600 to 261 runs/s in
/// 30 s on a fresh database; `threads` was read whole about once per run). Planning every
/// execution instead (custom plans) cost PostgreSQL a quarter of its CPU. Without hash joins,
/// merge joins and sequential scans (where an index serves), the one plan fits every size.
///
/// The price: a join of one input set to another (two UNNESTs, or an UNNEST and a CTE of the
/// same statement) can only be a nested loop, which reads the inner side again for every outer
/// row, quadratic in the group. Statements for this connection reach their inputs' rows by
/// place (array subscripts, `= ANY`) or by index instead (the checkpoints' and pending
/// writes' statements of `spindle_write_group`, migration 0014).
fn index_lookups_only(options: PgConnectOptions) -> PgConnectOptions {
    options.options([
        ("enable_hashjoin", "off"),
        ("enable_mergejoin", "off"),
        ("enable_seqscan", "off"),
        ("plan_cache_mode", "force_generic_plan"),
    ])
}

/// Applies a group in one transaction; when that fails, each write in its own. Adds to
/// `logged` what is to be announced of the committed writes ([`logged_lines`]).
async fn apply(
    conn: &mut PgConnection,
    group: &[Job],
    origin: &str,
    logged: &mut Vec<String>,
) -> Vec<StorageResult<Written>> {
    // A group of one write too: the function's one round trip, where a transaction of its
    // own takes four.
    match apply_together(conn, group, origin, logged).await {
        Ok(results) => return results,
        // Expected now and then (a run cancelled with `rollback`, a worker that lost its
        // lease); the writes alone tell which failed and why.
        Err(error) => tracing::debug!(%error, writes = group.len(),
            "a writer's group failed; applying its writes one by one"),
    }
    let mut failed_threads = HashSet::new();
    let mut results = Vec::with_capacity(group.len());
    for job in group {
        let result = if matches!(job.write, Write::Save(_)) && failed_threads.contains(&job.thread)
        {
            Err(StorageError::Checkpoint(
                "an earlier save of this thread failed; this one continues it and is not stored"
                    .to_owned(),
            ))
        } else {
            apply_alone(conn, job, origin, logged).await
        };
        if result.is_err() && matches!(job.write, Write::Save(_)) {
            failed_threads.insert(job.thread.clone());
        }
        results.push(result);
    }
    results
}

/// The whole group committed together, or an error (rolled back) if any write failed.
async fn apply_together(
    conn: &mut PgConnection,
    group: &[Job],
    origin: &str,
    logged: &mut Vec<String>,
) -> StorageResult<Vec<StorageResult<Written>>> {
    if let Some(batch) = Batch::of(group) {
        let (results, last_seqs) = batch.apply(conn).await?;
        logged.extend(lines_of(last_seqs, origin));
        return Ok(results);
    }
    let mut tx = conn.begin().await?;
    match apply_in_order(&mut tx, group).await {
        Ok(results) => {
            let lines = logged_lines(&mut tx, group, origin).await?;
            tx.commit().await?;
            logged.extend(lines);
            Ok(results)
        }
        Err(error) => {
            tx.rollback().await?;
            Err(error)
        }
    }
}

/// The group's writes one after the other (on one transaction), each with its own
/// statements.
async fn apply_in_order(
    conn: &mut PgConnection,
    group: &[Job],
) -> StorageResult<Vec<StorageResult<Written>>> {
    let mut results = Vec::with_capacity(group.len());
    for job in group {
        results.push(Ok(apply_one(conn, &job.write).await?));
    }
    Ok(results)
}

/// The lines announcing how far the logs reach ([`logged_lines`]), from seqs already known.
fn lines_of(last_seqs: HashMap<ResourceId, i64>, origin: &str) -> Vec<String> {
    last_seqs
        .into_iter()
        .map(|(thread, seq)| format!("{thread} {seq} {origin}"))
        .collect()
}

/// What tells other processes (and this one's listener) how far the logs the writes grew
/// reach, read in their transaction and sent once it commits ([`Announcer`]): a line per
/// thread, with its last seq and this process's name.
async fn logged_lines(
    conn: &mut PgConnection,
    jobs: &[Job],
    origin: &str,
) -> StorageResult<Vec<String>> {
    let mut threads: Vec<&str> = jobs
        .iter()
        .filter(|job| job.write.logs_events())
        .map(|job| job.thread.as_str())
        .collect();
    threads.sort_unstable();
    threads.dedup();
    if threads.is_empty() {
        return Ok(Vec::new());
    }
    let seqs: Vec<(String, i64)> =
        sqlx::query_as("SELECT thread_id, event_seq FROM threads WHERE thread_id = ANY($1)")
            .bind(threads)
            .fetch_all(conn)
            .await?;
    Ok(seqs
        .into_iter()
        .map(|(thread, seq)| format!("{thread} {seq} {origin}"))
        .collect())
}

/// One write in a transaction of its own.
async fn apply_alone(
    conn: &mut PgConnection,
    job: &Job,
    origin: &str,
    logged: &mut Vec<String>,
) -> StorageResult<Written> {
    let mut tx = conn.begin().await?;
    match apply_one(&mut tx, &job.write).await {
        Ok(written) => {
            let lines = logged_lines(&mut tx, std::slice::from_ref(job), origin).await?;
            tx.commit().await?;
            logged.extend(lines);
            Ok(written)
        }
        Err(error) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(%rollback, "rolling back a failed write");
            }
            Err(error)
        }
    }
}

async fn apply_one(conn: &mut PgConnection, write: &Write) -> StorageResult<Written> {
    match write {
        Write::Save(save) => {
            store_logged_pg(conn, save)
                .await
                .map_err(as_storage_error)?;
            Ok(Written::Done)
        }
        Write::Events(events) => {
            insert_events_pg(conn, events).await?;
            Ok(Written::Done)
        }
        Write::End(end) => end_write(conn, end, EndPrepared::default()).await,
    }
}

async fn end_write(
    conn: &mut PgConnection,
    write: &EndWrite,
    prepared: EndPrepared,
) -> StorageResult<Written> {
    let EndWrite {
        thread_id,
        run_id,
        worker_id,
        end,
    } = write;
    let ended = end_run_pg(conn, *thread_id, *run_id, worker_id, end, prepared).await?;
    Ok(Written::Ended(ended.map(Box::new)))
}
