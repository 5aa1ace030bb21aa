//! Runs: the queue workers claim from, and the per-thread event log streams read.
//!
//! A run is stored `pending` by the request that creates it, in the same transaction that
//! marks its thread `busy` and applies the multitask strategy. A worker claims it with a lease
//! (PostgreSQL: `FOR UPDATE SKIP LOCKED`), renews the lease while it executes, and ends it in one
//! transaction that writes the run's status and its thread's status and values. A partial
//! unique index allows at most one `running` run per thread, so the database, not a map in
//! memory, keeps runs of a thread from overlapping.
//!
//! Every event a run emits gets a sequence number per thread (`seq`), assigned by the worker
//! holding the lease (the only writer for that thread at a time), and is appended to the event
//! log in batches. Streams subscribe to live events first and replay from the log second.

use crate::ResourceId;
use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::crons::FiringId;
use crate::model::{AssistantRead, JsonObject, Page, Scope, ThreadStatus};
use crate::{StorageError, StorageResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Pending,
    Running,
    Success,
    Error,
    Timeout,
    Interrupted,
}

impl RunStatus {
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Success,
        RunStatus::Error,
        RunStatus::Timeout,
        RunStatus::Interrupted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Success => "success",
            RunStatus::Error => "error",
            RunStatus::Timeout => "timeout",
            RunStatus::Interrupted => "interrupted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    /// Pending or running: the run still holds its thread.
    pub fn is_active(self) -> bool {
        matches!(self, RunStatus::Pending | RunStatus::Running)
    }
}

/// What to do with a new run when its thread already has an active one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MultitaskStrategy {
    /// Refuse the new run (conflict).
    Reject,
    /// Stop the active runs (they end `interrupted`), then run the new one.
    Interrupt,
    /// Stop the active runs and delete them with the checkpoints they wrote.
    Rollback,
    /// Run the new one after the active ones.
    #[default]
    Enqueue,
}

impl MultitaskStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            MultitaskStrategy::Reject => "reject",
            MultitaskStrategy::Interrupt => "interrupt",
            MultitaskStrategy::Rollback => "rollback",
            MultitaskStrategy::Enqueue => "enqueue",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Reject, Self::Interrupt, Self::Rollback, Self::Enqueue]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// How a cancelled run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CancelAction {
    /// The run ends `interrupted`; what it wrote stays.
    #[default]
    Interrupt,
    /// The run and the checkpoints it wrote are deleted.
    Rollback,
}

impl CancelAction {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelAction::Interrupt => "interrupt",
            CancelAction::Rollback => "rollback",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Interrupt, Self::Rollback]
            .into_iter()
            .find(|a| a.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub run_id: Uuid,
    pub thread_id: ResourceId,
    pub assistant_id: ResourceId,
    pub user_id: Option<String>,
    pub status: RunStatus,
    /// Everything the run was asked to do (input, command, config, context, stream modes,
    /// interrupt_before/after, checkpoint, durability, webhook, ...), as the server wrote it.
    pub kwargs: JsonObject,
    pub metadata: JsonObject,
    pub multitask_strategy: MultitaskStrategy,
    /// 0 until claimed; +1 at each claim (a run resumed after its worker died has attempt 2).
    pub attempt: i32,
    /// Not claimed before this time (`after_seconds`).
    pub run_after: DateTime<Utc>,
    /// Set when someone asked the run to stop; the worker ends it accordingly.
    pub cancel: Option<CancelAction>,
    /// `{error, message}` once the run failed (or timed out).
    pub error: Option<Value>,
    /// The thread's values when the run ended (its output); `None` before, and for a run
    /// that ended without a worker to report them (cancelled while pending, worker lost).
    pub output: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When a worker first claimed it (a run resumed after its worker died keeps this).
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended, however it ended.
    pub ended_at: Option<DateTime<Utc>>,
}

/// What happens when the run's thread does not exist.
#[derive(Debug, Clone, PartialEq)]
pub enum IfThreadMissing {
    /// Not found.
    Reject,
    /// Create it, owned by the caller, with this metadata.
    Create { metadata: JsonObject },
}

