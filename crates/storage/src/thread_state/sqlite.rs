//! Thread state changes and thread expiry on SQLite. Every function runs on the write
//! connection (`sqlite_writer`), inside the caller's write.

use chrono::{DateTime, Utc};
use rusqlite::Connection;
use uuid::Uuid;

use super::{busy, engine_id, put, ExpiredRow};
use crate::checkpoints::insert_checkpoint_sqlite;
use crate::model::{Scope, StateWrite, SweepOutcome, ThreadEvent, ThreadTtl, TtlStrategy};
use crate::sqlite_notices::notice_logged;
use crate::sqlite_values::{id, json, ts, RowExt};
use crate::{LoggedEvent, ResourceId, StorageResult};

/// The latest checkpoint of each namespace of thread `?1`: what `keep_latest` keeps.
const LATEST: &str = "SELECT checkpoint_ns, MAX(checkpoint_id) FROM checkpoints \
     WHERE thread_id = ?1 GROUP BY checkpoint_ns";

fn exec(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> StorageResult<usize> {
    Ok(conn.prepare_cached(sql)?.execute(params)?)
}

/// Refuses a state change while a run of the thread is pending or running.
pub(crate) fn ensure_idle(conn: &Connection, thread: ResourceId) -> StorageResult<()> {
    if has_active_run(conn, thread)? {
        return Err(busy(thread));
    }
    Ok(())
}

fn has_active_run(conn: &Connection, thread: ResourceId) -> StorageResult<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM runs WHERE thread_id = ?1 AND status IN ('pending', 'running') LIMIT 1",
        )?
        .exists([id(thread)])?)
}

/// Refuses a write computed from a latest checkpoint that is no longer the latest.
pub(crate) fn ensure_latest(
    conn: &Connection,
    thread: ResourceId,
    write: &StateWrite,
) -> StorageResult<()> {
    let Some(expected) = &write.expect_latest else {
        return Ok(());
    };
    let latest: Option<String> = conn
        .prepare_cached(
            "SELECT MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2",
        )?
        .query_row((engine_id(thread), write.namespace()), |r| r.get(0))?;
    if &latest != expected {
        return Err(crate::StorageError::Conflict(format!(
            "thread {thread} has a newer checkpoint than the state this edit was made from; \
             read it and try again"
        )));
    }
    Ok(())
}

/// Saves the checkpoints of `write` and sets the thread's state columns from it.
pub(crate) fn save_state(
    conn: &Connection,
    thread: ResourceId,
    write: &StateWrite,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let thread_id = engine_id(thread);
    for checkpoint in &write.checkpoints {
        insert_checkpoint_sqlite(conn, &put(&thread_id, checkpoint))?;
    }
    let columns = &write.columns;
    exec(
        conn,
        "UPDATE threads SET status = ?2, state_values = ?3, interrupts = ?4, error = NULL, \
         updated_at = ?5, state_updated_at = ?5 WHERE thread_id = ?1",
        (
            id(thread),
            columns.status.as_str(),
            columns.values.as_ref().map(json).transpose()?,
            json(&columns.interrupts)?,
            ts(now),
        ),
    )?;
    Ok(())
}

/// Appends an event no run made to the thread's log, numbered by the thread's counter.
pub(crate) fn log_event(
    conn: &Connection,
    thread: ResourceId,
    event: &ThreadEvent,
    now: DateTime<Utc>,
) -> StorageResult<LoggedEvent> {
    let seq: i64 = conn
        .prepare_cached(
            "UPDATE threads SET event_seq = event_seq + 1 WHERE thread_id = ?1 RETURNING event_seq",
        )?
        .query_row([id(thread)], |r| r.get(0))?;
    exec(
        conn,
        "INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
         VALUES (?1, ?2, NULL, ?3, ?4, ?5)",
        (
            id(thread),
            seq,
            &event.event,
            event.data.to_string(),
            ts(now),
        ),
    )?;
    notice_logged(thread, seq);
    Ok(LoggedEvent {
        thread_id: thread,
        seq,
        run_id: Uuid::nil(),
        event: event.event.clone(),
        data: event.data.clone(),
        created_at: now,
    })
}

/// Sets (or clears) the thread's own TTL, counted from `now`.
pub(crate) fn set_ttl(
    conn: &Connection,
    thread: ResourceId,
    ttl: Option<&ThreadTtl>,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    exec(
        conn,
        "UPDATE threads SET ttl_strategy = ?2, ttl_minutes = ?3, expires_at = ?4, \
         ttl_swept_at = NULL WHERE thread_id = ?1",
        (
            id(thread),
            ttl.map(|t| t.strategy.as_str()),
            ttl.map(|t| t.minutes),
            ttl.map(|t| ts(t.expiry(now))),
        ),
    )?;
    Ok(())
}

