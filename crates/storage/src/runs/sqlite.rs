//! [`RunStore`] on SQLite.
//!
//! Every write is a closure run by the writer thread (`sqlite_writer`), so two claims of this
//! process never interleave; the partial unique index still guards the
//! one-running-run-per-thread rule. Reads use the sqlx read pool.
//! Lists of ids are bound as one JSON array and expanded with `json_each`, so each statement
//! has a fixed set of parameters.

use crate::ResourceId;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension};
use serde_json::Value;
use sqlx::{QueryBuilder, Sqlite};
use uuid::fmt::Hyphenated;
use uuid::Uuid;

use super::*;
use crate::checkpoints::checkpoint_stored_sqlite as checkpoint_stored;
use crate::checkpoints::delete_run_checkpoints_sqlite as delete_run_checkpoints;
use crate::crons::firing_made;
use crate::error::{sqlite_conflict_if_taken, sqlite_constraint};
use crate::sqlite::SqliteStorage;
use crate::sqlite_notices;
use crate::sqlite_values::{id, json, ts, RowExt, StoredId};
use crate::StorageError;
use crate::Wakeup;

fn id_list<I: StoredId + Copy>(ids: &[I]) -> String {
    let ids: Vec<String> = ids.iter().map(|id| id.stored_text()).collect();
    Value::from(ids).to_string()
}

/// Runs a cached statement.
fn exec(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> StorageResult<usize> {
    Ok(conn.prepare_cached(sql)?.execute(params)?)
}

/// A run read back with `RETURNING` or `SELECT` of [`RUN_COLUMNS`].
fn run_row(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> StorageResult<Option<Run>> {
    let row = conn
        .prepare_cached(sql)?
        .query_row(params, RunRow::from_sqlite)
        .optional()?;
    row.map(Run::try_from).transpose()
}

fn thread_visible(conn: &Connection, scope: &Scope, thread_id: ResourceId) -> StorageResult<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM threads WHERE thread_id = ?1 AND (user_id = ?2 OR user_id IS NULL)",
        )?
        .exists((id(thread_id), &scope.user_id))?)
}