#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: Uuid,
    pub thread_id: ResourceId,
    pub assistant_id: ResourceId,
    /// The assistant as the run was made from it (its inherited metadata, its config for the
    /// worker it is handed to), which may be an out-of-date copy
    /// ([`crate::AssistantStore::assistant_for_run`]): the run is created only while the
    /// assistant is still so, else [`StorageError::AssistantChanged`]. `None`: not checked.
    pub assistant_read: Option<AssistantRead>,
    pub kwargs: JsonObject,
    pub metadata: JsonObject,
    pub multitask_strategy: MultitaskStrategy,
    pub run_after: DateTime<Utc>,
    pub if_thread_missing: IfThreadMissing,
    /// A worker with a free slot: when the run can start now (its thread has no other active
    /// run and it is not delayed), it is created `running`, claimed by this worker, in the
    /// same transaction, so it starts without a claim of its own.
    pub claim: Option<Claim>,
    /// The cron firing this run is made for: the run is created only while that firing is
    /// in flight, and its creation ends it, in one transaction (`Conflict` when another
    /// scheduler already made it).
    pub cron_firing: Option<FiringId>,
}

/// Who claims a run at its creation, and for how long (see [`NewRun::claim`]).
#[derive(Debug, Clone)]
pub struct Claim {
    pub worker_id: String,
    pub lease: std::time::Duration,
}

/// The key of a run's kwargs holding the metadata its graph inherits (beneath its own
/// `config.metadata` and metadata): its assistant's, then its thread's, which storage adds
/// when it creates the run, as LangGraph Platform merges them.
pub const INHERITED_METADATA: &str = "inherited_metadata";

/// Adds `thread`'s metadata to `kwargs`' inherited metadata (over the assistant's); true
/// when that changed anything.
pub(crate) fn inherit_metadata(kwargs: &mut JsonObject, thread: JsonObject) -> bool {
    if thread.is_empty() {
        return false;
    }
    let inherited = kwargs
        .entry(INHERITED_METADATA)
        .or_insert_with(|| Value::Object(JsonObject::new()));
    match inherited {
        Value::Object(inherited) => inherited.extend(thread),
        other => *other = Value::Object(thread),
    }
    true
}

impl NewRun {
    /// The claim to create the run with: one was offered, nothing else on the thread is
    /// pending or running, and the run is due.
    fn claim_now(&self, active: &[(Uuid, RunStatus)], now: DateTime<Utc>) -> Option<&Claim> {
        self.claim
            .as_ref()
            .filter(|_| active.is_empty() && self.run_after <= now)
    }
}

/// The columns of a new run's row that say whether it starts claimed.
struct Start {
    status: RunStatus,
    attempt: i32,
    lease_owner: Option<String>,
    lease_expires_at: Option<DateTime<Utc>>,
    started_at: Option<DateTime<Utc>>,
}

impl Start {
    /// The run `new` becomes when its row is inserted with these columns at `now`.
    fn run(self, new: NewRun, scope: &Scope, now: DateTime<Utc>) -> Run {
        Run {
            run_id: new.run_id,
            thread_id: new.thread_id,
            assistant_id: new.assistant_id,
            user_id: Some(scope.user_id.clone()),
            status: self.status,
            kwargs: new.kwargs,
            metadata: new.metadata,
            multitask_strategy: new.multitask_strategy,
            attempt: self.attempt,
            run_after: new.run_after,
            cancel: None,
            error: None,
            output: None,
            created_at: now,
            updated_at: now,
            started_at: self.started_at,
            ended_at: None,
        }
    }

    fn of(claim: Option<&Claim>, now: DateTime<Utc>) -> Self {
        match claim {
            Some(claim) => Start {
                status: RunStatus::Running,
                attempt: 1,
                lease_owner: Some(claim.worker_id.clone()),
                lease_expires_at: Some(lease_end(now, claim.lease)),
                started_at: Some(now),
            },
            None => Start {
                status: RunStatus::Pending,
                attempt: 0,
                lease_owner: None,
                lease_expires_at: None,
                started_at: None,
            },
        }
    }
}

/// The result of creating a run.
#[derive(Debug, Clone)]
pub struct CreatedRun {
    pub run: Run,
    /// Active runs of the thread that the multitask strategy asked to stop; the server signals
    /// their workers.
    pub cancelled: Vec<Uuid>,
    /// Set when the run was created claimed ([`NewRun::claim`]).
    pub claimed: Option<ClaimStart>,
}

/// Where a run claimed as it was created starts, read in the transaction that created it,
/// which also logged the run's first event ([`start_event_data`]): a stream may send it at
/// once, as it is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimStart {
    /// The seq of the run's first event, logged with the run.
    pub last_seq: i64,
    /// As [`ClaimedRun::thread_is_new`].
    pub thread_is_new: bool,
}

