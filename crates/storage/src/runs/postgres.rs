//! [`RunStore`] on PostgreSQL, for several processes claiming from one queue.
//!
//! Claims take candidates with `FOR NO KEY UPDATE SKIP LOCKED`, so workers never wait on
//! each other's rows. Two claims can still pick two pending runs of one thread at once; the
//! partial unique index lets only one become `running`, and the other claim rolls back to a
//! savepoint and looks again.
//!
//! Lock order, to stay free of deadlocks: a thread row before its runs' rows. Whatever decides
//! a thread's status from its active runs (create, cancel, finish, ending an abandoned run)
//! holds the thread's row while it counts, so a run created meanwhile is never missed.

use crate::ResourceId;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{FromRow, PgConnection, Postgres, QueryBuilder, Row, Transaction};
use uuid::Uuid;

use super::*;
use crate::checkpoints::delete_run_checkpoints_pg as delete_run_checkpoints;
use crate::crons::firing_made;
use crate::error::conflict_if_taken;
use crate::pg_creator::{self, group::RunMade, RunCreation};
use crate::pg_notify::{notify, notify_logged, notify_runs, CANCEL, RUNS};
use crate::postgres::{PgQuery, PostgresStorage};
use crate::sqlite_values::json;
use crate::StorageError;

mod end;
pub(crate) use end::{end_run, EndArrays, EndOf, EndPrepared};

/// Whether the caller sees the thread; `lock` also locks its row for the transaction.
async fn thread_visible(
    conn: &mut PgConnection,
    scope: &Scope,
    thread_id: ResourceId,
    lock: bool,
) -> StorageResult<bool> {
    let sql = format!(
        "SELECT 1 FROM threads WHERE thread_id = $1 AND (user_id = $2 OR user_id IS NULL){}",
        if lock { " FOR NO KEY UPDATE" } else { "" }
    );
    let found: Option<i32> = sqlx::query_scalar(&sql)
        .bind(thread_id)
        .bind(&scope.user_id)
        .fetch_optional(conn)
        .await?;
    Ok(found.is_some())
}

/// Refuses a run's end whose last checkpoint is not stored (its save failed).
async fn require_checkpoint(
    conn: &mut PgConnection,
    thread_id: ResourceId,
    checkpoint_id: &str,
) -> StorageResult<()> {
    let stored: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = '' \
         AND checkpoint_id = $2",
    )
    .bind(thread_id.to_string())
    .bind(checkpoint_id)
    .fetch_optional(conn)
    .await?;
    stored.map(|_| ()).ok_or_else(|| unsaved(checkpoint_id))
}

/// The thread's active runs, oldest first, locked; only those among `only` when given.
/// (A run a claim is starting is waited for and seen as it ends up.)
async fn active_runs(
    conn: &mut PgConnection,
    thread_id: ResourceId,
    only: Option<&[Uuid]>,
) -> StorageResult<Vec<(Uuid, RunStatus)>> {
    let rows: Vec<(Uuid, String)> = match only {
        None => {
            sqlx::query_as(
                "SELECT run_id, status FROM runs WHERE thread_id = $1 \
                 AND status IN ('pending', 'running') ORDER BY created_at FOR NO KEY UPDATE",
            )
            .bind(thread_id)
            .fetch_all(conn)
            .await?
        }
        Some(ids) => {
            sqlx::query_as(
                "SELECT run_id, status FROM runs WHERE thread_id = $1 \
                 AND status IN ('pending', 'running') \
                 AND run_id = ANY($2) ORDER BY created_at FOR NO KEY UPDATE",
            )
            .bind(thread_id)
            .bind(ids)
            .fetch_all(conn)
            .await?
        }
    };
    parse_active(rows)
}

/// Stops active runs: pending ones end now (`interrupted`, or deleted for a rollback),
/// running ones are flagged for their worker. Returns the ids stopped or flagged.
async fn stop_runs(
    conn: &mut PgConnection,
    thread_id: ResourceId,
    active: &[(Uuid, RunStatus)],
    action: CancelAction,
    now: DateTime<Utc>,
) -> StorageResult<Vec<Uuid>> {
    let (pending, running) = split_active(active);
    if !pending.is_empty() {
        match action {
            CancelAction::Interrupt => {
                sqlx::query(
                    "UPDATE runs SET status = 'interrupted', updated_at = $2, ended_at = $2 \
                     WHERE run_id = ANY($1)",
                )
                .bind(&pending)
                .bind(now)
                .execute(&mut *conn)
                .await?;
                for run_id in &pending {
                    log_run_end(conn, thread_id, *run_id, RunStatus::Interrupted, now).await?;
                }
                notify_logged(conn, thread_id).await?;
            }
            CancelAction::Rollback => delete_runs(conn, &pending).await?,
        }
    }
    if !running.is_empty() {
        // A rollback request wins over an interrupt request, whichever came first.
        sqlx::query(
            "UPDATE runs SET cancel = CASE WHEN $1 = 'rollback' THEN 'rollback' \
             ELSE COALESCE(cancel, $1) END, updated_at = $2 \
             WHERE run_id = ANY($3)",
        )
        .bind(action.as_str())
        .bind(now)
        .bind(&running)
        .execute(&mut *conn)
        .await?;
        // Their workers, in whichever process, stop now rather than at their next renewal.
        notify(conn, CANCEL, running.iter().map(Uuid::to_string)).await?;
    }
    Ok(active.iter().map(|(id, _)| *id).collect())
}

async fn count_active(conn: &mut PgConnection, thread_id: ResourceId) -> StorageResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM runs WHERE thread_id = $1 AND status IN ('pending', 'running')",
    )
    .bind(thread_id)
    .fetch_one(conn)
    .await?)
}

/// The thread's status once runs ended: `busy` while a run is still active, else `status`.
async fn thread_status_after(
    conn: &mut PgConnection,
    thread_id: ResourceId,
    status: ThreadStatus,
) -> StorageResult<ThreadStatus> {
    Ok(if count_active(conn, thread_id).await? > 0 {
        ThreadStatus::Busy
    } else {
        status
    })
}

