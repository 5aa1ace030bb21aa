//! [`RunStore`] on SQLite.
//!
//! Every write goes through the single writer connection, so two claims of this process never
//! interleave; the partial unique index still guards the one-running-run-per-thread rule.
//! Lists of ids are bound as one JSON array and expanded with `json_each`, so each statement
//! has a fixed set of parameters.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::fmt::Hyphenated;
use uuid::Uuid;

use super::*;
use crate::error::conflict_if_taken;
use crate::sqlite::SqliteStorage;
use crate::StorageError;

/// Rows per multi-row event insert (6 parameters each, far below SQLite's limit).
const EVENTS_PER_STATEMENT: usize = 1000;

fn id_list(ids: &[Uuid]) -> String {
    let ids: Vec<String> = ids.iter().map(|id| id.hyphenated().to_string()).collect();
    Value::from(ids).to_string()
}

async fn thread_visible(
    conn: &mut SqliteConnection,
    scope: &Scope,
    thread_id: Uuid,
) -> StorageResult<bool> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM threads WHERE thread_id = $1 AND (user_id = $2 OR user_id IS NULL)",
    )
    .bind(thread_id.hyphenated())
    .bind(&scope.user_id)
    .fetch_optional(conn)
    .await?;
    Ok(found.is_some())
}

/// The thread's active runs, oldest first; only those among `only` when given.
async fn active_runs(
    conn: &mut SqliteConnection,
    thread_id: Uuid,
    only: Option<&[Uuid]>,
) -> StorageResult<Vec<(Uuid, RunStatus)>> {
    let rows: Vec<(Hyphenated, String)> = match only {
        None => {
            sqlx::query_as(
                "SELECT run_id, status FROM runs WHERE thread_id = $1 \
                 AND status IN ('pending', 'running') ORDER BY created_at",
            )
            .bind(thread_id.hyphenated())
            .fetch_all(conn)
            .await?
        }
        Some(ids) => {
            sqlx::query_as(
                "SELECT run_id, status FROM runs WHERE thread_id = $1 \
                 AND status IN ('pending', 'running') \
                 AND run_id IN (SELECT value FROM json_each($2)) ORDER BY created_at",
            )
            .bind(thread_id.hyphenated())
            .bind(id_list(ids))
            .fetch_all(conn)
            .await?
        }
    };
    parse_active(rows)
}

/// Stops active runs: pending ones end now (`interrupted`, or deleted for a rollback),
/// running ones are flagged for their worker. Returns the ids stopped or flagged.
async fn stop_runs(
    conn: &mut SqliteConnection,
    thread_id: Uuid,
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
                     WHERE run_id IN (SELECT value FROM json_each($1))",
                )
                .bind(id_list(&pending))
                .bind(now)
                .execute(&mut *conn)
                .await?;
                for run_id in &pending {
                    log_run_end(conn, thread_id, *run_id, RunStatus::Interrupted, now).await?;
                }
            }
            CancelAction::Rollback => {
                sqlx::query("DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each($1))")
                    .bind(id_list(&pending))
                    .execute(&mut *conn)
                    .await?;
            }
        }
    }
    if !running.is_empty() {
        // A rollback request wins over an interrupt request, whichever came first.
        sqlx::query(
            "UPDATE runs SET cancel = CASE WHEN $1 = 'rollback' THEN 'rollback' \
             ELSE COALESCE(cancel, $1) END, updated_at = $2 \
             WHERE run_id IN (SELECT value FROM json_each($3))",
        )
        .bind(action.as_str())
        .bind(now)
        .bind(id_list(&running))
        .execute(&mut *conn)
        .await?;
    }
    Ok(active.iter().map(|(id, _)| *id).collect())
}

async fn count_active(conn: &mut SqliteConnection, thread_id: Uuid) -> StorageResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(*) FROM runs WHERE thread_id = $1 AND status IN ('pending', 'running')",
    )
    .bind(thread_id.hyphenated())
    .fetch_one(conn)
    .await?)
}