/// A run a worker now holds.
#[derive(Debug, Clone)]
pub struct ClaimedRun {
    pub run: Run,
    /// The seq of the thread's last logged event; the worker numbers new events after it.
    pub last_seq: i64,
    /// The thread had no checkpoint when the run was claimed, so the run need not look for
    /// one (a thread's first run spares a read). `false` when the claim did not look (SQLite's
    /// claims from the queue).
    pub thread_is_new: bool,
    /// The attempt's first event ([`start_event_data`]) is logged, at `last_seq` (a run
    /// claimed as it was created, [`ClaimStart`]).
    pub start_logged: bool,
}

/// When the queue may next hold a run to claim ([`RunStore::queue_outlook`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueOutlook {
    /// When a run could next become claimable by time alone: the earliest lease of a running
    /// run, or due time of a pending run whose thread runs nothing (past when one is
    /// claimable now); `None` when no run is active.
    pub due: Option<DateTime<Utc>>,
    /// Some run is pending and due (perhaps behind a running run of its thread, which may end
    /// at any moment): whoever relies on announcements looks again every few seconds while
    /// this holds, so that a lost one delays such a run by seconds, not forever. (A run not
    /// due yet is in `due` when its thread is free.)
    pub pending: bool,
}

/// The data of the event that closes a run's events ([`RUN_END_EVENT`]), `{run_id, status}`.
pub(crate) fn end_event_data(run_id: Uuid, status: RunStatus) -> Value {
    serde_json::json!({"run_id": run_id.to_string(), "status": status.as_str()})
}

/// The data of an attempt's first event, `metadata {run_id, attempt}`.
pub fn start_event_data(run_id: Uuid, attempt: i32) -> Value {
    serde_json::json!({"run_id": run_id.to_string(), "attempt": attempt})
}

/// How a run ended, written in one transaction with its thread's new state.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub status: RunStatus,
    /// `{error, message}` when the run failed.
    pub error: Option<Value>,
    /// The thread's status once no other run is active: `error`, `interrupted` or `idle`.
    /// (While other runs of the thread are pending it stays `busy`.)
    pub thread_status: ThreadStatus,
    /// The values of the thread's latest checkpoint, for `GET /threads/{id}`.
    pub thread_values: Option<Value>,
    /// Interrupts by task id, for `GET /threads/{id}`.
    pub thread_interrupts: JsonObject,
    /// The run's last events, not logged yet: written before its end event in the same
    /// transaction, so a short run costs one log write, not one per batch. Dropped with the
    /// run when it is rolled back.
    pub events: Vec<LoggedEvent>,
    /// A checkpoint of the run's thread (root namespace) the end depends on: the run's last,
    /// whose save the worker queued but did not wait for. The end is refused with
    /// [`StorageError::Checkpoint`], changing nothing, unless that checkpoint is stored.
    pub after_checkpoint: Option<String>,
}

/// The refusal of a run's end whose [`RunEnd::after_checkpoint`] is not stored.
pub(crate) fn unsaved(checkpoint_id: &str) -> StorageError {
    StorageError::Checkpoint(format!(
        "the run's last checkpoint {checkpoint_id} was not stored; its end is not written"
    ))
}

/// The logged event that closes a run's events, `{run_id, status}`: written in the transaction
/// that ends the run, however it ends, so a stream that reads it knows the run is over. Run
/// streams do not send it; thread streams turn it into `metadata {status: run_done}`.
pub const RUN_END_EVENT: &str = "end";

/// Most events a worker may have sent to live streams without logging them yet (it logs in
/// batches). When a run's worker is lost, its thread's counter skips this many: the events
/// it streamed but never logged keep seqs nobody reuses, so a client resuming from one of them
/// misses nothing of the next attempt.
pub const UNLOGGED_EVENTS_MAX: i64 = 512;

/// One event of a run, as kept in the thread's log.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedEvent {
    pub thread_id: ResourceId,
    pub seq: i64,
    /// The run that made it; nil for a state update made through the state API.
    pub run_id: Uuid,
    /// SSE event name (`values`, `updates|child:1`, `metadata`, `end`, ...).
    pub event: String,
    pub data: Value,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
}