/// Removes a thread with its checkpoints (its runs and events go by cascade); its streams
/// end.
pub(crate) fn delete_rows(conn: &Connection, thread: ResourceId) -> StorageResult<bool> {
    crate::checkpoints::delete_checkpoints_sqlite(conn, &engine_id(thread))?;
    let deleted = exec(
        conn,
        "DELETE FROM threads WHERE thread_id = ?1",
        [id(thread)],
    )? > 0;
    if deleted {
        notice_logged(thread, i64::MAX);
    }
    Ok(deleted)
}

/// Keeps only the latest checkpoint of each namespace, its pending writes and the blobs it
/// reaches (delta chains followed through `base`).
fn keep_latest(conn: &Connection, thread: ResourceId) -> StorageResult<()> {
    let thread_id = engine_id(thread);
    for table in ["checkpoint_writes", "checkpoints"] {
        exec(
            conn,
            &format!(
                "DELETE FROM {table} WHERE thread_id = ?1 \
                 AND (checkpoint_ns, checkpoint_id) NOT IN ({LATEST})"
            ),
            [&thread_id],
        )?;
    }
    // Their parents are gone: the kept checkpoints start the history now.
    exec(
        conn,
        "UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE thread_id = ?1",
        [&thread_id],
    )?;
    crate::checkpoints::delete_unreached_blobs_sqlite(conn, &thread_id)?;
    Ok(())
}

/// Prunes the caller's threads among `ids`; answers how many were pruned. Ids the caller
/// cannot see are skipped; `keep_latest` skips a thread with an active run.
pub(crate) fn prune(
    conn: &Connection,
    scope: &Scope,
    ids: &[ResourceId],
    strategy: TtlStrategy,
) -> StorageResult<u64> {
    let mut pruned = 0;
    for &thread in ids {
        let visible = conn
            .prepare_cached(
                "SELECT 1 FROM threads WHERE thread_id = ?1 AND (user_id = ?2 OR user_id IS NULL)",
            )?
            .exists((id(thread), &scope.user_id))?;
        if !visible {
            continue;
        }
        match strategy {
            TtlStrategy::Delete => {
                if delete_rows(conn, thread)? {
                    pruned += 1;
                }
            }
            TtlStrategy::KeepLatest => {
                if !has_active_run(conn, thread)? {
                    keep_latest(conn, thread)?;
                    pruned += 1;
                }
            }
        }
    }
    Ok(pruned)
}

/// Applies the TTL of up to `limit` expired threads without an active run: their own TTL
/// once `expires_at` passed, else `default` once they were idle that long.
pub(crate) fn sweep(
    conn: &Connection,
    now: DateTime<Utc>,
    default: Option<&ThreadTtl>,
    limit: i64,
) -> StorageResult<SweepOutcome> {
    let cutoff = super::default_cutoff(now, default);
    let rows: Vec<ExpiredRow<ResourceId>> = conn
        .prepare_cached(
            "SELECT thread_id, ttl_strategy, ttl_minutes, expires_at FROM threads t \
             WHERE ((expires_at IS NOT NULL AND expires_at <= ?1) \
                OR (?2 IS NOT NULL AND ttl_minutes IS NULL AND updated_at <= ?2 \
                    AND (ttl_swept_at IS NULL OR ttl_swept_at <= ?2))) \
             AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.thread_id \
                             AND r.status IN ('pending', 'running')) \
             LIMIT ?3",
        )?
        .query_map((ts(now), cutoff.map(ts), limit), |r| {
            Ok(ExpiredRow {
                thread_id: r.resource_id("thread_id")?,
                ttl_strategy: r.get("ttl_strategy")?,
                ttl_minutes: r.get("ttl_minutes")?,
                expires_at: r.opt_ts("expires_at")?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut outcome = SweepOutcome::default();
    for row in rows {
        let thread = row.thread_id;
        let own = row.own_ttl()?;
        let Some(ttl) = own.or(default.copied()) else {
            continue;
        };
        match ttl.strategy {
            TtlStrategy::Delete => {
                delete_rows(conn, thread)?;
                outcome.deleted += 1;
            }
            TtlStrategy::KeepLatest => {
                keep_latest(conn, thread)?;
                // Trimmed: the next trim is one TTL from now (a thread under the default
                // TTL counts from this sweep instead of from its last update).
                exec(
                    conn,
                    "UPDATE threads SET \
                     expires_at = CASE WHEN ttl_minutes IS NULL THEN expires_at ELSE ?2 END, \
                     ttl_swept_at = CASE WHEN ttl_minutes IS NULL THEN ?3 ELSE ttl_swept_at END \
                     WHERE thread_id = ?1",
                    (id(thread), ts(ttl.expiry(now)), ts(now)),
                )?;
                outcome.trimmed += 1;
            }
        }
    }
    Ok(outcome)
}