/// The thread's active runs, oldest first; only those among `only` when given.
fn active_runs(
    conn: &Connection,
    thread_id: ResourceId,
    only: Option<&[Uuid]>,
) -> StorageResult<Vec<(Uuid, RunStatus)>> {
    let mut statement = conn.prepare_cached(
        "SELECT run_id, status FROM runs WHERE thread_id = ?1 \
         AND status IN ('pending', 'running') \
         AND (?2 IS NULL OR run_id IN (SELECT value FROM json_each(?2))) ORDER BY created_at",
    )?;
    let rows = statement
        .query_map((id(thread_id), only.map(id_list)), |r| {
            Ok((r.uuid("run_id")?, r.get::<_, String>("status")?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    parse_active(rows)
}

/// Stops active runs: pending ones end now (`interrupted`, or deleted for a rollback),
/// running ones are flagged for their worker. Returns the ids stopped or flagged.
fn stop_runs(
    conn: &Connection,
    thread_id: ResourceId,
    active: &[(Uuid, RunStatus)],
    action: CancelAction,
    now: DateTime<Utc>,
) -> StorageResult<Vec<Uuid>> {
    let (pending, running) = split_active(active);
    if !pending.is_empty() {
        match action {
            CancelAction::Interrupt => {
                exec(
                    conn,
                    "UPDATE runs SET status = 'interrupted', updated_at = ?2, ended_at = ?2 \
                     WHERE run_id IN (SELECT value FROM json_each(?1))",
                    (id_list(&pending), ts(now)),
                )?;
                for run_id in &pending {
                    log_run_end(conn, thread_id, *run_id, RunStatus::Interrupted, now)?;
                }
            }
            CancelAction::Rollback => {
                exec(
                    conn,
                    "DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each(?1))",
                    [id_list(&pending)],
                )?;
            }
        }
    }
    if !running.is_empty() {
        // A rollback request wins over an interrupt request, whichever came first.
        exec(
            conn,
            "UPDATE runs SET cancel = CASE WHEN ?1 = 'rollback' THEN 'rollback' \
             ELSE COALESCE(cancel, ?1) END, updated_at = ?2 \
             WHERE run_id IN (SELECT value FROM json_each(?3))",
            (action.as_str(), ts(now), id_list(&running)),
        )?;
    }
    Ok(active.iter().map(|(id, _)| *id).collect())
}

fn count_active(conn: &Connection, thread_id: ResourceId) -> StorageResult<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT COUNT(*) FROM runs WHERE thread_id = ?1 AND status IN ('pending', 'running')",
        )?
        .query_row([id(thread_id)], |r| r.get(0))?)
}

/// The thread's status once runs ended: `busy` while a run is still active, else `status`.
fn thread_status_after(
    conn: &Connection,
    thread_id: ResourceId,
    status: ThreadStatus,
) -> StorageResult<ThreadStatus> {
    Ok(if count_active(conn, thread_id)? > 0 {
        ThreadStatus::Busy
    } else {
        status
    })
}

/// Sets the thread's status (and error) after runs ended without a worker to report values.
fn release_thread(
    conn: &Connection,
    thread_id: ResourceId,
    status: ThreadStatus,
    error: Option<&Value>,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let status = thread_status_after(conn, thread_id, status)?;
    let error = error.filter(|_| status == ThreadStatus::Error);
    exec(
        conn,
        "UPDATE threads SET status = ?2, error = ?3, updated_at = ?4 WHERE thread_id = ?1",
        (
            id(thread_id),
            status.as_str(),
            error.map(json).transpose()?,
            ts(now),
        ),
    )?;
    if status == ThreadStatus::Busy {
        // Another run is active, perhaps one queued behind those that ended.
        sqlite_notices::notice(Wakeup::RunsQueued);
    }
    Ok(())
}

/// Logs the event that closes a run's events ([`RUN_END_EVENT`]), after the thread's last
/// one, in the transaction that ends the run.
fn log_run_end(
    conn: &Connection,
    thread_id: ResourceId,
    run_id: Uuid,
    status: RunStatus,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let seq = next_seq(conn, thread_id)?;
    insert_run_end(conn, thread_id, seq, run_id, status, now)?;
    // No worker tells its streams: the run was pending, or its worker is gone.
    sqlite_notices::notice_logged(thread_id, seq);
    Ok(())
}

/// Takes the thread's next event seq.
fn next_seq(conn: &Connection, thread_id: ResourceId) -> StorageResult<i64> {
    Ok(conn
        .prepare_cached(
            "UPDATE threads SET event_seq = event_seq + 1 WHERE thread_id = ?1 RETURNING event_seq",
        )?
        .query_row([id(thread_id)], |r| r.get(0))?)
}

/// Logs a run's `error` event after the thread's last one, in the transaction that ends it
/// (before its end event), for a run no worker is left to log it for.
fn log_run_error(
    conn: &Connection,
    run: &Run,
    error: &serde_json::Value,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let seq = next_seq(conn, run.thread_id)?;
    exec(
        conn,
        INSERT_EVENT,
        (
            id(run.thread_id),
            seq,
            id(run.run_id),
            "error",
            error.to_string(),
            ts(now),
        ),
    )?;
    Ok(())
}

/// Inserts a run's [`RUN_END_EVENT`] at `seq` (the caller moves the thread's counter).
fn insert_run_end(
    conn: &Connection,
    thread_id: ResourceId,
    seq: i64,
    run_id: Uuid,
    status: RunStatus,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let data = end_event_data(run_id, status);
    exec(
        conn,
        INSERT_EVENT,
        (
            id(thread_id),
            seq,
            id(run_id),
            RUN_END_EVENT,
            data.to_string(),
            ts(now),
        ),
    )?;
    Ok(())
}

const INSERT_EVENT: &str = "INSERT INTO run_events (thread_id, seq, run_id, event, data, \
     created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

fn last_seq(conn: &Connection, thread_id: ResourceId) -> StorageResult<i64> {
    let seq: Option<i64> = conn
        .prepare_cached("SELECT event_seq FROM threads WHERE thread_id = ?1")?
        .query_row([id(thread_id)], |r| r.get(0))
        .optional()?;
    Ok(seq.unwrap_or(0))
}

/// For a run claimed as it is created: logs its first event ([`start_event_data`]) after the
/// thread's last, and tells whether the thread has no checkpoint yet (in any namespace: a
/// key-prefix probe).
fn claim_start(conn: &Connection, run: &Run) -> StorageResult<ClaimStart> {
    let (seq, thread_is_new): (Option<i64>, bool) = conn
        .prepare_cached(
            "SELECT (SELECT event_seq FROM threads WHERE thread_id = ?1), \
             NOT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = ?1)",
        )?
        .query_row([id(run.thread_id)], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let start = LoggedEvent {
        thread_id: run.thread_id,
        seq: seq.unwrap_or(0) + 1,
        run_id: run.run_id,
        event: "metadata".to_owned(),
        data: start_event_data(run.run_id, run.attempt),
        created_at: run.created_at,
    };
    insert_events(conn, &EventRows::new(std::slice::from_ref(&start)))?;
    Ok(ClaimStart {
        last_seq: start.seq,
        thread_is_new,
    })
}

/// Logged events as their rows, encoded on the caller's thread: the writer thread, which
/// only inserts them, is the bottleneck.
pub(crate) struct EventRows {
    rows: Vec<EncodedEvent>,
    /// `(thread_id, lowest seq, highest seq)` of each thread the events are for.
    ranges: Vec<(ResourceId, i64, i64)>,
}

struct EncodedEvent {
    thread_id: String,
    seq: i64,
    /// `None` for an event no run made (a state update).
    run_id: Option<String>,
    event: String,
    data: String,
    created_at: String,
}

impl EventRows {
    pub(crate) fn new(events: &[LoggedEvent]) -> Self {
        let rows = events
            .iter()
            .map(|event| EncodedEvent {
                thread_id: id(event.thread_id),
                seq: event.seq,
                // The nil id marks an event no run made.
                run_id: (!event.run_id.is_nil()).then(|| id(event.run_id)),
                event: event.event.clone(),
                data: event.data.to_string(),
                created_at: ts(event.created_at),
            })
            .collect();
        Self {
            rows,
            ranges: seq_ranges(events),
        }
    }

    /// The events of several batches, in order, as one: inserted with one move of each
    /// thread's counter instead of one per batch.
    pub(crate) fn concat(parts: impl IntoIterator<Item = EventRows>) -> Option<Self> {
        let mut all: Option<Self> = None;
        for part in parts {
            let Some(all) = all.as_mut() else {
                all = Some(part);
                continue;
            };
            for (thread_id, low, high) in part.ranges {
                match all.ranges.iter_mut().find(|(t, _, _)| *t == thread_id) {
                    Some((_, l, h)) => {
                        *l = (*l).min(low);
                        *h = (*h).max(high);
                    }
                    None => all.ranges.push((thread_id, low, high)),
                }
            }
            all.rows.extend(part.rows);
        }
        all
    }

    /// Inserts the rows, without moving the threads' counters.
    fn insert(&self, conn: &Connection) -> StorageResult<()> {
        let mut insert = conn.prepare_cached(INSERT_EVENT)?;
        for e in &self.rows {
            insert
                .execute((
                    &e.thread_id,
                    e.seq,
                    &e.run_id,
                    &e.event,
                    &e.data,
                    &e.created_at,
                ))
                .map_err(event_insert_error)?;
        }
        Ok(())
    }
}

/// Appends events to their threads' logs and moves the threads' counters past them; a batch
/// that does not continue a counter reuses a seq (`Conflict`).
pub(crate) fn insert_events(conn: &Connection, events: &EventRows) -> StorageResult<()> {
    events.insert(conn)?;
    for &(thread_id, low, high) in &events.ranges {
        let moved = exec(
            conn,
            "UPDATE threads SET event_seq = ?2 WHERE thread_id = ?1 AND event_seq < ?3",
            (id(thread_id), high, low),
        )?;
        if moved == 0 {
            return Err(seq_taken(thread_id));
        }
    }
    Ok(())
}

/// Ends a running run whose worker died and that is not to be resumed: a cancelled one as
/// it asked, any other `error` (the worker was lost too often).
fn end_abandoned(conn: &Connection, run: &Run, now: DateTime<Utc>) -> StorageResult<()> {
    let run_id = id(run.run_id);
    match run.cancel {
        Some(CancelAction::Rollback) => {
            roll_back(conn, run.thread_id, run.run_id)?;
            release_thread(conn, run.thread_id, ThreadStatus::Idle, None, now)
        }
        Some(CancelAction::Interrupt) => {
            exec(
                conn,
                "UPDATE runs SET status = 'interrupted', lease_expires_at = NULL, updated_at = ?2, \
                 ended_at = ?2 WHERE run_id = ?1",
                (run_id, ts(now)),
            )?;
            log_run_end(conn, run.thread_id, run.run_id, RunStatus::Interrupted, now)?;
            release_thread(conn, run.thread_id, ThreadStatus::Idle, None, now)
        }
        None => {
            let error = worker_lost(run);
            exec(
                conn,
                "UPDATE runs SET status = 'error', error = ?2, lease_expires_at = NULL, \
                 updated_at = ?3, ended_at = ?3 WHERE run_id = ?1",
                (run_id, json(&error)?, ts(now)),
            )?;
            // Its streams learn why it ended, as from a run whose graph failed.
            log_run_error(conn, run, &error, now)?;
            log_run_end(conn, run.thread_id, run.run_id, RunStatus::Error, now)?;
            release_thread(conn, run.thread_id, ThreadStatus::Error, Some(&error), now)
        }
    }
}

/// Deletes every run of an assistant being deleted, the active ones included, and releases
/// the threads those held (`idle`, or `busy` while another run of theirs is active). The
/// runs' events go by cascade. Returns the runs that were running, for the caller to stop
/// their workers (a worker elsewhere stops when its lease renewal finds the run gone, and
/// its later saves are refused).
pub(crate) fn delete_assistant_runs(
    conn: &Connection,
    assistant: ResourceId,
    now: DateTime<Utc>,
) -> StorageResult<Vec<Uuid>> {
    let active: Vec<(Uuid, ResourceId, String)> = conn
        .prepare_cached(
            "SELECT run_id, thread_id, status FROM runs WHERE assistant_id = ?1 \
             AND status IN ('pending', 'running')",
        )?
        .query_map([id(assistant)], |r| {
            Ok((
                r.uuid("run_id")?,
                r.resource_id("thread_id")?,
                r.get("status")?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    exec(
        conn,
        "DELETE FROM runs WHERE assistant_id = ?1",
        [id(assistant)],
    )?;
    let mut threads: Vec<ResourceId> = active.iter().map(|(_, thread, _)| *thread).collect();
    threads.sort();
    threads.dedup();
    for thread in threads {
        release_thread(conn, thread, ThreadStatus::Idle, None, now)?;
    }
    Ok(running_of(active))
}

/// The running ones among `(run_id, thread_id, status)` rows.
fn running_of(rows: Vec<(Uuid, ResourceId, String)>) -> Vec<Uuid> {
    rows.into_iter()
        .filter(|(_, _, status)| status == RunStatus::Running.as_str())
        .map(|(run, _, _)| run)
        .collect()
}

/// The running runs of threads, whatever their assistant (their threads are being deleted).
pub(crate) fn running_runs_of_threads(
    conn: &Connection,
    threads: &[ResourceId],
) -> StorageResult<Vec<Uuid>> {
    let rows: Vec<(Uuid, ResourceId, String)> = conn
        .prepare_cached(
            "SELECT run_id, thread_id, status FROM runs WHERE status = 'running' \
             AND thread_id IN (SELECT value FROM json_each(?1))",
        )?
        .query_map([id_list(threads)], |r| {
            Ok((
                r.uuid("run_id")?,
                r.resource_id("thread_id")?,
                r.get("status")?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(running_of(rows))
}

/// Deletes a rolled-back run with what it left on its thread: its events (by cascade), its
/// checkpoints in every namespace, their pending writes and the blobs only they reached, so
/// the thread's next run continues from where it was before this one. The run's row goes
/// first; from then on any save its worker still makes is refused
/// (`checkpoints::sqlite::require_live_run`), so nothing of it lands on the thread later.
fn roll_back(conn: &Connection, thread_id: ResourceId, run_id: Uuid) -> StorageResult<()> {
    exec(conn, "DELETE FROM runs WHERE run_id = ?1", [id(run_id)])?;
    delete_run_checkpoints(conn, &id(thread_id), &id(run_id))?;
    Ok(())
}

/// Moves the thread's event counter past whatever the lost worker streamed without logging
/// ([`UNLOGGED_EVENTS_MAX`]).
fn skip_unlogged(conn: &Connection, thread_id: ResourceId) -> StorageResult<()> {
    exec(
        conn,
        "UPDATE threads SET event_seq = event_seq + ?2 WHERE thread_id = ?1",
        (id(thread_id), UNLOGGED_EVENTS_MAX),
    )?;
    Ok(())
}

fn claimed(conn: &Connection, run: Run) -> StorageResult<ClaimedRun> {
    let last_seq = last_seq(conn, run.thread_id)?;
    Ok(ClaimedRun {
        run,
        last_seq,
        thread_is_new: false,
        start_logged: false,
    })
}

/// Fails with [`StorageError::AssistantChanged`] unless the assistant is as `read` says (it
/// was updated or deleted since the run was made from it).
fn assistant_unchanged(
    conn: &Connection,
    assistant_id: ResourceId,
    read: &AssistantRead,
) -> StorageResult<()> {
    let unchanged = conn
        .prepare_cached(
            "SELECT 1 FROM assistants WHERE assistant_id = ?1 AND version = ?2 AND updated_at = ?3",
        )?
        .exists((id(assistant_id), read.version, ts(read.updated_at)))?;
    match unchanged {
        true => Ok(()),
        false => Err(StorageError::AssistantChanged),
    }
}

/// A new run's JSON columns, encoded on the caller's thread: the writer thread, which only
/// inserts them, is the bottleneck.
struct EncodedNewRun {
    kwargs: String,
    metadata: String,
    /// The metadata of the thread to create when it is missing.
    thread_metadata: Option<String>,
}

impl EncodedNewRun {
    fn new(new: &NewRun) -> StorageResult<Self> {
        Ok(Self {
            kwargs: json(&new.kwargs)?,
            metadata: json(&new.metadata)?,
            thread_metadata: match &new.if_thread_missing {
                IfThreadMissing::Create { metadata } => Some(json(metadata)?),
                IfThreadMissing::Reject => None,
            },
        })
    }
}

fn create_run(
    conn: &Connection,
    scope: &Scope,
    new: NewRun,
    encoded: EncodedNewRun,
) -> StorageResult<CreatedRun> {
    let now = Utc::now();
    if let Some(read) = &new.assistant_read {
        assistant_unchanged(conn, new.assistant_id, read)?;
    }
    if let Some(firing) = &new.cron_firing {
        end_firing(conn, firing)?;
    }
    if !thread_visible(conn, scope, new.thread_id)? {
        let Some(metadata) = &encoded.thread_metadata else {
            return Err(StorageError::NotFound("thread"));
        };
        // Another user's thread of that id is not found, not taken.
        let inserted = exec(
            conn,
            "INSERT INTO threads (thread_id, user_id, metadata, created_at, updated_at, \
             state_updated_at) VALUES (?1, ?2, ?3, ?4, ?4, ?4) ON CONFLICT (thread_id) DO NOTHING",
            (id(new.thread_id), &scope.user_id, metadata, ts(now)),
        )?;
        if inserted == 0 {
            return Err(StorageError::NotFound("thread"));
        }
    }

    let active = active_runs(conn, new.thread_id, None)?;
    let cancelled = match new.multitask_strategy {
        MultitaskStrategy::Reject if !active.is_empty() => {
            return Err(StorageError::Conflict(format!(
                "thread {} has an active run",
                new.thread_id
            )))
        }
        MultitaskStrategy::Interrupt => {
            stop_runs(conn, new.thread_id, &active, CancelAction::Interrupt, now)?
        }
        MultitaskStrategy::Rollback => {
            stop_runs(conn, new.thread_id, &active, CancelAction::Rollback, now)?
        }
        MultitaskStrategy::Reject | MultitaskStrategy::Enqueue => Vec::new(),
    };

    let start = Start::of(new.claim_now(&active, now), now);
    let mut new = new;
    let kwargs = match inherit_thread_metadata(conn, &mut new)? {
        true => json(&new.kwargs)?,
        false => encoded.kwargs,
    };
    exec(
        conn,
        "INSERT INTO runs (run_id, thread_id, assistant_id, user_id, status, kwargs, metadata, \
         multitask_strategy, attempt, run_after, created_at, updated_at, lease_owner, \
         lease_expires_at, started_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, ?12, ?13, ?14)",
        (
            id(new.run_id),
            id(new.thread_id),
            id(new.assistant_id),
            &scope.user_id,
            start.status.as_str(),
            &kwargs,
            &encoded.metadata,
            new.multitask_strategy.as_str(),
            start.attempt,
            ts(new.run_after),
            ts(now),
            &start.lease_owner,
            start.lease_expires_at.map(ts),
            start.started_at.map(ts),
        ),
    )
    .map_err(|e| taken(e, || format!("run {} already exists", new.run_id)))?;
    // A run on a thread that is not busy names its graph and assistant in the thread's
    // metadata, over what was there, as the reference does (UIs list a graph's threads by
    // them). A run queued behind another leaves them to the one running.
    exec(
        conn,
        "UPDATE threads SET metadata = COALESCE(CASE WHEN status <> 'busy' THEN ( \
             SELECT json_set(threads.metadata, '$.graph_id', a.graph_id, \
                             '$.assistant_id', a.assistant_id) \
             FROM assistants a WHERE a.assistant_id = ?3) END, metadata), \
         status = 'busy', updated_at = ?2 WHERE thread_id = ?1",
        (id(new.thread_id), ts(now), id(new.assistant_id)),
    )?;
    // The row as inserted, without reading it back (timestamps are stored at full precision).
    let run = start.run(new, scope, now);
    let claimed = match run.status {
        RunStatus::Running => Some(claim_start(conn, &run)?),
        _ => None,
    };
    Ok(CreatedRun {
        run,
        cancelled,
        claimed,
    })
}

/// Adds the thread's metadata to what the run's graph inherits (`INHERITED_METADATA`); true
/// when it changed the kwargs.
fn inherit_thread_metadata(conn: &Connection, new: &mut NewRun) -> StorageResult<bool> {
    let stored: Option<String> = conn
        .prepare_cached("SELECT metadata FROM threads WHERE thread_id = ?1")?
        .query_row([id(new.thread_id)], |r| r.get(0))
        .optional()?;
    let thread: JsonObject = match stored.as_deref().map(serde_json::from_str) {
        Some(Ok(thread)) => thread,
        _ => return Ok(false),
    };
    Ok(super::inherit_metadata(&mut new.kwargs, thread))
}

/// Ends a cron firing in flight, in the transaction creating its run; `Conflict` when it is
/// no longer in flight (made by another scheduler).
fn end_firing(conn: &Connection, firing: &FiringId) -> StorageResult<()> {
    let ended = exec(
        conn,
        "UPDATE crons SET firing_due = NULL, firing_claimed_at = NULL \
         WHERE cron_id = ?1 AND firing_due = ?2",
        (id(firing.cron_id), ts(firing.due)),
    )?;
    if ended == 0 {
        return Err(firing_made(firing));
    }
    Ok(())
}

/// A taken primary key as a conflict with `message`; any other error as it is.
fn taken(error: StorageError, message: impl FnOnce() -> String) -> StorageError {
    match error {
        StorageError::Sqlite(e) => sqlite_conflict_if_taken(e, message),
        other => other,
    }
}

fn claim_run(
    conn: &Connection,
    worker_id: &str,
    lease: Duration,
    max_attempts: i32,
) -> StorageResult<Option<ClaimedRun>> {
    let now = Utc::now();
    let expires = ts(lease_end(now, lease));

    // Runs whose worker died first: they still hold their thread.
    let expired_sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running' AND lease_expires_at < ?1 \
         ORDER BY lease_expires_at LIMIT 1"
    );
    let reclaim_sql = format!(
        "UPDATE runs SET attempt = attempt + 1, lease_owner = ?2, lease_expires_at = ?3, \
         updated_at = ?4 WHERE run_id = ?1 RETURNING {RUN_COLUMNS}"
    );
    for _ in 0..EXPIRED_PER_CLAIM {
        let Some(run) = run_row(conn, &expired_sql, [ts(now)])? else {
            break;
        };
        skip_unlogged(conn, run.thread_id)?;
        if run.cancel.is_none() && run.attempt < max_attempts {
            let run = run_row(
                conn,
                &reclaim_sql,
                (id(run.run_id), worker_id, &expires, ts(now)),
            )?
            .ok_or(StorageError::NotFound("run"))?;
            return claimed(conn, run).map(Some);
        }
        end_abandoned(conn, &run, now)?;
    }

    // One statement picks and claims: all writes go through the one writer thread, so no
    // other claim can run between the pick and the update (the partial unique index on
    // running runs still guards the rule).
    let claim_sql = format!(
        "UPDATE runs SET status = 'running', attempt = attempt + 1, lease_owner = ?1, \
         lease_expires_at = ?2, updated_at = ?3, started_at = COALESCE(started_at, ?3) \
         WHERE run_id = (SELECT run_id FROM runs r WHERE status = 'pending' \
                         AND run_after <= ?3 AND NOT EXISTS (SELECT 1 FROM runs o \
                         WHERE o.thread_id = r.thread_id AND o.status = 'running') \
                         ORDER BY created_at LIMIT 1) \
         RETURNING {RUN_COLUMNS}"
    );
    match run_row(conn, &claim_sql, (worker_id, &expires, ts(now)))? {
        Some(run) => claimed(conn, run).map(Some),
        None => Ok(None),
    }
}

/// Whether `claim_run` would find a run at `?1` (now): its two searches, as existence tests.
const CLAIMABLE_RUN_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM runs WHERE status = 'running' \
     AND lease_expires_at < ?1) OR EXISTS (SELECT 1 FROM runs r WHERE status = 'pending' \
     AND run_after <= ?1 AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.thread_id = r.thread_id \
     AND o.status = 'running'))";

/// See [`RunStore::queue_outlook`] (`MIN` over both skips a side without rows).
const QUEUE_OUTLOOK: &str = "SELECT (SELECT MIN(t) FROM ( \
     SELECT MIN(lease_expires_at) AS t FROM runs WHERE status = 'running' UNION ALL \
     SELECT MIN(run_after) FROM runs r WHERE status = 'pending' AND NOT EXISTS ( \
         SELECT 1 FROM runs o WHERE o.thread_id = r.thread_id AND o.status = 'running'))) AS due, \
     EXISTS (SELECT 1 FROM runs WHERE status = 'pending' AND run_after <= ?1) AS pending";

/// A run's end, encoded on the caller's thread.
struct EncodedEnd {
    status: RunStatus,
    error: Option<String>,
    thread_status: ThreadStatus,
    thread_values: Option<String>,
    thread_interrupts: String,
    events: EventRows,
    after_checkpoint: Option<String>,
}

impl EncodedEnd {
    fn new(end: &RunEnd) -> StorageResult<Self> {
        Ok(Self {
            status: end.status,
            error: end.error.as_ref().map(json).transpose()?,
            thread_status: end.thread_status,
            thread_values: end.thread_values.as_ref().map(json).transpose()?,
            thread_interrupts: json(&end.thread_interrupts)?,
            events: EventRows::new(&end.events),
            after_checkpoint: end.after_checkpoint.clone(),
        })
    }
}

/// Ends a run and sets its thread's state, status and event counter, with one write of the
/// thread's row: the run's last events and its end event continue the counter read with
/// the run.
fn finish_run(
    conn: &Connection,
    run_id: Uuid,
    worker_id: &str,
    end: EncodedEnd,
) -> StorageResult<Option<Run>> {
    let held: Option<(ResourceId, Option<String>, i64)> = conn
        .prepare_cached(
            "SELECT r.thread_id, r.cancel, t.event_seq FROM runs r \
             JOIN threads t ON t.thread_id = r.thread_id \
             WHERE r.run_id = ?1 AND r.status = 'running' AND r.lease_owner = ?2",
        )?
        .query_row((id(run_id), worker_id), |r| {
            Ok((
                r.resource_id("thread_id")?,
                r.get("cancel")?,
                r.get("event_seq")?,
            ))
        })
        .optional()?;
    let (thread_id, cancel, logged) = held.ok_or(StorageError::NotFound("run"))?;
    if let Some(checkpoint_id) = &end.after_checkpoint {
        require_checkpoint(conn, thread_id, checkpoint_id)?;
    }
    let now = Utc::now();
    if cancel.as_deref() == Some(CancelAction::Rollback.as_str()) {
        // Its saves were all applied before this write (the end is queued behind them and
        // `after_checkpoint` was checked), so deleting them here leaves none behind. The
        // thread keeps the values and interrupts it had before the run, as the reference does.
        roll_back(conn, thread_id, run_id)?;
        release_thread(conn, thread_id, ThreadStatus::Idle, None, now)?;
        return Ok(None);
    }
    let sql = format!(
        "UPDATE runs SET status = ?2, error = ?3, lease_expires_at = NULL, updated_at = ?4, \
         ended_at = ?4, output = ?5 WHERE run_id = ?1 RETURNING {RUN_COLUMNS}"
    );
    // The output is the thread's new values, bound from the text already encoded for the
    // thread's row: no second encoding.
    let run = run_row(
        conn,
        &sql,
        (
            id(run_id),
            end.status.as_str(),
            &end.error,
            ts(now),
            &end.thread_values,
        ),
    )?;
    // The run's own events: all of its thread, after what the thread has logged.
    let mut last = logged;
    for &(_, low, high) in &end.events.ranges {
        if low <= logged {
            return Err(seq_taken(thread_id));
        }
        last = last.max(high);
    }
    end.events.insert(conn)?;
    let end_seq = last + 1;
    insert_run_end(conn, thread_id, end_seq, run_id, end.status, now)?;
    let status = thread_status_after(conn, thread_id, end.thread_status)?;
    if status == ThreadStatus::Busy {
        // A run queued behind this one can start now.
        sqlite_notices::notice(Wakeup::RunsQueued);
    }
    let error = end.error.filter(|_| status == ThreadStatus::Error);
    exec(
        conn,
        "UPDATE threads SET status = ?2, state_values = ?3, interrupts = ?4, error = ?5, \
         state_updated_at = ?6, updated_at = ?6, event_seq = ?7 WHERE thread_id = ?1",
        (
            id(thread_id),
            status.as_str(),
            end.thread_values,
            end.thread_interrupts,
            error,
            ts(now),
            end_seq,
        ),
    )?;
    Ok(run)
}

/// Refuses a run's end whose last checkpoint is not stored (its save failed).
fn require_checkpoint(
    conn: &Connection,
    thread_id: ResourceId,
    checkpoint_id: &str,
) -> StorageResult<()> {
    checkpoint_stored(conn, &id(thread_id), "", checkpoint_id)?
        .then_some(())
        .ok_or_else(|| unsaved(checkpoint_id))
}

impl SqliteStorage {
    /// A run the caller can see, by id, and of `thread_id` when given.
    async fn select_run(
        &self,
        scope: &Scope,
        run_id: Uuid,
        thread_id: Option<ResourceId>,
    ) -> StorageResult<Run> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1 \
             AND (?2 IS NULL OR thread_id = ?2) AND EXISTS \
             (SELECT 1 FROM threads t WHERE t.thread_id = runs.thread_id \
              AND (t.user_id = ?3 OR t.user_id IS NULL))"
        );
        let params = (id(run_id), thread_id.map(id), &scope.user_id);
        self.readers
            .read(|conn| run_row(conn, &sql, params))?
            .ok_or(StorageError::NotFound("run"))
    }
}

#[async_trait]
impl RunStore for SqliteStorage {
    async fn create_run(&self, scope: &Scope, new: NewRun) -> StorageResult<CreatedRun> {
        let scope = scope.clone();
        let encoded = EncodedNewRun::new(&new)?;
        // A request waits on it before it can answer (a stream, with its first event).
        self.writer
            .write_ahead(move |conn| create_run(conn, &scope, new, encoded))
            .await
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
        if !self
            .readers
            .read(|conn| thread_visible(conn, scope, thread_id))?
        {
            return Err(StorageError::NotFound("thread"));
        }
        let mut qb: QueryBuilder<Sqlite> =
            QueryBuilder::new(format!("SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = "));
        qb.push_bind(thread_id);
        if let Some(status) = filter.status {
            qb.push(" AND status = ").push_bind(status.as_str());
        }
        qb.push(" ORDER BY created_at DESC, run_id DESC LIMIT ")
            .push_bind(page.limit)
            .push(" OFFSET ")
            .push_bind(page.offset);
        let rows: Vec<RunRow<Hyphenated>> = qb.build_query_as().fetch_all(&self.read).await?;
        rows.into_iter().map(Run::try_from).collect()
    }

    async fn delete_run(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_id: Uuid,
    ) -> StorageResult<()> {
        let user_id = scope.user_id.clone();
        self.writer
            .write(move |conn| {
                let status: Option<String> = conn
                    .prepare_cached(
                        "SELECT status FROM runs WHERE run_id = ?1 AND thread_id = ?2 AND EXISTS \
                         (SELECT 1 FROM threads t WHERE t.thread_id = runs.thread_id \
                          AND (t.user_id = ?3 OR t.user_id IS NULL))",
                    )?
                    .query_row((id(run_id), id(thread_id), &user_id), |r| r.get(0))
                    .optional()?;
                let status = status.ok_or(StorageError::NotFound("run"))?;
                if RunStatus::parse(&status).is_some_and(RunStatus::is_active) {
                    return Err(StorageError::Conflict(format!("run {run_id} is {status}")));
                }
                // Its events go with it (ON DELETE CASCADE).
                exec(conn, "DELETE FROM runs WHERE run_id = ?1", [id(run_id)])?;
                Ok(())
            })
            .await
    }

    async fn cancel_runs(
        &self,
        scope: &Scope,
        thread_id: ResourceId,
        run_ids: &[Uuid],
        action: CancelAction,
    ) -> StorageResult<Vec<Uuid>> {
        let scope = scope.clone();
        let run_ids = run_ids.to_vec();
        self.writer
            .write(move |conn| {
                if !thread_visible(conn, &scope, thread_id)? {
                    return Err(StorageError::NotFound("thread"));
                }
                let active = active_runs(conn, thread_id, Some(&run_ids))?;
                if active.is_empty() {
                    return Err(StorageError::NotFound("run"));
                }
                let now = Utc::now();
                let stopped = stop_runs(conn, thread_id, &active, action, now)?;
                if count_active(conn, thread_id)? == 0 {
                    exec(
                        conn,
                        "UPDATE threads SET status = 'idle', updated_at = ?2 WHERE thread_id = ?1",
                        (id(thread_id), ts(now)),
                    )?;
                }
                Ok(stopped)
            })
            .await
    }

    async fn claim_run(
        &self,
        worker_id: &str,
        lease: Duration,
        max_attempts: i32,
    ) -> StorageResult<Option<ClaimedRun>> {
        let worker_id = worker_id.to_owned();
        self.writer
            .write(move |conn| claim_run(conn, &worker_id, lease, max_attempts))
            .await
    }

    async fn has_claimable_run(&self) -> StorageResult<bool> {
        let now = ts(Utc::now());
        self.readers.read(|conn| {
            Ok(conn
                .prepare_cached(CLAIMABLE_RUN_EXISTS)?
                .query_row([now], |r| r.get(0))?)
        })
    }

    async fn queue_outlook(&self) -> StorageResult<QueueOutlook> {
        let now = ts(Utc::now());
        self.readers.read(|conn| {
            Ok(conn.prepare_cached(QUEUE_OUTLOOK)?.query_row([&now], |r| {
                Ok(QueueOutlook {
                    due: r.opt_ts("due")?,
                    pending: r.get("pending")?,
                })
            })?)
        })
    }

    async fn hand_back_run(&self, run_id: Uuid, worker_id: &str) -> StorageResult<()> {
        // Expired now: `claim_run` takes expired leases first.
        self.renew_lease(run_id, worker_id, Duration::ZERO).await?;
        Ok(())
    }

    async fn renew_lease(
        &self,
        run_id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> StorageResult<Option<Run>> {
        let sql = format!(
            "UPDATE runs SET lease_expires_at = ?3 WHERE run_id = ?1 AND lease_owner = ?2 \
             AND status = 'running' RETURNING {RUN_COLUMNS}"
        );
        let worker_id = worker_id.to_owned();
        self.writer
            .write(move |conn| {
                run_row(
                    conn,
                    &sql,
                    (id(run_id), worker_id, ts(lease_end(Utc::now(), lease))),
                )
            })
            .await
    }

    async fn finish_run(
        &self,
        _thread_id: ResourceId,
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
        let worker_id = worker_id.to_owned();
        let end = EncodedEnd::new(&end)?;
        self.writer
            .write(move |conn| finish_run(conn, run_id, &worker_id, end))
            .await
    }

    async fn append_events(&self, events: &[LoggedEvent]) -> StorageResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let events = EventRows::new(events);
        self.writer
            .write(move |conn| insert_events(conn, &events))
            .await
    }

    async fn read_events(
        &self,
        thread_id: ResourceId,
        after: i64,
        run_id: Option<Uuid>,
        limit: i64,
    ) -> StorageResult<Vec<LoggedEvent>> {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT thread_id, seq, run_id, event, data, created_at FROM run_events \
             WHERE thread_id = ",
        );
        qb.push_bind(thread_id).push(" AND seq > ").push_bind(after);
        if let Some(run_id) = run_id {
            qb.push(" AND run_id = ").push_bind(run_id.hyphenated());
        }
        qb.push(" ORDER BY seq LIMIT ").push_bind(limit);
        let rows: Vec<EventRow<Hyphenated>> = qb.build_query_as().fetch_all(&self.read).await?;
        rows.into_iter().map(LoggedEvent::try_from).collect()
    }

    async fn last_event_seq(&self, thread_id: ResourceId) -> StorageResult<i64> {
        self.readers.read(|conn| last_seq(conn, thread_id))
    }

    async fn find_run(&self, scope: &Scope, run_id: Uuid) -> StorageResult<Run> {
        self.select_run(scope, run_id, None).await
    }

    async fn prune_events(&self, before: DateTime<Utc>, limit: i64) -> StorageResult<u64> {
        self.writer
            .write(move |conn| {
                let done = exec(
                    conn,
                    "DELETE FROM run_events WHERE (thread_id, seq) IN (SELECT e.thread_id, e.seq \
                     FROM run_events e WHERE e.created_at < ?1 \
                     AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = e.run_id \
                                     AND r.status IN ('pending', 'running')) \
                     LIMIT ?2)",
                    (ts(before), limit),
                )?;
                Ok(done as u64)
            })
            .await
    }

    async fn active_runs(
        &self,
        scope: &Scope,
        status: Option<RunStatus>,
    ) -> StorageResult<Vec<(ResourceId, Uuid)>> {
        let rows: Vec<(ResourceId, Hyphenated)> = sqlx::query_as(
            "SELECT r.thread_id, r.run_id FROM runs r JOIN threads t ON t.thread_id = r.thread_id \
             WHERE r.status IN ('pending', 'running') AND ($1 IS NULL OR r.status = $1) \
             AND (t.user_id = $2 OR t.user_id IS NULL) ORDER BY r.created_at",
        )
        .bind(status.map(RunStatus::as_str))
        .bind(&scope.user_id)
        .fetch_all(&self.read)
        .await?;
        Ok(rows.into_iter().map(|(t, r)| (t, r.into_uuid())).collect())
    }
}

/// A taken seq is a conflict; a run or thread that no longer exists (deleted while its
/// worker ran) is not found.
fn event_insert_error(error: rusqlite::Error) -> StorageError {
    if sqlite_constraint(&error, rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY) {
        return StorageError::NotFound("run");
    }
    sqlite_conflict_if_taken(error, || {
        "an event of that seq is already logged".to_owned()
    })
}