/// Runs and their event log.
#[async_trait::async_trait]
pub trait RunStore: Send + Sync {
    /// In one transaction: applies the thread's missing-thread rule, the multitask strategy
    /// (`Reject` with an active run is a conflict), inserts the run `pending` and marks the
    /// thread `busy`. A thread the caller cannot see (missing, or another user's) is
    /// `NotFound`, also with [`IfThreadMissing::Create`]. `cancelled` lists, oldest first,
    /// every active run the strategy stopped (pending ones have ended, running ones are flagged).
    async fn create_run(&self, scope: &Scope, new: NewRun) -> StorageResult<CreatedRun>;
    async fn get_run(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_id: Uuid,
    ) -> StorageResult<Run>;
    /// Newest first. `NotFound` when the caller cannot see the thread.
    async fn list_runs(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        filter: RunFilter,
        page: Page,
    ) -> StorageResult<Vec<Run>>;
    /// Deletes a run that is not active (an active one is a conflict), with its events.
    async fn delete_run(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_id: Uuid,
    ) -> StorageResult<()>;
    /// Asks active runs to stop. Pending runs end at once (`interrupted`, or deleted for
    /// rollback); running ones are flagged for their worker. Returns the runs flagged or ended.
    /// Ids that are not active runs of the thread are skipped; `NotFound` when none is. When
    /// no run of the thread is active afterwards, the thread is `idle`.
    async fn cancel_runs(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_ids: &[Uuid],
        action: CancelAction,
    ) -> StorageResult<Vec<Uuid>>;

    /// Claims the oldest due pending run whose thread has no running run, for `lease`.
    /// Also reclaims runs whose lease expired (their worker died), up to `max_attempts`;
    /// past that they end `error` and their thread is released. (An expired run that was
    /// asked to stop ends as asked instead of being resumed.) `None` when nothing is due, or
    /// when every due run is being claimed by another worker at this moment.
    async fn claim_run(
        &self,
        worker_id: &str,
        lease: std::time::Duration,
        max_attempts: i32,
    ) -> StorageResult<Option<ClaimedRun>>;
    /// Whether [`RunStore::claim_run`] would find a run now (a due pending run whose thread
    /// has no running run, or a run whose lease expired), read without claiming anything. A
    /// worker looks before it takes a slot to claim with: a slot held for a claim that finds
    /// nothing is one a run being created cannot start in at once.
    async fn has_claimable_run(&self) -> StorageResult<bool>;
    /// When a run could next become claimable by time alone, and whether any run is pending.
    /// A process told of every other change ([`crate::Storage::wakeups`]) sleeps until then
    /// instead of polling.
    async fn queue_outlook(&self) -> StorageResult<QueueOutlook>;
    /// Gives up the worker's claim on a running run, which any worker may claim again at once
    /// and resumes from its last checkpoint (announced to other processes, as a run to claim).
    async fn hand_back_run(&self, run_id: Uuid, worker_id: &str) -> StorageResult<()>;
    /// Extends the lease; returns the run as it now is (to see a cancel request), or `None`
    /// when the worker no longer holds it.
    async fn renew_lease(
        &self,
        run_id: Uuid,
        worker_id: &str,
        lease: std::time::Duration,
    ) -> StorageResult<Option<Run>>;
    /// Ends a run and updates its thread, in one transaction, and returns the run as it ended
    /// (`None` for a rollback end, which deletes the run). Returning it spares a read that a
    /// concurrent deletion of the thread could beat. `NotFound` when the worker no longer
    /// holds the run (its lease was taken over, or the run or its thread was deleted);
    /// `Invalid` for an active `end.status`; `Checkpoint` when `end.after_checkpoint` is not
    /// stored. `thread_id` is the run's (its worker holds the run): PostgreSQL's writer queues
    /// the end behind the saves of that thread.
    async fn finish_run(
        &self,
        thread_id: ResourceId,
        run_id: Uuid,
        worker_id: &str,
        end: RunEnd,
    ) -> StorageResult<Option<Run>>;

