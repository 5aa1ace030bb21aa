//! How a run's end is written on PostgreSQL: by the runs' writer (`pg_writer`), in its group's
//! transaction, one end at a time ([`end_run`]) or all of a group's plain ends together
//! ([`end_runs`]).

use std::collections::{HashMap, HashSet};

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

/// A run's end as a writer's group applies it ([`end_runs`]).
pub(crate) struct EndOf<'a> {
    pub thread_id: ResourceId,
    pub run_id: Uuid,
    pub worker_id: &'a str,
    pub end: &'a RunEnd,
    pub prepared: EndPrepared,
}

/// Ends runs of distinct threads as [`end_run`] would one after the other, in two statements
/// whatever their number: one locks every run and thread (and learns what a plain end needs),
/// one writes every run's row, end event and thread. Answers `None`, having written nothing
/// (the locks stay, as the caller's transaction goes on), when one of them is not a plain end:
/// a run that is not held, one cancelled with `rollback`, one behind a checkpoint not stored,
/// one whose events are not logged yet, two of one thread. The caller then ends them one by one.
/// Each ended run comes with the seq of its end event, its thread's last.
pub(crate) async fn end_runs(
    conn: &mut PgConnection,
    ends: &[EndOf<'_>],
) -> StorageResult<Option<Vec<(Run, i64)>>> {
    if ends.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let mut threads = HashSet::with_capacity(ends.len());
    let plain = ends
        .iter()
        .all(|end| end.prepared.events_logged && threads.insert(end.thread_id));
    if !plain {
        return Ok(None);
    }
    if !lock_plain_ends(conn, ends).await? {
        return Ok(None);
    }
    let now = Utc::now();
    let (mut thread_ids, mut run_ids, mut statuses, mut errors) = (vec![], vec![], vec![], vec![]);
    let (mut values, mut thread_statuses, mut interrupts, mut end_events) =
        (vec![], vec![], vec![], vec![]);
    for EndOf {
        thread_id,
        run_id,
        end,
        ..
    } in ends
    {
        thread_ids.push(*thread_id);
        run_ids.push(*run_id);
        statuses.push(end.status.as_str());
        errors.push(end.error.as_ref().map(Value::to_string));
        values.push(end.thread_values.as_ref().map(Value::to_string));
        thread_statuses.push(end.thread_status.as_str());
        interrupts.push(Value::Object(end.thread_interrupts.clone()).to_string());
        end_events.push(end_event_data(*run_id, end.status).to_string());
    }
    // As `end_run`'s statement, over arrays: a thread stays busy while another of its runs is
    // active; its error is the run's only when it ends `error`.
    let sql = format!(
        "WITH i AS ( \
             SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[], \
                                  $6::text[], $7::text[], $8::text[]) \
                 AS i(thread_id, run_id, status, error, vals, thread_status, interrupts, ended) \
         ), ended AS ( \
             UPDATE runs r SET status = i.status, error = i.error::jsonb, \
                 lease_expires_at = NULL, updated_at = $9, ended_at = $9, \
                 output = i.vals::jsonb \
             FROM i WHERE r.run_id = i.run_id \
             RETURNING {} \
         ), a AS ( \
             SELECT i.thread_id, EXISTS (SELECT 1 FROM runs o WHERE o.thread_id = i.thread_id \
                 AND o.run_id <> i.run_id AND o.status IN ('pending', 'running')) AS busy \
             FROM i \
         ), t AS ( \
             UPDATE threads SET event_seq = event_seq + 1, \
                 status = CASE WHEN a.busy THEN 'busy' ELSE i.thread_status END, \
                 state_values = i.vals::jsonb, interrupts = i.interrupts::jsonb, \
                 error = CASE WHEN NOT a.busy AND i.thread_status = 'error' \
                              THEN i.error::jsonb END, \
                 state_updated_at = $9, updated_at = $9 \
             FROM i JOIN a ON a.thread_id = i.thread_id \
             WHERE threads.thread_id = i.thread_id \
             RETURNING threads.thread_id, threads.event_seq, i.run_id, i.ended, a.busy \
         ), e AS ( \
             INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
             SELECT t.thread_id, t.event_seq, t.run_id, $10, t.ended::json, $9 FROM t \
         ) \
         SELECT ended.*, t.busy, t.event_seq AS end_seq FROM ended JOIN t ON t.run_id = ended.run_id",
        qualified_run_columns()
    );
    let rows = sqlx::query(&sql)
        .bind(&thread_ids)
        .bind(&run_ids)
        .bind(&statuses)
        .bind(&errors)
        .bind(&values)
        .bind(&thread_statuses)
        .bind(&interrupts)
        .bind(&end_events)
        .bind(now)
        .bind(RUN_END_EVENT)
        .fetch_all(&mut *conn)
        .await?;
    let mut busy = false;
    let mut ended = HashMap::with_capacity(rows.len());
    for row in &rows {
        busy |= row.try_get::<bool, _>("busy")?;
        let run = Run::try_from(RunRow::<Uuid>::from_row(row)?)?;
        ended.insert(run.run_id, (run, row.try_get("end_seq")?));
    }
    if busy {
        // A run queued behind one of these can start now.
        notify_runs(&mut *conn).await?;
    }
    ends.iter()
        .map(|end| {
            ended
                .remove(&end.run_id)
                .ok_or(StorageError::NotFound("run"))
        })
        .collect::<StorageResult<Vec<_>>>()
        .map(Some)
}

/// Locks the runs and threads of `ends` (threads in id order, as every group locks them, so
/// that two groups cannot wait for each other) and tells whether all of them end plainly: each
/// run is running and held by its worker, none was cancelled with `rollback`, and each
/// checkpoint an end comes after is stored.
async fn lock_plain_ends(conn: &mut PgConnection, ends: &[EndOf<'_>]) -> StorageResult<bool> {
    let threads: Vec<ResourceId> = ends.iter().map(|end| end.thread_id).collect();
    let runs: Vec<Uuid> = ends.iter().map(|end| end.run_id).collect();
    let workers: Vec<&str> = ends.iter().map(|end| end.worker_id).collect();
    let after: Vec<Option<&str>> = ends
        .iter()
        .map(|end| {
            end.end
                .after_checkpoint
                .as_deref()
                .filter(|_| !end.prepared.checkpoint_saved)
        })
        .collect();
    let plain: Vec<bool> = sqlx::query_scalar(
        "SELECT r.cancel IS DISTINCT FROM 'rollback' AND (i.after IS NULL OR EXISTS ( \
             SELECT 1 FROM checkpoints c WHERE c.thread_id = i.thread_id \
             AND c.checkpoint_ns = '' AND c.checkpoint_id = i.after)) \
         FROM UNNEST($1::text[], $2::uuid[], $3::text[], $4::text[]) \
             AS i(thread_id, run_id, worker, after) \
         JOIN runs r ON r.run_id = i.run_id AND r.thread_id = i.thread_id \
             AND r.status = 'running' AND r.lease_owner = i.worker \
         JOIN threads t ON t.thread_id = r.thread_id \
         ORDER BY t.thread_id FOR NO KEY UPDATE OF t, r",
    )
    .bind(&threads)
    .bind(&runs)
    .bind(&workers)
    .bind(&after)
    .fetch_all(&mut *conn)
    .await?;
    Ok(plain.len() == ends.len() && plain.iter().all(|plain| *plain))
}