/// Sets the thread's status (and error) after runs ended without a worker to report values.
/// A thread left busy has another run active, perhaps one queued behind those that ended: the
/// workers of every process are told, at the commit, that it may be claimable now (a rolled-back
/// run's end, say, is followed by the run that rolled it back).
async fn release_thread(
    conn: &mut PgConnection,
    thread_id: ResourceId,
    status: ThreadStatus,
    error: Option<&Value>,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let status = thread_status_after(conn, thread_id, status).await?;
    let error = error.filter(|_| status == ThreadStatus::Error);
    sqlx::query("UPDATE threads SET status = $2, error = $3, updated_at = $4 WHERE thread_id = $1")
        .bind(thread_id)
        .bind(status.as_str())
        .bind(error.map(Json))
        .bind(now)
        .execute(&mut *conn)
        .await?;
    if status == ThreadStatus::Busy {
        notify_runs(conn).await?;
    }
    Ok(())
}

/// Logs the event that closes a run's events ([`RUN_END_EVENT`]), after the thread's last
/// one, in the transaction that ends the run.
async fn log_run_end(
    conn: &mut PgConnection,
    thread_id: ResourceId,
    run_id: Uuid,
    status: RunStatus,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let seq: i64 = sqlx::query_scalar(
        "UPDATE threads SET event_seq = event_seq + 1 WHERE thread_id = $1 RETURNING event_seq",
    )
    .bind(thread_id)
    .fetch_one(&mut *conn)
    .await?;
    let data = end_event_data(run_id, status);
    sqlx::query(
        "INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(thread_id)
    .bind(seq)
    .bind(run_id)
    .bind(RUN_END_EVENT)
    .bind(Json(&data))
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// Logs a run's `error` event after the thread's last one, in the transaction that ends it
/// (before its end event), for a run no worker is left to log it for.
async fn log_run_error(
    conn: &mut PgConnection,
    run: &Run,
    error: &Value,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let seq: i64 = sqlx::query_scalar(
        "UPDATE threads SET event_seq = event_seq + 1 WHERE thread_id = $1 RETURNING event_seq",
    )
    .bind(run.thread_id)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
         VALUES ($1, $2, $3, 'error', $4, $5)",
    )
    .bind(run.thread_id)
    .bind(seq)
    .bind(run.run_id)
    .bind(Json(error))
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

async fn last_seq(conn: &mut PgConnection, thread_id: ResourceId) -> StorageResult<i64> {
    let seq: Option<i64> = sqlx::query_scalar("SELECT event_seq FROM threads WHERE thread_id = $1")
        .bind(thread_id)
        .fetch_optional(conn)
        .await?;
    Ok(seq.unwrap_or(0))
}

/// Appends events to their threads' logs and moves the threads' counters past them, in one
/// statement whatever their number (arrays, not a row of parameters per event, so it stays one
/// prepared statement). A batch that does not continue its thread's counter reuses a seq
/// (`Conflict`).
pub(crate) async fn insert_events(
    conn: &mut PgConnection,
    events: &[LoggedEvent],
) -> StorageResult<()> {
    if events.is_empty() {
        return Ok(());
    }
    let events: Vec<&LoggedEvent> = events.iter().collect();
    let arrays = EventArrays::of(&events);
    let (threads, runs) = (arrays.threads.len(), arrays.runs.len());
    let only_thread = arrays.threads.first().copied().filter(|_| threads == 1);
    // `data` goes in as text cast to json, which keeps it as written. `= ANY($7)` gives the
    // planner the threads' keys: without it a plan may read the whole table for the few rows
    // of the batch. The runs are locked as a foreign key's trigger would lock them, once per
    // run instead of once per event (migration 0013), and after the threads' rows (the lock
    // order, which `moved >= 0` makes explicit): a run deleted before this statement is
    // missing from `runs`; one deleted after waits for this transaction, and deletes these
    // events after it. (A writer's group runs the same statement in `spindle_write_group`.)
    let query = sqlx::query(
        "WITH e AS ( \
             INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
             SELECT t, s, r, e, d::json, c FROM UNNEST($1::text[], $2::int8[], $3::uuid[], \
                 $4::text[], $5::text[], $6::timestamptz[]) AS x(t, s, r, e, d, c) \
         ), moved AS ( \
             UPDATE threads t SET event_seq = u.high \
             FROM UNNEST($7::text[], $8::int8[], $9::int8[]) AS u(id, low, high) \
             WHERE t.thread_id = ANY($7) AND t.thread_id = u.id AND t.event_seq < u.low \
             RETURNING 1 \
         ), held AS ( \
             SELECT 1 FROM runs WHERE run_id = ANY($10) \
                 AND (SELECT count(*) FROM moved) >= 0 FOR KEY SHARE \
         ) \
         SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM held)",
    );
    let counts = arrays
        .bind(query)
        .fetch_one(&mut *conn)
        .await
        .map_err(event_insert_error)?;
    let (moved, runs_found): (i64, i64) = (counts.try_get(0)?, counts.try_get(1)?);
    // The caller's transaction rolls back what the statement inserted.
    if runs_found != runs as i64 {
        return Err(StorageError::NotFound("run"));
    }
    if moved != threads as i64 {
        return Err(match only_thread {
            Some(thread) => seq_taken(thread),
            None => StorageError::Conflict(format!(
                "{} of {threads} threads have logged events at or after those seqs",
                threads as i64 - moved,
            )),
        });
    }
    Ok(())
}

/// Events as the statements that log them take them (the `e_` arrays of
/// `spindle_write_group`, migration 0014): a column each, then each thread's range of seqs
/// and the distinct runs.
#[derive(Default)]
pub(crate) struct EventArrays<'a> {
    thread_ids: Vec<ResourceId>,
    seqs: Vec<i64>,
    run_ids: Vec<Uuid>,
    names: Vec<&'a str>,
    data: Vec<String>,
    created: Vec<DateTime<Utc>>,
    threads: Vec<ResourceId>,
    lows: Vec<i64>,
    highs: Vec<i64>,
    runs: Vec<Uuid>,
}

