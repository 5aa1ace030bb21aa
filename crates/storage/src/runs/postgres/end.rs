//! How a run's end is written on PostgreSQL: by the runs' writer (`pg_writer`), in its group's
//! transaction, one end at a time ([`end_run`]) or all of a group's plain ends together
//! ([`EndArrays`]).

use super::*;

/// What a writer's group already did for a run's end, earlier in its transaction.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EndPrepared {
    /// The end's own events ([`RunEnd::events`]) are inserted.
    pub events_logged: bool,
    /// Its [`RunEnd::after_checkpoint`] was saved.
    pub checkpoint_saved: bool,
}

/// Ends a run as its worker reports it (see [`RunStore::finish_run`]), on the caller's
/// transaction (the writer's group, `pg_writer`): the run's row, its end event and its
/// thread's columns in one statement.
pub(crate) async fn end_run(
    conn: &mut PgConnection,
    thread_id: ResourceId,
    run_id: Uuid,
    worker_id: &str,
    end: &RunEnd,
    prepared: EndPrepared,
) -> StorageResult<Option<Run>> {
    // The thread's row and the run's, held for the rest of the transaction.
    let held: Option<Option<String>> = sqlx::query_scalar(
        "SELECT r.cancel FROM threads t JOIN runs r ON r.thread_id = t.thread_id \
         WHERE t.thread_id = $1 AND r.run_id = $2 AND r.status = 'running' \
         AND r.lease_owner = $3 FOR NO KEY UPDATE OF t, r",
    )
    .bind(thread_id)
    .bind(run_id)
    .bind(worker_id)
    .fetch_optional(&mut *conn)
    .await?;
    let cancel = held.ok_or(StorageError::NotFound("run"))?;
    if let Some(checkpoint_id) = end
        .after_checkpoint
        .as_ref()
        .filter(|_| !prepared.checkpoint_saved)
    {
        require_checkpoint(&mut *conn, thread_id, checkpoint_id).await?;
    }
    let now = Utc::now();
    if cancel.as_deref() == Some(CancelAction::Rollback.as_str()) {
        // Its saves all committed before this transaction (`after_checkpoint` was
        // checked, and the engine waits for a cancelled run's saves), so deleting them
        // here leaves none behind. The thread keeps the values and interrupts it had
        // before the run, as the reference does.
        roll_back(&mut *conn, thread_id, run_id).await?;
        release_thread(&mut *conn, thread_id, ThreadStatus::Idle, None, now).await?;
        return Ok(None);
    }
    if !prepared.events_logged {
        insert_events(&mut *conn, &end.events).await?;
    }
    // The thread stays busy while another of its runs is active; its error is the run's only
    // when it ends `error`.
    let sql = format!(
        "WITH r AS ( \
             UPDATE runs SET status = $3, error = $4, lease_expires_at = NULL, \
             updated_at = $5, ended_at = $5, output = $6 WHERE run_id = $2 \
             RETURNING {RUN_COLUMNS} \
         ), a AS ( \
             SELECT EXISTS (SELECT 1 FROM runs WHERE thread_id = $1 AND run_id <> $2 \
                            AND status IN ('pending', 'running')) AS busy \
         ), t AS ( \
             UPDATE threads SET event_seq = event_seq + 1, \
                 status = CASE WHEN a.busy THEN 'busy' ELSE $7 END, state_values = $6, \
                 interrupts = $8, error = CASE WHEN NOT a.busy AND $7 = 'error' THEN $4 END, \
                 state_updated_at = $5, updated_at = $5 \
             FROM a WHERE thread_id = $1 RETURNING event_seq, a.busy \
         ), e AS ( \
             INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
             SELECT $1, t.event_seq, $2, $9, $10, $5 FROM t \
         ) \
         SELECT r.*, t.busy FROM r, t"
    );
    let end_event = end_event_data(run_id, end.status);
    let row = sqlx::query(&sql)
        .bind(thread_id)
        .bind(run_id)
        .bind(end.status.as_str())
        .bind(end.error.as_ref().map(Json))
        .bind(now)
        .bind(end.thread_values.as_ref().map(Json))
        .bind(end.thread_status.as_str())
        .bind(Json(&end.thread_interrupts))
        .bind(RUN_END_EVENT)
        .bind(Json(&end_event))
        .fetch_one(&mut *conn)
        .await?;
    if row.try_get::<bool, _>("busy")? {
        // A run queued behind this one can start now.
        notify_runs(&mut *conn).await?;
    }
    Ok(Some(Run::try_from(RunRow::<Uuid>::from_row(&row)?)?))
}

/// A run's end as a writer's group applies it ([`EndArrays`]).
pub(crate) struct EndOf<'a> {
    pub thread_id: ResourceId,
    pub run_id: Uuid,
    pub worker_id: &'a str,
    pub end: &'a RunEnd,
    pub prepared: EndPrepared,
}

/// Runs' ends as a writer's group applies them (the `n_` arrays of `spindle_write_group`,
/// migration 0014): as [`end_run`] would one after the other. For ends of distinct threads whose
/// events the group logs before them, as the writer's batch sees to. The function locks every
/// run and thread first, and raises (the writer then ends them one by one) when one is not
/// plain: a run that is not held, one cancelled with `rollback`, one behind a checkpoint not
/// stored.
#[derive(Default)]
pub(crate) struct EndArrays<'a> {
    threads: Vec<ResourceId>,
    runs: Vec<Uuid>,
    workers: Vec<&'a str>,
    after: Vec<Option<&'a str>>,
    statuses: Vec<&'static str>,
    errors: Vec<Option<String>>,
    values: Vec<Option<String>>,
    thread_statuses: Vec<&'static str>,
    interrupts: Vec<String>,
    end_events: Vec<String>,
}

impl<'a> EndArrays<'a> {
    pub(crate) fn of(ends: &[EndOf<'a>]) -> Self {
        let mut arrays = Self::default();
        for end in ends {
            let EndOf {
                thread_id,
                run_id,
                worker_id,
                end,
                prepared,
            } = end;
            arrays.threads.push(*thread_id);
            arrays.runs.push(*run_id);
            arrays.workers.push(worker_id);
            // A checkpoint the group saved is there; no need to look.
            let after = end.after_checkpoint.as_deref();
            arrays
                .after
                .push(after.filter(|_| !prepared.checkpoint_saved));
            arrays.statuses.push(end.status.as_str());
            arrays.errors.push(end.error.as_ref().map(Value::to_string));
            arrays
                .values
                .push(end.thread_values.as_ref().map(Value::to_string));
            arrays.thread_statuses.push(end.thread_status.as_str());
            let interrupts = Value::Object(end.thread_interrupts.clone());
            arrays.interrupts.push(interrupts.to_string());
            arrays
                .end_events
                .push(end_event_data(*run_id, end.status).to_string());
        }
        arrays
    }

    /// Binds the arrays, then the time of the ends and the end events' name, in the function's
    /// order.
    pub(crate) fn bind(self, query: PgQuery<'a>, now: DateTime<Utc>) -> PgQuery<'a> {
        query
            .bind(self.threads)
            .bind(self.runs)
            .bind(self.workers)
            .bind(self.after)
            .bind(self.statuses)
            .bind(self.errors)
            .bind(self.values)
            .bind(self.thread_statuses)
            .bind(self.interrupts)
            .bind(self.end_events)
            .bind(now)
            .bind(RUN_END_EVENT)
    }
}
