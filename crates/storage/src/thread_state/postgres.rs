//! Thread state changes and thread expiry on PostgreSQL. Every function runs on the caller's
//! connection, inside its transaction; the thread's row is locked first (`FOR UPDATE`), as
//! run creation does, so a run cannot start between the check for active runs and the write.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::{busy, engine_id, put, ExpiredRow};
use crate::checkpoints::insert_checkpoint_pg;
use crate::model::{Scope, StateWrite, SweepOutcome, ThreadEvent, ThreadTtl, TtlStrategy};
use crate::{LoggedEvent, ResourceId, StorageResult};

/// The latest checkpoint of each namespace of thread `$1`: what `keep_latest` keeps.
const LATEST: &str = "SELECT checkpoint_ns, MAX(checkpoint_id) FROM checkpoints \
     WHERE thread_id = $1 GROUP BY checkpoint_ns";

/// Locks the caller's thread row; false when the caller cannot see it.
pub(crate) async fn lock_thread(
    conn: &mut PgConnection,
    scope: &Scope,
    id: ResourceId,
) -> StorageResult<bool> {
    let found: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM threads WHERE thread_id = $1 AND (user_id = $2 OR user_id IS NULL) \
         FOR UPDATE",
    )
    .bind(id)
    .bind(&scope.user_id)
    .fetch_optional(conn)
    .await?;
    Ok(found.is_some())
}

/// Refuses a state change while a run of the thread is pending or running.
pub(crate) async fn ensure_idle(conn: &mut PgConnection, id: ResourceId) -> StorageResult<()> {
    if has_active_run(conn, id).await? {
        return Err(busy(id));
    }
    Ok(())
}

async fn has_active_run(conn: &mut PgConnection, id: ResourceId) -> StorageResult<bool> {
    let found: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM runs WHERE thread_id = $1 AND status IN ('pending', 'running') LIMIT 1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(found.is_some())
}

/// Refuses a write computed from a latest checkpoint that is no longer the latest.
pub(crate) async fn ensure_latest(
    conn: &mut PgConnection,
    id: ResourceId,
    write: &StateWrite,
) -> StorageResult<()> {
    let Some(expected) = &write.expect_latest else {
        return Ok(());
    };
    let latest: Option<String> = sqlx::query_scalar(
        "SELECT MAX(checkpoint_id) FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2",
    )
    .bind(engine_id(id))
    .bind(write.namespace())
    .fetch_one(conn)
    .await?;
    if &latest != expected {
        return Err(crate::StorageError::Conflict(format!(
            "thread {id} has a newer checkpoint than the state this edit was made from; read it \
             and try again"
        )));
    }
    Ok(())
}