/// The thread's status once runs ended: `busy` while a run is still active, else `status`.
async fn thread_status_after(
    conn: &mut SqliteConnection,
    thread_id: Uuid,
    status: ThreadStatus,
) -> StorageResult<ThreadStatus> {
    Ok(if count_active(conn, thread_id).await? > 0 {
        ThreadStatus::Busy
    } else {
        status
    })
}

/// Sets the thread's status (and error) after runs ended without a worker to report values.
async fn release_thread(
    conn: &mut SqliteConnection,
    thread_id: Uuid,
    status: ThreadStatus,
    error: Option<&Value>,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let status = thread_status_after(conn, thread_id, status).await?;
    let error = error.filter(|_| status == ThreadStatus::Error);
    sqlx::query("UPDATE threads SET status = $2, error = $3, updated_at = $4 WHERE thread_id = $1")
        .bind(thread_id.hyphenated())
        .bind(status.as_str())
        .bind(error.map(Json))
        .bind(now)
        .execute(conn)
        .await?;
    Ok(())
}

/// Logs the event that closes a run's events ([`RUN_END_EVENT`]), after the thread's last
/// one, in the transaction that ends the run.
async fn log_run_end(
    conn: &mut SqliteConnection,
    thread_id: Uuid,
    run_id: Uuid,
    status: RunStatus,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let seq: i64 = sqlx::query_scalar(
        "UPDATE threads SET event_seq = event_seq + 1 WHERE thread_id = $1 RETURNING event_seq",
    )
    .bind(thread_id.hyphenated())
    .fetch_one(&mut *conn)
    .await?;
    let data = serde_json::json!({"run_id": run_id.to_string(), "status": status.as_str()});
    sqlx::query(
        "INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(thread_id.hyphenated())
    .bind(seq)
    .bind(run_id.hyphenated())
    .bind(RUN_END_EVENT)
    .bind(Json(&data))
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

async fn last_seq(conn: &mut SqliteConnection, thread_id: Uuid) -> StorageResult<i64> {
    let seq: Option<i64> = sqlx::query_scalar("SELECT event_seq FROM threads WHERE thread_id = $1")
        .bind(thread_id.hyphenated())
        .fetch_optional(conn)
        .await?;
    Ok(seq.unwrap_or(0))
}

/// Appends events to their threads' logs and moves the threads' counters past them.
async fn insert_events(conn: &mut SqliteConnection, events: &[LoggedEvent]) -> StorageResult<()> {
    let data: Vec<String> = events.iter().map(|e| e.data.to_string()).collect();
    for (chunk, data) in events
        .chunks(EVENTS_PER_STATEMENT)
        .zip(data.chunks(EVENTS_PER_STATEMENT))
    {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) ",
        );
        qb.push_values(chunk.iter().zip(data), |mut row, (event, data)| {
            row.push_bind(event.thread_id.hyphenated())
                .push_bind(event.seq)
                .push_bind(event.run_id.hyphenated())
                .push_bind(event.event.as_str())
                .push_bind(data.as_str())
                .push_bind(event.created_at);
        });
        qb.build()
            .execute(&mut *conn)
            .await
            .map_err(event_insert_error)?;
    }
    advance_event_seq(conn, events).await
}

/// Moves each thread's event counter past a batch just inserted; a batch that does not
/// continue the counter reuses a seq (`Conflict`).
async fn advance_event_seq(
    conn: &mut SqliteConnection,
    events: &[LoggedEvent],
) -> StorageResult<()> {
    for (thread_id, low, high) in seq_ranges(events) {
        let moved = sqlx::query(
            "UPDATE threads SET event_seq = $2 WHERE thread_id = $1 AND event_seq < $3",
        )
        .bind(thread_id.hyphenated())
        .bind(high)
        .bind(low)
        .execute(&mut *conn)
        .await?;
        if moved.rows_affected() == 0 {
            return Err(seq_taken(thread_id));
        }
    }
    Ok(())
}