    /// Appends events (one transaction per batch). Seqs only grow per thread: a seq at or
    /// below one the thread ever logged (even if since removed) is a `Conflict`; an event of a
    /// run that no longer exists is `NotFound`.
    async fn append_events(&self, events: &[LoggedEvent]) -> StorageResult<()>;
    /// Events of a thread with `seq > after`, oldest first, optionally of one run.
    async fn read_events(
        &self,
        thread_id: ResourceId,
        after: i64,
        run_id: Option<Uuid>,
        limit: i64,
    ) -> StorageResult<Vec<LoggedEvent>>;
    /// The seq of the thread's last logged event; 0 when it has none.
    async fn last_event_seq(&self, thread_id: ResourceId) -> StorageResult<i64>;
    /// A run by its id alone (clients that follow a stateless run know no thread).
    async fn find_run(&self, scope: &Scope, run_id: Uuid) -> StorageResult<Run>;
    /// Removes up to `limit` logged events older than `before`, except those of active runs.
    /// (Seqs are counted on the thread, so removing events never lets one be reused.)
    /// Returns how many went.
    async fn prune_events(&self, before: DateTime<Utc>, limit: i64) -> StorageResult<u64>;
    /// `(thread_id, run_id)` of the caller's active runs in any thread, oldest first: those of
    /// `status` (pending or running), or both when `None`.
    async fn active_runs(
        &self,
        scope: &Scope,
        status: Option<RunStatus>,
    ) -> StorageResult<Vec<(ResourceId, Uuid)>>;
}

pub(crate) mod postgres;
pub(crate) use postgres::{
    end_run as end_run_pg, insert_events as insert_events_pg, EndArrays, EndOf, EndPrepared,
    EventArrays,
};
pub(crate) mod sqlite;

/// How many runs with an expired lease one claim ends (past `max_attempts`) before it gives up
/// looking for one it can run, so that a claim stays a short transaction.
const EXPIRED_PER_CLAIM: usize = 16;
/// How many pending candidates one claim tries when another worker takes them first.
const CANDIDATES_PER_CLAIM: usize = 8;

/// The error a run whose worker died too often ends with (its `error` event and its
/// `error` column). Logged as a warning too: nothing else tells an operator that workers
/// keep dying on a run.
fn worker_lost(run: &Run) -> Value {
    let attempts = run.attempt;
    let message =
        format!("the run's worker stopped renewing its lease {attempts} time(s); giving up");
    // The run-failed line its worker would have written (see the worker's `log_failure`):
    // the process that ends it here never ran it, so the graph and node are not known.
    tracing::warn!(
        run_id = %run.run_id,
        thread_id = %run.thread_id,
        assistant_id = %run.assistant_id,
        graph = "-",
        node = "-",
        error = "WorkerLost",
        error_message = %message,
        attempts,
        "run failed"
    );
    serde_json::json!({"error": "WorkerLost", "message": message})
}

/// The columns a run is read with, in [`RunRow`]'s order.
const RUN_COLUMNS: &str = "run_id, thread_id, assistant_id, user_id, status, kwargs, metadata, \
     multitask_strategy, attempt, run_after, cancel, error, created_at, updated_at, started_at, \
     ended_at, output";

#[derive(sqlx::FromRow)]
pub(crate) struct RunRow<Id> {
    run_id: Id,
    thread_id: ResourceId,
    assistant_id: ResourceId,
    user_id: Option<String>,
    status: String,
    kwargs: sqlx::types::Json<JsonObject>,
    metadata: sqlx::types::Json<JsonObject>,
    multitask_strategy: String,
    attempt: i32,
    run_after: DateTime<Utc>,
    cancel: Option<String>,
    error: Option<sqlx::types::Json<Value>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    output: Option<sqlx::types::Json<Value>>,
}

impl RunRow<Uuid> {
    /// A row read on the SQLite write connection.
    fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        use crate::sqlite_values::RowExt;
        Ok(Self {
            run_id: r.uuid("run_id")?,
            thread_id: r.resource_id("thread_id")?,
            assistant_id: r.resource_id("assistant_id")?,
            user_id: r.get("user_id")?,
            status: r.get("status")?,
            kwargs: sqlx::types::Json(r.json("kwargs")?),
            metadata: sqlx::types::Json(r.json("metadata")?),
            multitask_strategy: r.get("multitask_strategy")?,
            attempt: r.get("attempt")?,
            run_after: r.ts("run_after")?,
            cancel: r.get("cancel")?,
            error: r.opt_json("error")?.map(sqlx::types::Json),
            created_at: r.ts("created_at")?,
            updated_at: r.ts("updated_at")?,
            started_at: r.opt_ts("started_at")?,
            ended_at: r.opt_ts("ended_at")?,
            output: r.opt_json("output")?.map(sqlx::types::Json),
        })
    }
}

impl<Id: crate::rows::IntoUuid> TryFrom<RunRow<Id>> for Run {
    type Error = crate::StorageError;