impl<'a> EventArrays<'a> {
    pub(crate) fn of(events: &[&'a LoggedEvent]) -> Self {
        let mut arrays = Self::default();
        for event in events {
            arrays.thread_ids.push(event.thread_id);
            arrays.seqs.push(event.seq);
            arrays.run_ids.push(event.run_id);
            arrays.names.push(event.event.as_str());
            arrays.data.push(event.data.to_string());
            arrays.created.push(event.created_at);
        }
        for (thread, low, high) in seq_ranges(events.iter().copied()) {
            arrays.threads.push(thread);
            arrays.lows.push(low);
            arrays.highs.push(high);
        }
        arrays.runs = arrays.run_ids.clone();
        arrays.runs.sort_unstable();
        arrays.runs.dedup();
        arrays
    }

    /// Binds the arrays, in the function's order.
    pub(crate) fn bind(self, query: PgQuery<'a>) -> PgQuery<'a> {
        query
            .bind(self.thread_ids)
            .bind(self.seqs)
            .bind(self.run_ids)
            .bind(self.names)
            .bind(self.data)
            .bind(self.created)
            .bind(self.threads)
            .bind(self.lows)
            .bind(self.highs)
            .bind(self.runs)
    }
}

/// Ends a running run whose worker died and that is not to be resumed: a cancelled one as
/// it asked, any other `error` (the worker was lost too often).
async fn end_abandoned(
    conn: &mut PgConnection,
    run: &Run,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let id = run.run_id;
    match run.cancel {
        Some(CancelAction::Rollback) => {
            roll_back(conn, run.thread_id, id).await?;
            release_thread(conn, run.thread_id, ThreadStatus::Idle, None, now).await
        }
        Some(CancelAction::Interrupt) => {
            sqlx::query(
                "UPDATE runs SET status = 'interrupted', lease_expires_at = NULL, updated_at = $2, \
                 ended_at = $2 WHERE run_id = $1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *conn)
            .await?;
            log_run_end(conn, run.thread_id, run.run_id, RunStatus::Interrupted, now).await?;
            release_thread(conn, run.thread_id, ThreadStatus::Idle, None, now).await
        }
        None => {
            let error = worker_lost(run);
            sqlx::query(
                "UPDATE runs SET status = 'error', error = $2, lease_expires_at = NULL, \
                 updated_at = $3, ended_at = $3 WHERE run_id = $1",
            )
            .bind(id)
            .bind(Json(&error))
            .bind(now)
            .execute(&mut *conn)
            .await?;
            // Its streams learn why it ended, as from a run whose graph failed.
            log_run_error(conn, run, &error, now).await?;
            log_run_end(conn, run.thread_id, run.run_id, RunStatus::Error, now).await?;
            release_thread(conn, run.thread_id, ThreadStatus::Error, Some(&error), now).await
        }
    }
}

/// Deletes every run of an assistant being deleted, the active ones included, and releases
/// the threads those held (`idle`, or `busy` while another run of theirs is active), with
/// the runs' events. Returns the runs that were running, for the caller to stop
/// their workers (a worker elsewhere stops when its lease renewal finds the run gone, and
/// its later saves are refused).
pub(crate) async fn delete_assistant_runs(
    conn: &mut PgConnection,
    assistant: ResourceId,
    now: DateTime<Utc>,
) -> StorageResult<Vec<Uuid>> {
    // The threads' rows first, in a fixed order (see the lock order in the module docs).
    let threads: Vec<ResourceId> = sqlx::query_scalar(
        "SELECT thread_id FROM threads WHERE thread_id IN (SELECT thread_id FROM runs \
         WHERE assistant_id = $1 AND status IN ('pending', 'running')) \
         ORDER BY thread_id FOR NO KEY UPDATE",
    )
    .bind(assistant)
    .fetch_all(&mut *conn)
    .await?;
    let gone: Vec<(Uuid, String)> =
        sqlx::query_as("DELETE FROM runs WHERE assistant_id = $1 RETURNING run_id, status")
            .bind(assistant)
            .fetch_all(&mut *conn)
            .await?;
    let ids: Vec<Uuid> = gone.iter().map(|(run, _)| *run).collect();
    delete_events_of_runs(conn, &ids).await?;
    let running = gone
        .into_iter()
        .filter(|(_, status)| status == RunStatus::Running.as_str())
        .map(|(run, _)| run)
        .collect();
    for thread in threads {
        release_thread(conn, thread, ThreadStatus::Idle, None, now).await?;
    }
    Ok(running)
}

/// Deletes runs with their events (migration 0013: no foreign key does it).
async fn delete_runs(conn: &mut PgConnection, runs: &[Uuid]) -> StorageResult<()> {
    sqlx::query("DELETE FROM runs WHERE run_id = ANY($1)")
        .bind(runs)
        .execute(&mut *conn)
        .await?;
    delete_events_of_runs(conn, runs).await
}

/// Deletes the events of runs just deleted. A statement of its own, after the runs': the
/// runs' deletion waited for every transaction logging their events (those hold the runs'
/// rows `FOR KEY SHARE`), and only a later statement's snapshot sees what those committed.
async fn delete_events_of_runs(conn: &mut PgConnection, runs: &[Uuid]) -> StorageResult<()> {
    if !runs.is_empty() {
        sqlx::query("DELETE FROM run_events WHERE run_id = ANY($1)")
            .bind(runs)
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// Deletes the runs and events of a thread whose row this transaction has just deleted
/// (migration 0013: no foreign key does it). After the thread's row: a transaction logging
/// events or creating a run on it locks that row first, so it either committed before the
/// deletion took the row (and this statement's snapshot sees what it wrote) or finds the
/// thread gone and writes nothing.
pub(crate) async fn delete_runs_of_thread(
    conn: &mut PgConnection,
    thread: ResourceId,
) -> StorageResult<()> {
    sqlx::query(
        "WITH r AS (DELETE FROM runs WHERE thread_id = $1) \
         DELETE FROM run_events WHERE thread_id = $1",
    )
    .bind(thread)
    .execute(conn)
    .await?;
    Ok(())
}

/// The running runs of threads, whatever their assistant (their threads are being deleted).
pub(crate) async fn running_runs_of_threads(
    conn: &mut PgConnection,
    threads: &[ResourceId],
) -> StorageResult<Vec<Uuid>> {
    Ok(sqlx::query_scalar(
        "SELECT run_id FROM runs WHERE status = 'running' AND thread_id = ANY($1)",
    )
    .bind(threads)
    .fetch_all(conn)
    .await?)
}

/// Deletes a rolled-back run with what it left on its thread: its events, its
/// checkpoints in every namespace, their pending writes and the blobs only they reached, so
/// the thread's next run continues from where it was before this one. The run's row goes
/// first: a save its worker is making holds that row (`FOR KEY SHARE`), so the deletion
/// waits for it and the checkpoint deletion after it sees what it saved; a later save finds
/// the run gone and is refused (`checkpoints::postgres::insert_checkpoint`).
async fn roll_back(
    conn: &mut PgConnection,
    thread_id: ResourceId,
    run_id: Uuid,
) -> StorageResult<()> {
    delete_runs(conn, &[run_id]).await?;
    delete_run_checkpoints(conn, thread_id.as_str(), run_id).await?;
    Ok(())
}

/// Moves the thread's event counter past whatever the lost worker streamed without logging
/// ([`UNLOGGED_EVENTS_MAX`]).
async fn skip_unlogged(conn: &mut PgConnection, thread_id: ResourceId) -> StorageResult<()> {
    sqlx::query("UPDATE threads SET event_seq = event_seq + $2 WHERE thread_id = $1")
        .bind(thread_id)
        .bind(UNLOGGED_EVENTS_MAX)
        .execute(conn)
        .await?;
    Ok(())
}

async fn claimed(conn: &mut PgConnection, row: RunRow<Uuid>) -> StorageResult<ClaimedRun> {
    let run = Run::try_from(row)?;
    let last_seq = last_seq(conn, run.thread_id).await?;
    Ok(ClaimedRun {
        run,
        last_seq,
        thread_is_new: false,
        start_logged: false,
    })
}

/// What [`claim_pending`] found.
enum PendingClaim {
    Claimed(Box<ClaimedRun>),
    Nothing,
    /// A running run's lease ran out: the claim must deal with it first
    /// ([`PostgresStorage::claim_expired_first`]).
    ExpiredFirst,
}

/// The common claim in one statement, outside a transaction: the oldest due pending run
/// whose thread runs nothing, taken with a lease, with its thread's last seq and whether the
/// thread has a checkpoint yet; nothing when
/// a lease ran out (the transaction of `claim_expired_first` takes it over first). A unique
/// violation means another claim started a run of the same thread first: the caller looks
/// again.
async fn claim_pending(
    pool: &sqlx::PgPool,
    worker_id: &str,
    lease: Duration,
) -> sqlx::Result<PendingClaim> {
    let now = Utc::now();
    let sql = format!(
        "WITH expired AS ( \
             SELECT 1 FROM runs WHERE status = 'running' AND lease_expires_at < $1 LIMIT 1 \
         ), c AS ( \
             SELECT run_id FROM runs r WHERE status = 'pending' AND run_after <= $1 \
             AND NOT EXISTS (SELECT 1 FROM expired) \
             AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.thread_id = r.thread_id \
                             AND o.status = 'running') \
             ORDER BY created_at LIMIT 1 FOR NO KEY UPDATE OF r SKIP LOCKED \
         ), u AS ( \
             UPDATE runs r SET status = 'running', attempt = attempt + 1, lease_owner = $2, \
                 lease_expires_at = $3, updated_at = $1, started_at = COALESCE(started_at, $1) \
             FROM c WHERE r.run_id = c.run_id AND r.status = 'pending' \
             RETURNING {} \
         ) \
         SELECT EXISTS (SELECT 1 FROM expired) AS expired, u.*, \
             (SELECT event_seq FROM threads t WHERE t.thread_id = u.thread_id) AS last_seq, \
             NOT EXISTS (SELECT 1 FROM checkpoints k WHERE k.thread_id = u.thread_id) \
                 AS thread_is_new \
         FROM (SELECT 1) AS one LEFT JOIN u ON true",
        qualified_run_columns()
    );
    let row = sqlx::query(&sql)
        .bind(now)
        .bind(worker_id)
        .bind(lease_end(now, lease))
        .fetch_one(pool)
        .await?;
    if row.try_get::<Option<Uuid>, _>("run_id")?.is_some() {
        let run = Run::try_from(RunRow::<Uuid>::from_row(&row)?)
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        return Ok(PendingClaim::Claimed(Box::new(ClaimedRun {
            run,
            last_seq: row.try_get::<Option<i64>, _>("last_seq")?.unwrap_or(0),
            thread_is_new: row.try_get("thread_is_new")?,
            start_logged: false,
        })));
    }
    Ok(if row.try_get("expired")? {
        PendingClaim::ExpiredFirst
    } else {
        PendingClaim::Nothing
    })
}

/// How a run's creation may insert ([`creation`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Decided {
    /// In `create_run`'s transaction, which locked the thread and read its active runs, each
    /// by a statement of its own (so each saw what committed before it began), and checked
    /// the run's assistant: the run goes in as decided.
    InTransaction,
    /// On its own, as if the thread had no active run: the statement locks the thread (unless
    /// another transaction holds it) and inserts only if that holds and nobody changed the
    /// thread since the statement's snapshot was taken (every run's creation and end updates
    /// the thread's row, so its version tells), and its assistant is as the run was made from
    /// it ([`NewRun::assistant_read`]). Otherwise it inserts nothing, and `create_run`
    /// decides in a transaction.
    IfIdle,
}

/// A run's creation as `spindle_create_group` (migration 0015) takes it: the run's row,
/// inserted with its thread marked busy. A run claimed as it is created also logs its first
/// event ([`start_event_data`]) after the thread's last and learns whether the thread has a
/// checkpoint yet ([`ClaimStart`]).
fn creation(
    scope: &Scope,
    new: &NewRun,
    start: Start,
    now: DateTime<Utc>,
    decided: Decided,
) -> StorageResult<RunCreation> {
    let claimed = start.status == RunStatus::Running;
    Ok(RunCreation {
        run_id: new.run_id,
        thread_id: new.thread_id,
        assistant_id: new.assistant_id,
        user_id: scope.user_id.clone(),
        status: start.status.as_str(),
        kwargs: json(&new.kwargs)?,
        metadata: json(&new.metadata)?,
        multitask_strategy: new.multitask_strategy.as_str(),
        attempt: start.attempt,
        run_after: new.run_after,
        now,
        lease_owner: start.lease_owner,
        lease_expires_at: start.lease_expires_at,
        started_at: start.started_at,
        start_data: claimed.then(|| start_event_data(new.run_id, start.attempt).to_string()),
        decided: decided == Decided::InTransaction,
        assistant_read: new
            .assistant_read
            .map(|read| (read.version, read.updated_at)),
    })
}

/// A run's creation on its own, as if its thread had no active run ([`Decided::IfIdle`]).
pub(crate) fn creation_if_idle(
    scope: &Scope,
    new: &NewRun,
    now: DateTime<Utc>,
) -> StorageResult<RunCreation> {
    let start = Start::of(new.claim_now(&[], now), now);
    creation(scope, new, start, now, Decided::IfIdle)
}

/// Inserts a run decided in the caller's transaction ([`Decided::InTransaction`]), by the
/// creations' call with this run alone; `None` when the thread is not found for the caller.
async fn insert_run(
    conn: &mut PgConnection,
    scope: &Scope,
    new: &NewRun,
    start: Start,
    now: DateTime<Utc>,
) -> StorageResult<Option<RunMade>> {
    let creation = creation(scope, new, start, now, Decided::InTransaction)?;
    let mut made = pg_creator::group::create(conn, &[], &[&creation])
        .await
        .map_err(|e| taken_as_conflict(e, new.run_id))?;
    Ok(made.run(0))
}

/// A creation's error, a run id already taken as [`StorageError::Conflict`].
fn taken_as_conflict(error: StorageError, run_id: Uuid) -> StorageError {
    match error {
        StorageError::Database(e) => {
            conflict_if_taken(e, || format!("run {run_id} already exists"))
        }
        other => other,
    }
}

impl PostgresStorage {
    /// A run the caller can see, by id, and of `thread_id` when given.
    async fn select_run(
        &self,
        scope: &Scope,
        run_id: Uuid,
        thread_id: Option<ResourceId>,
    ) -> StorageResult<Run> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1 \
             AND ($2 IS NULL OR thread_id = $2) AND EXISTS \
             (SELECT 1 FROM threads t WHERE t.thread_id = runs.thread_id \
              AND (t.user_id = $3 OR t.user_id IS NULL))"
        );
        let row: Option<RunRow<Uuid>> = sqlx::query_as(&sql)
            .bind(run_id)
            .bind(thread_id)
            .bind(&scope.user_id)
            .fetch_optional(&self.pool)
            .await?;
        row.ok_or(StorageError::NotFound("run"))?.try_into()
    }
}

impl PostgresStorage {
    /// [`RunStore::claim_run`] when runs whose worker died may be waiting: those first (their
    /// leases taken over, or the runs ended), then a pending run, in one transaction.
    async fn claim_expired_first(
        &self,
        worker_id: &str,
        lease: Duration,
        max_attempts: i32,
    ) -> StorageResult<Option<ClaimedRun>> {
        let mut tx = self.pool.begin().await?;
        let result = async {
            let now = Utc::now();
            let expires = lease_end(now, lease);

            // Runs whose worker died first: they still hold their thread.
            // The thread's row is locked with the run's (skipping both when either is busy), as
            // ending the run sets the thread's status.
            let expired_sql = format!(
                "SELECT {} FROM runs r JOIN threads t ON t.thread_id = r.thread_id \
                 WHERE r.status = 'running' AND r.lease_expires_at < $1 \
                 ORDER BY r.lease_expires_at LIMIT 1 FOR NO KEY UPDATE OF r, t SKIP LOCKED",
                qualified_run_columns()
            );
            let reclaim_sql = format!(
                "UPDATE runs SET attempt = attempt + 1, lease_owner = $2, lease_expires_at = $3, \
                 updated_at = $4 WHERE run_id = $1 RETURNING {RUN_COLUMNS}"
            );
            for _ in 0..EXPIRED_PER_CLAIM {
                let row: Option<RunRow<Uuid>> = sqlx::query_as(&expired_sql)
                    .bind(now)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(row) = row else { break };
                let run = Run::try_from(row)?;
                skip_unlogged(&mut tx, run.thread_id).await?;
                if run.cancel.is_none() && run.attempt < max_attempts {
                    let row: RunRow<Uuid> = sqlx::query_as(&reclaim_sql)
                        .bind(run.run_id)
                        .bind(worker_id)
                        .bind(expires)
                        .bind(now)
                        .fetch_one(&mut *tx)
                        .await?;
                    let claimed = claimed(&mut tx, row).await?;
                    return Ok(Some(claimed));
                }
                end_abandoned(&mut tx, &run, now).await?;
                notify_logged(&mut tx, run.thread_id).await?;
            }

            let claim_sql = format!(
                "UPDATE runs SET status = 'running', attempt = attempt + 1, lease_owner = $2, \
                 lease_expires_at = $3, updated_at = $4, started_at = COALESCE(started_at, $4) \
                 WHERE run_id = $1 AND status = 'pending' \
                 RETURNING {RUN_COLUMNS}"
            );
            for _ in 0..CANDIDATES_PER_CLAIM {
                // In a savepoint: a claim that loses the race for a thread rolls back to here,
                // releasing the candidate's lock, and looks again.
                let mut savepoint = sqlx::Connection::begin(&mut *tx).await?;
                let candidate: Option<Uuid> = sqlx::query_scalar(
                    "SELECT run_id FROM runs r WHERE status = 'pending' AND run_after <= $1 \
                     AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.thread_id = r.thread_id \
                                     AND o.status = 'running') \
                     ORDER BY created_at LIMIT 1 FOR NO KEY UPDATE OF r SKIP LOCKED",
                )
                .bind(now)
                .fetch_optional(&mut *savepoint)
                .await?;
                let Some(candidate) = candidate else {
                    savepoint.rollback().await?;
                    break;
                };
                let row: Result<Option<RunRow<Uuid>>, _> = sqlx::query_as(&claim_sql)
                    .bind(candidate)
                    .bind(worker_id)
                    .bind(expires)
                    .bind(now)
                    .fetch_optional(&mut *savepoint)
                    .await;
                match row {
                    Ok(Some(row)) => {
                        savepoint.commit().await?;
                        let claimed = claimed(&mut tx, row).await?;
                        return Ok(Some(claimed));
                    }
                    Ok(None) => savepoint.rollback().await?,
                    // Another claim started a run of this thread first.
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        savepoint.rollback().await?
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            // Commits the ends of abandoned runs, if any.
            Ok(None)
        }
        .await;
        settle(tx, result).await
    }
}

impl PostgresStorage {
    /// [`RunStore::create_run`] on a thread with no active run, in one statement
    /// ([`Decided::IfIdle`]); `None` when that does not hold (or the thread is missing), for
    /// [`PostgresStorage::create_run_in_transaction`] to decide.
    async fn create_run_if_idle(
        &self,
        scope: &Scope,
        new: &NewRun,
    ) -> StorageResult<Option<CreatedRun>> {
        let creation = creation_if_idle(scope, new, Utc::now())?;
        let made = self
            .creator
            .run(creation)
            .await
            .map_err(|e| taken_as_conflict(e, new.run_id))?;
        Ok(made.map(|(run, claimed)| CreatedRun {
            run,
            cancelled: Vec::new(),
            claimed,
        }))
    }

    /// [`RunStore::create_run`] in a transaction: the thread (created if missing and asked
    /// for) is locked, its active runs read and stopped as the multitask strategy says, then
    /// the run inserted.
    async fn create_run_in_transaction(
        &self,
        scope: &Scope,
        new: NewRun,
    ) -> StorageResult<CreatedRun> {
        let mut tx = self.pool.begin().await?;
        let result = async {
            let now = Utc::now();
            if let Some(read) = &new.assistant_read {
                assistant_unchanged(&mut tx, new.assistant_id, read).await?;
            }
            if let Some(firing) = &new.cron_firing {
                end_firing(&mut tx, firing).await?;
            }
            if !thread_visible(&mut tx, scope, new.thread_id, true).await? {
                let IfThreadMissing::Create { metadata } = &new.if_thread_missing else {
                    return Err(StorageError::NotFound("thread"));
                };
                // Another user's thread of that id is not found, not taken.
                let inserted = sqlx::query(
                    "INSERT INTO threads (thread_id, user_id, metadata, created_at, updated_at, \
                     state_updated_at) VALUES ($1, $2, $3, $4, $4, $4) ON CONFLICT (thread_id) DO NOTHING",
                )
                .bind(new.thread_id)
                .bind(&scope.user_id)
                .bind(Json(metadata))
                .bind(now)
                .execute(&mut *tx)
                .await?;
                // Created meanwhile by the caller's other request, or another user's.
                if inserted.rows_affected() == 0
                    && !thread_visible(&mut tx, scope, new.thread_id, true).await?
                {
                    return Err(StorageError::NotFound("thread"));
                }
            }

            let active = active_runs(&mut tx, new.thread_id, None).await?;
            let cancelled = match new.multitask_strategy {
                MultitaskStrategy::Reject if !active.is_empty() => {
                    return Err(StorageError::Conflict(format!(
                        "thread {} has an active run",
                        new.thread_id
                    )))
                }
                MultitaskStrategy::Interrupt => {
                    stop_runs(&mut tx, new.thread_id, &active, CancelAction::Interrupt, now).await?
                }
                MultitaskStrategy::Rollback => {
                    stop_runs(&mut tx, new.thread_id, &active, CancelAction::Rollback, now).await?
                }
                MultitaskStrategy::Reject | MultitaskStrategy::Enqueue => Vec::new(),
            };

            let start = Start::of(new.claim_now(&active, now), now);
            let (run, claimed) = insert_run(&mut tx, scope, &new, start, now)
                .await?
                .ok_or(StorageError::NotFound("thread"))?;
            Ok(CreatedRun {
                run,
                cancelled,
                claimed,
            })
        }
        .await;
        settle(tx, result).await
    }
}

/// Fails with [`StorageError::AssistantChanged`] unless the assistant is as `read` says; it
/// then stays so until the transaction ends (`FOR SHARE`).
async fn assistant_unchanged(
    conn: &mut PgConnection,
    assistant_id: ResourceId,
    read: &AssistantRead,
) -> StorageResult<()> {
    let unchanged: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM assistants WHERE assistant_id = $1 AND version = $2 AND updated_at = $3 \
         FOR SHARE",
    )
    .bind(assistant_id)
    .bind(read.version)
    .bind(read.updated_at)
    .fetch_optional(conn)
    .await?;
    unchanged.map(|_| ()).ok_or(StorageError::AssistantChanged)
}

#[async_trait]
impl RunStore for PostgresStorage {
    async fn create_run(&self, scope: &Scope, new: NewRun) -> StorageResult<CreatedRun> {
        // Most runs go to an idle thread: one statement then, instead of a transaction of five.
        let created = match new.cron_firing {
            None => self.create_run_if_idle(scope, &new).await?,
            Some(_) => None,
        };
        let assistant_id = new.assistant_id;
        let created = match created {
            Some(created) => created,
            None => match self.create_run_in_transaction(scope, new).await {
                Err(StorageError::AssistantChanged) => {
                    // The copy it was made from is out of date: the caller reads it again.
                    self.assistants.forget(assistant_id);
                    return Err(StorageError::AssistantChanged);
                }
                other => other?,
            },
        };
        if created.run.status == RunStatus::Pending {
            // Workers of every process may claim it (its creator's too). Told after the
            // commit (`pg_notify::Announcer`): a notification in the transaction would hold
            // the database's notification lock through its flush, and runs created while
            // every slot is busy would commit one at a time. Lost to a crash before it is
            // sent, the run waits for the workers' next look: the creator's once restarted,
            // the others' at the next run created or ended, or when a lease of the creator's
            // runs (which filled its slots) runs out.
            self.writer.announce(RUNS, String::new());
        }
        Ok(created)
    }

    async fn get_run(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_id: Uuid,
    ) -> StorageResult<Run> {
        self.select_run(scope, run_id, Some(thread_id)).await
    }

    async fn list_runs(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        filter: RunFilter,
        page: Page,
    ) -> StorageResult<Vec<Run>> {
        let mut conn = self.pool.acquire().await?;
        if !thread_visible(&mut conn, scope, thread_id, false).await? {
            return Err(StorageError::NotFound("thread"));
        }
        let mut qb: QueryBuilder<Postgres> =
            QueryBuilder::new(format!("SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = "));
        qb.push_bind(thread_id);
        if let Some(status) = filter.status {
            qb.push(" AND status = ").push_bind(status.as_str());
        }
        qb.push(" ORDER BY created_at DESC, run_id DESC LIMIT ")
            .push_bind(page.limit)
            .push(" OFFSET ")
            .push_bind(page.offset);
        let rows: Vec<RunRow<Uuid>> = qb.build_query_as().fetch_all(&mut *conn).await?;
        rows.into_iter().map(Run::try_from).collect()
    }

    async fn delete_run(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_id: Uuid,
    ) -> StorageResult<()> {
        let mut tx = self.pool.begin().await?;
        let result = async {
            let status: Option<String> = sqlx::query_scalar(
                "SELECT status FROM runs WHERE run_id = $1 AND thread_id = $2 AND EXISTS \
                 (SELECT 1 FROM threads t WHERE t.thread_id = runs.thread_id \
                  AND (t.user_id = $3 OR t.user_id IS NULL)) FOR UPDATE",
            )
            .bind(run_id)
            .bind(thread_id)
            .bind(&scope.user_id)
            .fetch_optional(&mut *tx)
            .await?;
            let status = status.ok_or(StorageError::NotFound("run"))?;
            if RunStatus::parse(&status).is_some_and(RunStatus::is_active) {
                return Err(StorageError::Conflict(format!("run {run_id} is {status}")));
            }
            delete_runs(&mut tx, &[run_id]).await
        }
        .await;
        settle(tx, result).await
    }

    async fn cancel_runs(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_ids: &[Uuid],
        action: CancelAction,
    ) -> StorageResult<Vec<Uuid>> {
        let mut tx = self.pool.begin().await?;
        let result = async {
            if !thread_visible(&mut tx, scope, thread_id, true).await? {
                return Err(StorageError::NotFound("thread"));
            }
            let active = active_runs(&mut tx, thread_id, Some(run_ids)).await?;
            if active.is_empty() {
                return Err(StorageError::NotFound("run"));
            }
            let now = Utc::now();
            let stopped = stop_runs(&mut tx, thread_id, &active, action, now).await?;
            if count_active(&mut tx, thread_id).await? == 0 {
                sqlx::query(
                    "UPDATE threads SET status = 'idle', updated_at = $2 WHERE thread_id = $1",
                )
                .bind(thread_id)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            Ok(stopped)
        }
        .await;
        settle(tx, result).await
    }

    async fn claim_run(
        &self,
        worker_id: &str,
        lease: Duration,
        max_attempts: i32,
    ) -> StorageResult<Option<ClaimedRun>> {
        for _ in 0..CANDIDATES_PER_CLAIM {
            match claim_pending(&self.pool, worker_id, lease).await {
                Ok(PendingClaim::Claimed(claimed)) => return Ok(Some(*claimed)),
                Ok(PendingClaim::Nothing) => return Ok(None),
                Ok(PendingClaim::ExpiredFirst) => break,
                // Another claim started a run of this thread first.
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.claim_expired_first(worker_id, lease, max_attempts)
            .await
    }

    async fn has_claimable_run(&self) -> StorageResult<bool> {
        // `claim_run`'s two searches, as existence tests; rows locked by a claim in progress
        // count (that claim may still find nothing to take).
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM runs WHERE status = 'running' \
             AND lease_expires_at < $1) OR EXISTS (SELECT 1 FROM runs r \
             WHERE status = 'pending' AND run_after <= $1 AND NOT EXISTS (SELECT 1 FROM runs o \
             WHERE o.thread_id = r.thread_id AND o.status = 'running'))",
        )
        .bind(Utc::now())
        .fetch_one(&self.pool)
        .await?)
    }

    async fn queue_outlook(&self) -> StorageResult<QueueOutlook> {
        let (due, pending) = sqlx::query_as(
            "SELECT LEAST((SELECT MIN(lease_expires_at) FROM runs WHERE status = 'running'), \
             (SELECT MIN(run_after) FROM runs r WHERE status = 'pending' AND NOT EXISTS ( \
                 SELECT 1 FROM runs o WHERE o.thread_id = r.thread_id AND o.status = 'running'))), \
             EXISTS (SELECT 1 FROM runs WHERE status = 'pending' AND run_after <= $1)",
        )
        .bind(Utc::now())
        .fetch_one(&self.pool)
        .await?;
        Ok(QueueOutlook { due, pending })
    }

    async fn hand_back_run(&self, run_id: Uuid, worker_id: &str) -> StorageResult<()> {
        // Expired now: `claim_run` takes expired leases first.
        sqlx::query(
            "WITH handed AS (UPDATE runs SET lease_expires_at = $3 WHERE run_id = $1 \
             AND lease_owner = $2 AND status = 'running' RETURNING 1) \
             SELECT pg_notify($4, '') FROM handed",
        )
        .bind(run_id)
        .bind(worker_id)
        .bind(Utc::now() - chrono::Duration::milliseconds(1))
        .bind(RUNS)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn renew_lease(
        &self,
        run_id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> StorageResult<Option<Run>> {
        let sql = format!(
            "UPDATE runs SET lease_expires_at = $3 WHERE run_id = $1 AND lease_owner = $2 \
             AND status = 'running' RETURNING {RUN_COLUMNS}"
        );
        let row: Option<RunRow<Uuid>> = sqlx::query_as(&sql)
            .bind(run_id)
            .bind(worker_id)
            .bind(lease_end(Utc::now(), lease))
            .fetch_optional(&self.pool)
            .await?;
        row.map(Run::try_from).transpose()
    }

    async fn finish_run(
        &self,
        thread_id: ResourceId,
        run_id: Uuid,
        worker_id: &str,
        end: RunEnd,
    ) -> StorageResult<Option<Run>> {
        if end.status.is_active() {
            return Err(StorageError::Invalid(format!(
                "a run cannot end {}",
                end.status.as_str()
            )));
        }
        // The end goes to its thread's writer, behind the run's saves queued before it.
        self.writer
            .end(thread_id, run_id, worker_id.to_owned(), end)
            .await
    }

    async fn append_events(&self, events: &[LoggedEvent]) -> StorageResult<()> {
        self.writer.queue_events(events.to_vec()).await
    }

    async fn read_events(
        &self,
        thread_id: ResourceId,
        after: i64,
        run_id: Option<Uuid>,
        limit: i64,
    ) -> StorageResult<Vec<LoggedEvent>> {
        let mut qb: QueryBuilder<Postgres> = QueryBuilder::new(
            "SELECT thread_id, seq, run_id, event, data::text AS data, created_at FROM run_events \
             WHERE thread_id = ",
        );
        qb.push_bind(thread_id).push(" AND seq > ").push_bind(after);
        if let Some(run_id) = run_id {
            qb.push(" AND run_id = ").push_bind(run_id);
        }
        qb.push(" ORDER BY seq LIMIT ").push_bind(limit);
        let rows: Vec<EventRow<Uuid>> = qb.build_query_as().fetch_all(&self.pool).await?;
        rows.into_iter().map(LoggedEvent::try_from).collect()
    }

    async fn last_event_seq(&self, thread_id: ResourceId) -> StorageResult<i64> {
        let mut conn = self.pool.acquire().await?;
        last_seq(&mut conn, thread_id).await
    }

    async fn find_run(&self, scope: &Scope, run_id: Uuid) -> StorageResult<Run> {
        self.select_run(scope, run_id, None).await
    }

    async fn prune_events(&self, before: DateTime<Utc>, limit: i64) -> StorageResult<u64> {
        let done = sqlx::query(
            "DELETE FROM run_events WHERE (thread_id, seq) IN (SELECT e.thread_id, e.seq \
             FROM run_events e WHERE e.created_at < $1 \
             AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = e.run_id \
                             AND r.status IN ('pending', 'running')) \
             LIMIT $2)",
        )
        .bind(before)
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn active_runs(
        &self,
        scope: &Scope,
        status: Option<RunStatus>,
    ) -> StorageResult<Vec<(ResourceId, Uuid)>> {
        let rows: Vec<(ResourceId, Uuid)> = sqlx::query_as(
            "SELECT r.thread_id, r.run_id FROM runs r JOIN threads t ON t.thread_id = r.thread_id \
             WHERE r.status IN ('pending', 'running') AND ($1 IS NULL OR r.status = $1) \
             AND (t.user_id = $2 OR t.user_id IS NULL) ORDER BY r.created_at",
        )
        .bind(status.map(RunStatus::as_str))
        .bind(&scope.user_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }
}

/// Commits on success. On failure rolls back now: a transaction merely dropped is rolled back
/// only when its pooled connection is next used, and until then its row locks would make
/// claims skip runs that are free.
async fn settle<T>(tx: Transaction<'_, Postgres>, result: StorageResult<T>) -> StorageResult<T> {
    match result {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(error) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(%rollback, "rolling back a failed run transaction");
            }
            Err(error)
        }
    }
}

/// [`RUN_COLUMNS`] of the table aliased `r`.
fn qualified_run_columns() -> String {
    RUN_COLUMNS
        .split(", ")
        .map(|column| format!("r.{column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A taken seq is a conflict.
fn event_insert_error(error: sqlx::Error) -> StorageError {
    conflict_if_taken(error, || {
        "an event of that seq is already logged".to_owned()
    })
}

/// Ends a cron firing in flight, in the transaction creating its run; `Conflict` when it is
/// no longer in flight (made by another scheduler).
async fn end_firing(tx: &mut PgConnection, firing: &FiringId) -> StorageResult<()> {
    let ended = sqlx::query(
        "UPDATE crons SET firing_due = NULL, firing_claimed_at = NULL \
         WHERE cron_id = $1 AND firing_due = $2",
    )
    .bind(firing.cron_id)
    .bind(firing.due)
    .execute(&mut *tx)
    .await?;
    if ended.rows_affected() == 0 {
        return Err(firing_made(firing));
    }
    Ok(())
}