/// Ends a running run whose worker died and that is not to be resumed: a cancelled one as
/// it asked, any other `error` (the worker was lost too often).
async fn end_abandoned(
    conn: &mut SqliteConnection,
    run: &Run,
    now: DateTime<Utc>,
) -> StorageResult<()> {
    let id = run.run_id.hyphenated();
    match run.cancel {
        Some(CancelAction::Rollback) => {
            sqlx::query("DELETE FROM runs WHERE run_id = $1")
                .bind(id)
                .execute(&mut *conn)
                .await?;
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
            let error = worker_lost(run.attempt);
            sqlx::query(
                "UPDATE runs SET status = 'error', error = $2, lease_expires_at = NULL, \
                 updated_at = $3, ended_at = $3 WHERE run_id = $1",
            )
            .bind(id)
            .bind(Json(&error))
            .bind(now)
            .execute(&mut *conn)
            .await?;
            log_run_end(conn, run.thread_id, run.run_id, RunStatus::Error, now).await?;
            release_thread(conn, run.thread_id, ThreadStatus::Error, Some(&error), now).await
        }
    }
}

async fn claimed(
    conn: &mut SqliteConnection,
    row: RunRow<Hyphenated>,
) -> StorageResult<ClaimedRun> {
    let run = Run::try_from(row)?;
    let last_seq = last_seq(conn, run.thread_id).await?;
    Ok(ClaimedRun { run, last_seq })
}

impl SqliteStorage {
    /// A run the caller can see, by id, and of `thread_id` when given.
    async fn select_run(
        &self,
        scope: &Scope,
        run_id: Uuid,
        thread_id: Option<Uuid>,
    ) -> StorageResult<Run> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1 \
             AND ($2 IS NULL OR thread_id = $2) AND EXISTS \
             (SELECT 1 FROM threads t WHERE t.thread_id = runs.thread_id \
              AND (t.user_id = $3 OR t.user_id IS NULL))"
        );
        let row: Option<RunRow<Hyphenated>> = sqlx::query_as(&sql)
            .bind(run_id.hyphenated())
            .bind(thread_id.map(|t| t.hyphenated()))
            .bind(&scope.user_id)
            .fetch_optional(&self.read)
            .await?;
        row.ok_or(StorageError::NotFound("run"))?.try_into()
    }
}