    fn try_from(row: RunRow<Id>) -> StorageResult<Self> {
        let corrupt = |what: &str, value: &str| {
            crate::StorageError::Corrupt(format!("unknown run {what} {value:?}"))
        };
        Ok(Run {
            run_id: row.run_id.into_uuid(),
            thread_id: row.thread_id,
            assistant_id: row.assistant_id,
            user_id: row.user_id,
            status: RunStatus::parse(&row.status).ok_or_else(|| corrupt("status", &row.status))?,
            kwargs: row.kwargs.0,
            metadata: row.metadata.0,
            multitask_strategy: MultitaskStrategy::parse(&row.multitask_strategy)
                .ok_or_else(|| corrupt("multitask strategy", &row.multitask_strategy))?,
            attempt: row.attempt,
            run_after: row.run_after,
            cancel: match row.cancel.as_deref() {
                None => None,
                Some(c) => Some(CancelAction::parse(c).ok_or_else(|| corrupt("cancel", c))?),
            },
            error: row.error.map(|e| e.0),
            output: row.output.map(|o| o.0),
            created_at: row.created_at,
            updated_at: row.updated_at,
            started_at: row.started_at,
            ended_at: row.ended_at,
        })
    }
}

/// `(thread_id, lowest seq, highest seq)` of each thread a batch of events is for, so each
/// thread's counter is checked and moved once per batch.
fn seq_ranges<'a>(
    events: impl IntoIterator<Item = &'a LoggedEvent>,
) -> Vec<(ResourceId, i64, i64)> {
    let mut ranges: Vec<(ResourceId, i64, i64)> = Vec::new();
    for event in events {
        match ranges.iter_mut().find(|(t, _, _)| *t == event.thread_id) {
            Some((_, low, high)) => {
                *low = (*low).min(event.seq);
                *high = (*high).max(event.seq);
            }
            None => ranges.push((event.thread_id, event.seq, event.seq)),
        }
    }
    ranges
}

/// A batch that does not continue its thread's counter reuses a seq.
fn seq_taken(thread_id: ResourceId) -> crate::StorageError {
    crate::StorageError::Conflict(format!(
        "thread {thread_id} has logged events at or after that seq"
    ))
}

/// The columns an event is read with, in [`EventRow`]'s order (`data` as text on both
/// backends).
#[derive(sqlx::FromRow)]
struct EventRow<Id> {
    thread_id: ResourceId,
    seq: i64,
    /// `NULL` for an event no run made (a state update through the state API).
    run_id: Option<Id>,
    event: String,
    data: String,
    created_at: DateTime<Utc>,
}

impl<Id: crate::rows::IntoUuid> TryFrom<EventRow<Id>> for LoggedEvent {
    type Error = crate::StorageError;

    fn try_from(row: EventRow<Id>) -> StorageResult<Self> {
        let data = serde_json::from_str(&row.data)
            .map_err(|e| crate::StorageError::Corrupt(format!("event {} data: {e}", row.seq)))?;
        Ok(LoggedEvent {
            thread_id: row.thread_id,
            seq: row.seq,
            run_id: row.run_id.map_or(Uuid::nil(), |id| id.into_uuid()),
            event: row.event,
            data,
            created_at: row.created_at,
        })
    }
}

/// Active runs split by what stopping them means: pending ones end now, running ones are
/// flagged for their worker.
fn split_active(active: &[(Uuid, RunStatus)]) -> (Vec<Uuid>, Vec<Uuid>) {
    let pending = active
        .iter()
        .filter(|(_, s)| *s == RunStatus::Pending)
        .map(|(id, _)| *id)
        .collect();
    let running = active
        .iter()
        .filter(|(_, s)| *s == RunStatus::Running)
        .map(|(id, _)| *id)
        .collect();
    (pending, running)
}

/// Parses `(run_id, status)` rows of active runs.
fn parse_active<Id: crate::rows::IntoUuid>(
    rows: Vec<(Id, String)>,
) -> StorageResult<Vec<(Uuid, RunStatus)>> {
    rows.into_iter()
        .map(|(id, status)| {
            let status = RunStatus::parse(&status).ok_or_else(|| {
                crate::StorageError::Corrupt(format!("unknown run status {status:?}"))
            })?;
            Ok((id.into_uuid(), status))
        })
        .collect()
}

/// A lease's end, `lease` from `now`.
fn lease_end(now: DateTime<Utc>, lease: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|lease| now.checked_add_signed(lease))
        .unwrap_or_else(|| now + chrono::Duration::days(36500))
}