/// Saves the checkpoints of `write` and sets the thread's state columns from it.
pub(crate) async fn save_state(
    conn: &mut PgConnection,
    id: ResourceId,
    write: &StateWrite,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let thread_id = engine_id(id);
    for checkpoint in &write.checkpoints {
        insert_checkpoint_pg(&mut *conn, &put(&thread_id, checkpoint), None).await?;
    }
    let columns = &write.columns;
    sqlx::query(
        "UPDATE threads SET status = $2, state_values = $3, interrupts = $4, error = NULL, \
         updated_at = $5, state_updated_at = $5 WHERE thread_id = $1",
    )
    .bind(id)
    .bind(columns.status.as_str())
    .bind(columns.values.as_ref().map(Json))
    .bind(Json(&columns.interrupts))
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// Appends an event no run made to the thread's log, numbered by the thread's counter.
pub(crate) async fn log_event(
    conn: &mut PgConnection,
    id: ResourceId,
    event: &ThreadEvent,
    now: DateTime<Utc>,
) -> StorageResult<LoggedEvent> {
    let seq: i64 = sqlx::query_scalar(
        "UPDATE threads SET event_seq = event_seq + 1 WHERE thread_id = $1 RETURNING event_seq",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    // Text cast to json keeps the data as written, as the run events are kept.
    sqlx::query(
        "INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
         VALUES ($1, $2, NULL, $3, $4::json, $5)",
    )
    .bind(id)
    .bind(seq)
    .bind(&event.event)
    .bind(event.data.to_string())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    crate::pg_notify::notify(&mut *conn, crate::pg_notify::LOG, [format!("{id} {seq}")]).await?;
    Ok(LoggedEvent {
        thread_id: id,
        seq,
        run_id: Uuid::nil(),
        event: event.event.clone(),
        data: event.data.clone(),
        created_at: now,
    })
}

/// Sets (or clears) the thread's own TTL, counted from `now`.
pub(crate) async fn set_ttl(
    conn: &mut PgConnection,
    id: ResourceId,
    ttl: Option<&ThreadTtl>,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    sqlx::query(
        "UPDATE threads SET ttl_strategy = $2, ttl_minutes = $3, expires_at = $4, \
         ttl_swept_at = NULL WHERE thread_id = $1",
    )
    .bind(id)
    .bind(ttl.map(|t| t.strategy.as_str()))
    .bind(ttl.map(|t| t.minutes))
    .bind(ttl.map(|t| t.expiry(now)))
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes a thread with its checkpoints, runs and events.
pub(crate) async fn delete_rows(conn: &mut PgConnection, id: ResourceId) -> StorageResult<bool> {
    sqlx::query(
        "WITH w AS (DELETE FROM checkpoint_writes WHERE thread_id = $1), \
              b AS (DELETE FROM checkpoint_blobs WHERE thread_id = $1) \
         DELETE FROM checkpoints WHERE thread_id = $1",
    )
    .bind(engine_id(id))
    .execute(&mut *conn)
    .await?;
    let done = sqlx::query("DELETE FROM threads WHERE thread_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    let deleted = done.rows_affected() > 0;
    if deleted {
        thread_row_deleted(conn, id).await?;
    }
    Ok(deleted)
}

/// What goes with a thread whose row this transaction has just deleted: its runs and events,
/// and its streams in every process, told to end (at the commit).
pub(crate) async fn thread_row_deleted(
    conn: &mut PgConnection,
    id: ResourceId,
) -> StorageResult<()> {
    crate::runs::postgres::delete_runs_of_thread(&mut *conn, id).await?;
    crate::pg_notify::notify_thread_gone(conn, id).await
}

/// Keeps only the latest checkpoint of each namespace, its pending writes and the blobs it
/// reaches (delta chains followed through `base`).
async fn keep_latest(conn: &mut PgConnection, id: ResourceId) -> StorageResult<()> {
    let thread_id = engine_id(id);
    for table in ["checkpoint_writes", "checkpoints"] {
        sqlx::query(&format!(
            "DELETE FROM {table} WHERE thread_id = $1 \
             AND (checkpoint_ns, checkpoint_id) NOT IN ({LATEST})"
        ))
        .bind(&thread_id)
        .execute(&mut *conn)
        .await?;
    }
    // Their parents are gone: the kept checkpoints start the history now.
    sqlx::query("UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE thread_id = $1")
        .bind(&thread_id)
        .execute(&mut *conn)
        .await?;
    crate::checkpoints::delete_unreached_blobs_pg(conn, &thread_id).await?;
    Ok(())
}

/// Prunes the caller's threads among `ids`; answers how many were pruned. Ids the caller
/// cannot see are skipped; `keep_latest` skips a thread with an active run.
pub(crate) async fn prune(
    conn: &mut PgConnection,
    scope: &Scope,
    ids: &[ResourceId],
    strategy: TtlStrategy,
) -> StorageResult<u64> {
    let mut pruned = 0;
    for &id in ids {
        if !lock_thread(conn, scope, id).await? {
            continue;
        }
        match strategy {
            TtlStrategy::Delete => {
                if delete_rows(conn, id).await? {
                    pruned += 1;
                }
            }
            TtlStrategy::KeepLatest => {
                if !has_active_run(conn, id).await? {
                    keep_latest(conn, id).await?;
                    pruned += 1;
                }
            }
        }
    }
    Ok(pruned)
}

/// Applies the TTL of up to `limit` expired threads without an active run: their own TTL
/// once `expires_at` passed, else `default` once they were idle that long. Rows another
/// sweeper holds are skipped.
pub(crate) async fn sweep(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    default: Option<&ThreadTtl>,
    limit: i64,
) -> StorageResult<SweepOutcome> {
    let cutoff = super::default_cutoff(now, default);
    let rows: Vec<ExpiredRow<ResourceId>> = sqlx::query_as(
        "SELECT thread_id, ttl_strategy, ttl_minutes, expires_at FROM threads t \
         WHERE ((expires_at IS NOT NULL AND expires_at <= $1) \
            OR ($2::timestamptz IS NOT NULL AND ttl_minutes IS NULL AND updated_at <= $2 \
                AND (ttl_swept_at IS NULL OR ttl_swept_at <= $2))) \
         AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.thread_id \
                         AND r.status IN ('pending', 'running')) \
         LIMIT $3 FOR UPDATE SKIP LOCKED",
    )
    .bind(now)
    .bind(cutoff)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    let mut outcome = SweepOutcome::default();
    for row in rows {
        let id = row.thread_id;
        let own = row.own_ttl()?;
        let Some(ttl) = own.or(default.copied()) else {
            continue;
        };
        // A run created after the candidates were read waited for the row lock; now that the
        // sweeper holds it, check again.
        if has_active_run(conn, id).await? {
            continue;
        }
        match ttl.strategy {
            TtlStrategy::Delete => {
                delete_rows(conn, id).await?;
                outcome.deleted += 1;
            }
            TtlStrategy::KeepLatest => {
                keep_latest(conn, id).await?;
                // Trimmed: the next trim is one TTL from now (a thread under the default
                // TTL counts from this sweep instead of from its last update).
                sqlx::query(
                    "UPDATE threads SET \
                     expires_at = CASE WHEN ttl_minutes IS NULL THEN expires_at ELSE $2 END, \
                     ttl_swept_at = CASE WHEN ttl_minutes IS NULL THEN $3 ELSE ttl_swept_at END \
                     WHERE thread_id = $1",
                )
                .bind(id)
                .bind(ttl.expiry(now))
                .bind(now)
                .execute(&mut *conn)
                .await?;
                outcome.trimmed += 1;
            }
        }
    }
    Ok(outcome)
}