#[async_trait]
impl RunStore for SqliteStorage {
    async fn create_run(&self, scope: &Scope, new: NewRun) -> StorageResult<CreatedRun> {
        let mut tx = self.write.begin().await?;
        let now = Utc::now();
        if !thread_visible(&mut tx, scope, new.thread_id).await? {
            let IfThreadMissing::Create { metadata } = &new.if_thread_missing else {
                return Err(StorageError::NotFound("thread"));
            };
            // Another user's thread of that id is not found, not taken.
            let inserted = sqlx::query(
                "INSERT INTO threads (thread_id, user_id, metadata, created_at, updated_at, \
                 state_updated_at) VALUES ($1, $2, $3, $4, $4, $4) ON CONFLICT (thread_id) DO NOTHING",
            )
            .bind(new.thread_id.hyphenated())
            .bind(&scope.user_id)
            .bind(Json(metadata))
            .bind(now)
            .execute(&mut *tx)
            .await?;
            if inserted.rows_affected() == 0 {
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
                stop_runs(
                    &mut tx,
                    new.thread_id,
                    &active,
                    CancelAction::Interrupt,
                    now,
                )
                .await?
            }
            MultitaskStrategy::Rollback => {
                stop_runs(&mut tx, new.thread_id, &active, CancelAction::Rollback, now).await?
            }
            MultitaskStrategy::Reject | MultitaskStrategy::Enqueue => Vec::new(),
        };

        let sql = format!(
            "INSERT INTO runs (run_id, thread_id, assistant_id, user_id, status, kwargs, metadata, \
             multitask_strategy, attempt, run_after, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, 0, $8, $9, $9) RETURNING {RUN_COLUMNS}"
        );
        let row: RunRow<Hyphenated> = sqlx::query_as(&sql)
            .bind(new.run_id.hyphenated())
            .bind(new.thread_id.hyphenated())
            .bind(new.assistant_id.hyphenated())
            .bind(&scope.user_id)
            .bind(Json(&new.kwargs))
            .bind(Json(&new.metadata))
            .bind(new.multitask_strategy.as_str())
            .bind(new.run_after)
            .bind(now)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| conflict_if_taken(e, || format!("run {} already exists", new.run_id)))?;
        sqlx::query("UPDATE threads SET status = 'busy', updated_at = $2 WHERE thread_id = $1")
            .bind(new.thread_id.hyphenated())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(CreatedRun {
            run: row.try_into()?,
            cancelled,
        })
    }

    async fn get_run(&self, scope: &Scope, thread_id: Uuid, run_id: Uuid) -> StorageResult<Run> {
        self.select_run(scope, run_id, Some(thread_id)).await
    }

    async fn list_runs(
        &self,
        scope: &Scope,
        thread_id: Uuid,
        filter: RunFilter,
        page: Page,
    ) -> StorageResult<Vec<Run>> {
        let mut conn = self.read.acquire().await?;
        if !thread_visible(&mut conn, scope, thread_id).await? {
            return Err(StorageError::NotFound("thread"));
        }
        let mut qb: QueryBuilder<Sqlite> =
            QueryBuilder::new(format!("SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = "));
        qb.push_bind(thread_id.hyphenated());
        if let Some(status) = filter.status {
            qb.push(" AND status = ").push_bind(status.as_str());
        }
        qb.push(" ORDER BY created_at DESC, run_id DESC LIMIT ")
            .push_bind(page.limit)
            .push(" OFFSET ")
            .push_bind(page.offset);
        let rows: Vec<RunRow<Hyphenated>> = qb.build_query_as().fetch_all(&mut *conn).await?;
        rows.into_iter().map(Run::try_from).collect()
    }

    async fn delete_run(&self, scope: &Scope, thread_id: Uuid, run_id: Uuid) -> StorageResult<()> {
        let mut tx = self.write.begin().await?;
        let status: Option<String> = sqlx::query_scalar(
            "SELECT status FROM runs WHERE run_id = $1 AND thread_id = $2 AND EXISTS \
             (SELECT 1 FROM threads t WHERE t.thread_id = runs.thread_id \
              AND (t.user_id = $3 OR t.user_id IS NULL))",
        )
        .bind(run_id.hyphenated())
        .bind(thread_id.hyphenated())
        .bind(&scope.user_id)
        .fetch_optional(&mut *tx)
        .await?;
        let status = status.ok_or(StorageError::NotFound("run"))?;
        if RunStatus::parse(&status).is_some_and(RunStatus::is_active) {
            return Err(StorageError::Conflict(format!("run {run_id} is {status}")));
        }
        // Its events go with it (ON DELETE CASCADE).
        sqlx::query("DELETE FROM runs WHERE run_id = $1")
            .bind(run_id.hyphenated())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn cancel_runs(
        &self,
        scope: &Scope,
        thread_id: Uuid,
        run_ids: &[Uuid],
        action: CancelAction,
    ) -> StorageResult<Vec<Uuid>> {
        let mut tx = self.write.begin().await?;
        if !thread_visible(&mut tx, scope, thread_id).await? {
            return Err(StorageError::NotFound("thread"));
        }
        let active = active_runs(&mut tx, thread_id, Some(run_ids)).await?;
        if active.is_empty() {
            return Err(StorageError::NotFound("run"));
        }
        let now = Utc::now();
        let stopped = stop_runs(&mut tx, thread_id, &active, action, now).await?;
        if count_active(&mut tx, thread_id).await? == 0 {
            sqlx::query("UPDATE threads SET status = 'idle', updated_at = $2 WHERE thread_id = $1")
                .bind(thread_id.hyphenated())
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(stopped)
    }

    async fn claim_run(
        &self,
        worker_id: &str,
        lease: Duration,
        max_attempts: i32,
    ) -> StorageResult<Option<ClaimedRun>> {
        let mut tx = self.write.begin().await?;
        let now = Utc::now();
        let expires = lease_end(now, lease);

        // Runs whose worker died first: they still hold their thread.
        let expired_sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running' AND lease_expires_at < $1 \
             ORDER BY lease_expires_at LIMIT 1"
        );
        let reclaim_sql = format!(
            "UPDATE runs SET attempt = attempt + 1, lease_owner = $2, lease_expires_at = $3, \
             updated_at = $4 WHERE run_id = $1 RETURNING {RUN_COLUMNS}"
        );
        for _ in 0..EXPIRED_PER_CLAIM {
            let row: Option<RunRow<Hyphenated>> = sqlx::query_as(&expired_sql)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = row else { break };
            let run = Run::try_from(row)?;
            if run.cancel.is_none() && run.attempt < max_attempts {
                let row: RunRow<Hyphenated> = sqlx::query_as(&reclaim_sql)
                    .bind(run.run_id.hyphenated())
                    .bind(worker_id)
                    .bind(expires)
                    .bind(now)
                    .fetch_one(&mut *tx)
                    .await?;
                let claimed = claimed(&mut tx, row).await?;
                tx.commit().await?;
                return Ok(Some(claimed));
            }
            end_abandoned(&mut tx, &run, now).await?;
        }

        // One statement picks and claims: all writes go through the one writer connection, so
        // no other claim can run between the pick and the update (the partial unique index
        // on running runs still guards the rule).
        let claim_sql = format!(
            "UPDATE runs SET status = 'running', attempt = attempt + 1, lease_owner = $1, \
             lease_expires_at = $2, updated_at = $3, started_at = COALESCE(started_at, $3) \
             WHERE run_id = (SELECT run_id FROM runs r WHERE status = 'pending' \
                             AND run_after <= $3 AND NOT EXISTS (SELECT 1 FROM runs o \
                             WHERE o.thread_id = r.thread_id AND o.status = 'running') \
                             ORDER BY created_at LIMIT 1) \
             RETURNING {RUN_COLUMNS}"
        );
        let row: Option<RunRow<Hyphenated>> = sqlx::query_as(&claim_sql)
            .bind(worker_id)
            .bind(expires)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(row) = row {
            let claimed = claimed(&mut tx, row).await?;
            tx.commit().await?;
            return Ok(Some(claimed));
        }
        // Commits the ends of abandoned runs, if any.
        tx.commit().await?;
        Ok(None)
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
        let row: Option<RunRow<Hyphenated>> = sqlx::query_as(&sql)
            .bind(run_id.hyphenated())
            .bind(worker_id)
            .bind(lease_end(Utc::now(), lease))
            .fetch_optional(&self.write)
            .await?;
        row.map(Run::try_from).transpose()
    }

    async fn finish_run(
        &self,
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
        let mut tx = self.write.begin().await?;
        let held: Option<(Hyphenated, Option<String>)> = sqlx::query_as(
            "SELECT thread_id, cancel FROM runs WHERE run_id = $1 AND status = 'running' \
             AND lease_owner = $2",
        )
        .bind(run_id.hyphenated())
        .bind(worker_id)
        .fetch_optional(&mut *tx)
        .await?;
        let (thread_id, cancel) = held.ok_or(StorageError::NotFound("run"))?;
        let thread_id = thread_id.into_uuid();
        let now = Utc::now();
        let ended = if cancel.as_deref() == Some(CancelAction::Rollback.as_str()) {
            sqlx::query("DELETE FROM runs WHERE run_id = $1")
                .bind(run_id.hyphenated())
                .execute(&mut *tx)
                .await?;
            None
        } else {
            let sql = format!(
                "UPDATE runs SET status = $2, error = $3, lease_expires_at = NULL, updated_at = $4, \
                 ended_at = $4 WHERE run_id = $1 RETURNING {RUN_COLUMNS}"
            );
            let row: RunRow<Hyphenated> = sqlx::query_as(&sql)
                .bind(run_id.hyphenated())
                .bind(end.status.as_str())
                .bind(end.error.as_ref().map(Json))
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
            insert_events(&mut tx, &end.events).await?;
            log_run_end(&mut tx, thread_id, run_id, end.status, now).await?;
            Some(Run::try_from(row)?)
        };
        let status = thread_status_after(&mut tx, thread_id, end.thread_status).await?;
        let error = end.error.as_ref().filter(|_| status == ThreadStatus::Error);
        sqlx::query(
            "UPDATE threads SET status = $2, state_values = $3, interrupts = $4, error = $5, \
             state_updated_at = $6, updated_at = $6 WHERE thread_id = $1",
        )
        .bind(thread_id.hyphenated())
        .bind(status.as_str())
        .bind(end.thread_values.as_ref().map(Json))
        .bind(Json(&end.thread_interrupts))
        .bind(error.map(Json))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(ended)
    }

    async fn append_events(&self, events: &[LoggedEvent]) -> StorageResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut tx = self.write.begin().await?;
        insert_events(&mut tx, events).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn read_events(
        &self,
        thread_id: Uuid,
        after: i64,
        run_id: Option<Uuid>,
        limit: i64,
    ) -> StorageResult<Vec<LoggedEvent>> {
        let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
            "SELECT thread_id, seq, run_id, event, data, created_at FROM run_events \
             WHERE thread_id = ",
        );
        qb.push_bind(thread_id.hyphenated())
            .push(" AND seq > ")
            .push_bind(after);
        if let Some(run_id) = run_id {
            qb.push(" AND run_id = ").push_bind(run_id.hyphenated());
        }
        qb.push(" ORDER BY seq LIMIT ").push_bind(limit);
        let rows: Vec<EventRow<Hyphenated>> = qb.build_query_as().fetch_all(&self.read).await?;
        rows.into_iter().map(LoggedEvent::try_from).collect()
    }

    async fn last_event_seq(&self, thread_id: Uuid) -> StorageResult<i64> {
        let mut conn = self.read.acquire().await?;
        last_seq(&mut conn, thread_id).await
    }

    async fn find_run(&self, scope: &Scope, run_id: Uuid) -> StorageResult<Run> {
        self.select_run(scope, run_id, None).await
    }

    async fn prune_events(&self, before: DateTime<Utc>, limit: i64) -> StorageResult<u64> {
        let done = sqlx::query(
            "DELETE FROM run_events WHERE rowid IN (SELECT e.rowid FROM run_events e \
             WHERE e.created_at < $1 \
             AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = e.run_id \
                             AND r.status IN ('pending', 'running')) \
             LIMIT $2)",
        )
        .bind(before)
        .bind(limit)
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected())
    }

    async fn active_runs(
        &self,
        scope: &Scope,
        status: Option<RunStatus>,
    ) -> StorageResult<Vec<(Uuid, Uuid)>> {
        let rows: Vec<(Hyphenated, Hyphenated)> = sqlx::query_as(
            "SELECT r.thread_id, r.run_id FROM runs r JOIN threads t ON t.thread_id = r.thread_id \
             WHERE r.status IN ('pending', 'running') AND ($1 IS NULL OR r.status = $1) \
             AND (t.user_id = $2 OR t.user_id IS NULL) ORDER BY r.created_at",
        )
        .bind(status.map(RunStatus::as_str))
        .bind(&scope.user_id)
        .fetch_all(&self.read)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(t, r)| (t.into_uuid(), r.into_uuid()))
            .collect())
    }
}

/// A taken seq is a conflict; a run or thread that no longer exists (deleted while its
/// worker ran) is not found.
pub(super) fn event_insert_error(error: sqlx::Error) -> StorageError {
    match &error {
        sqlx::Error::Database(e) if e.is_foreign_key_violation() => StorageError::NotFound("run"),
        _ => conflict_if_taken(error, || {
            "an event of that seq is already logged".to_owned()
        }),
    }
}
