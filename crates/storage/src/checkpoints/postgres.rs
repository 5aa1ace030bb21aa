//! Checkpoints in PostgreSQL.
//!
//! A step's checkpoint and its blobs are one statement (data-modifying CTEs), so saving a
//! step is one round trip and atomic without an explicit transaction. Lists of values travel
//! as arrays (`UNNEST`), so every statement has a fixed text and is prepared once per
//! connection.

use std::borrow::Cow;

use async_trait::async_trait;
use serde_json::Value;
use spindle_graph::checkpoint::{
    ChannelBlob, Checkpoint, CheckpointError, CheckpointTuple, Checkpointer, ListFilter,
    PendingWrite,
};
use sqlx::postgres::PgPool;
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, QueryBuilder};

use super::{
    assemble, backend, encode_blobs, encode_write, limit_to_db, metadata_filter, plan_writes,
    run_gone, saved_by, stored_checkpoint, wanted_blobs, BlobRow, Blobs, CheckpointRow, Put, Save,
    WriteRow, WritesOf, CHECKPOINT_COLUMNS,
};
use crate::runs::postgres::insert_events;
use crate::LoggedSave;

/// The engine's [`Checkpointer`] over the PostgreSQL backend's pool.
pub struct PostgresCheckpointer {
    pool: PgPool,
}

impl PostgresCheckpointer {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

/// `jsonb` cannot hold U+0000. Blob and write values are bytes and keep it; checkpoint
/// metadata, which is `jsonb` for `@>` filters, gets U+FFFD in its place, rather than failing
/// a run whose node wrote a NUL character (metadata records the step's writes).
fn jsonb_safe(value: &Value) -> Cow<'_, Value> {
    fn has_nul(value: &Value) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(has_nul),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }
    fn replace(value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(s.replace('\0', "\u{fffd}")),
            Value::Array(items) => Value::Array(items.iter().map(replace).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.replace('\0', "\u{fffd}"), replace(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    if has_nul(value) {
        Cow::Owned(replace(value))
    } else {
        Cow::Borrowed(value)
    }
}

/// The blobs that rebuild `rows`' channels, delta chains included, in one query: a recursive
/// CTE starts from the wanted `(namespace, channel, version)` triples and follows `base`.
async fn fetch_blobs(
    conn: &mut PgConnection,
    thread_id: &str,
    rows: &[CheckpointRow],
) -> Result<Blobs, CheckpointError> {
    let wanted = wanted_blobs(rows)?;
    if wanted.is_empty() {
        return Ok(Blobs::default());
    }
    let mut namespaces = Vec::with_capacity(wanted.len());
    let mut channels = Vec::with_capacity(wanted.len());
    let mut versions = Vec::with_capacity(wanted.len());
    for (ns, channel, version) in wanted {
        namespaces.push(ns);
        channels.push(channel);
        versions.push(version);
    }
    // The start rows take the key columns' collation, which the recursive term has.
    let rows: Vec<BlobRow> = sqlx::query_as(
        "WITH RECURSIVE chain(checkpoint_ns, channel, version) AS ( \
             SELECT ns COLLATE \"C\", ch COLLATE \"C\", v \
             FROM UNNEST($2::text[], $3::text[], $4::bigint[]) AS u(ns, ch, v) \
           UNION \
             SELECT b.checkpoint_ns, b.channel, b.base FROM chain c JOIN checkpoint_blobs b \
               ON b.thread_id = $1 AND b.checkpoint_ns = c.checkpoint_ns \
              AND b.channel = c.channel AND b.version = c.version \
             WHERE b.base IS NOT NULL AND b.base < b.version \
         ) \
         SELECT b.checkpoint_ns, b.channel, b.version, b.value FROM chain c \
         JOIN checkpoint_blobs b ON b.thread_id = $1 AND b.checkpoint_ns = c.checkpoint_ns \
          AND b.channel = c.channel AND b.version = c.version",
    )
    .bind(thread_id)
    .bind(namespaces)
    .bind(channels)
    .bind(versions)
    .fetch_all(conn)
    .await
    .map_err(backend)?;
    Blobs::decode(rows)
}

/// The pending writes of `rows`' checkpoints, ordered by checkpoint and `idx`.
async fn fetch_writes(
    conn: &mut PgConnection,
    thread_id: &str,
    rows: &[CheckpointRow],
) -> Result<Vec<WriteRow>, CheckpointError> {
    let namespaces: Vec<&str> = rows.iter().map(|r| r.checkpoint_ns.as_str()).collect();
    let ids: Vec<&str> = rows.iter().map(|r| r.checkpoint_id.as_str()).collect();
    sqlx::query_as(
        "SELECT w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.value \
         FROM UNNEST($2::text[], $3::text[]) AS p(ns, id) \
         JOIN checkpoint_writes w ON w.thread_id = $1 \
          AND w.checkpoint_ns = p.ns AND w.checkpoint_id = p.id \
         ORDER BY w.checkpoint_ns, w.checkpoint_id, w.idx",
    )
    .bind(thread_id)
    .bind(namespaces)
    .bind(ids)
    .fetch_all(conn)
    .await
    .map_err(backend)
}

async fn load(
    conn: &mut PgConnection,
    thread_id: &str,
    rows: Vec<CheckpointRow>,
    shared_blobs: bool,
) -> Result<Vec<CheckpointTuple>, CheckpointError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    // Blobs are written with their checkpoint and never change, so these reads agree with the
    // rows without a common snapshot.
    let blobs = fetch_blobs(conn, thread_id, &rows).await?;
    let writes = fetch_writes(conn, thread_id, &rows).await?;
    assemble(thread_id, rows, blobs, writes, shared_blobs)
}

/// Saves one checkpoint with its blobs on `conn`, in one statement, so callers can make it part
/// of a larger transaction (a state update saves it with the thread's new columns).
///
/// `saved_by`, the run saving it, must still exist, else nothing is saved: a rolled-back run
/// is deleted with its checkpoints in one transaction (its end, or the claim that ends it
/// after its worker was lost), and a worker still executing it afterwards (one that lost its
/// lease, not its process) must not put checkpoints back on the thread. The statement locks
/// the run's row (`FOR KEY SHARE`, which only a deletion of the run waits for), so a save
/// either commits before the deletion takes the row, and is then seen and deleted by that
/// transaction's later statements, or waits for it and finds the run gone.
pub(crate) async fn insert_checkpoint(
    conn: &mut PgConnection,
    put: &Put<'_>,
    saved_by: Option<uuid::Uuid>,
) -> Result<(), CheckpointError> {
    let stored = stored_checkpoint(put.checkpoint);
    let blobs = encode_blobs(put.blobs)?;
    let channels: Vec<&str> = blobs.iter().map(|b| b.channel.as_str()).collect();
    let versions: Vec<i64> = blobs.iter().map(|b| b.version).collect();
    let bases: Vec<Option<i64>> = blobs.iter().map(|b| b.base).collect();
    let values: Vec<&[u8]> = blobs.iter().map(|b| b.value.as_slice()).collect();
    // Saved again under the same id, a checkpoint replaces the earlier one, writes
    // included. A first save keeps the writes already there: a Python graph's loop may save
    // a step's writes before the checkpoint they were made on (the `EXISTS` reads the table
    // as it was before this statement).
    let saved = sqlx::query(
        "WITH live AS ( \
             SELECT $11::uuid IS NULL OR EXISTS ( \
                 SELECT 1 FROM runs WHERE run_id = $11 FOR KEY SHARE) AS ok \
         ), new_blobs AS ( \
             INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, base, value) \
             SELECT $1, $2, ch, v, b, val \
             FROM UNNEST($7::text[], $8::bigint[], $9::bigint[], $10::bytea[]) AS u(ch, v, b, val) \
             WHERE (SELECT ok FROM live) \
             ON CONFLICT DO NOTHING \
         ), stale_writes AS ( \
             DELETE FROM checkpoint_writes \
             WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3 \
               AND (SELECT ok FROM live) \
               AND EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = $1 \
                           AND checkpoint_ns = $2 AND checkpoint_id = $3) \
         ) \
         INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, \
                                  checkpoint, metadata) \
         SELECT $1, $2, $3, $4, $5, $6 WHERE (SELECT ok FROM live) \
         ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET \
             parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, \
             checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata",
    )
    .bind(put.thread_id)
    .bind(put.checkpoint_ns)
    .bind(&stored.id)
    .bind(put.parent_id)
    .bind(Json(&stored))
    .bind(Json(jsonb_safe(put.metadata)))
    .bind(channels)
    .bind(versions)
    .bind(bases)
    .bind(values)
    .bind(saved_by)
    .execute(conn)
    .await
    .map_err(backend)?;
    if saved.rows_affected() == 0 {
        return Err(run_gone(
            saved_by.map(|r| r.to_string()).unwrap_or_default(),
            &stored.id,
        ));
    }
    Ok(())
}

/// Saves several checkpoints with their blobs in one statement (a writer's group, see
/// `pg_writer`), each as [`insert_checkpoint`] saves one; that holds while no two are the
/// same checkpoint, which the caller sees to. Refused whole when any one's run is gone (the
/// caller then saves them one at a time, which tells which).
pub(crate) async fn insert_checkpoints(
    conn: &mut PgConnection,
    puts: &[Put<'_>],
) -> Result<(), CheckpointError> {
    let mut threads = Vec::with_capacity(puts.len());
    let mut namespaces = Vec::with_capacity(puts.len());
    let mut ids = Vec::with_capacity(puts.len());
    let mut parents = Vec::with_capacity(puts.len());
    let mut checkpoints = Vec::with_capacity(puts.len());
    let mut metadata = Vec::with_capacity(puts.len());
    let mut saved_by_runs = Vec::with_capacity(puts.len());
    let (mut blob_of, mut channels, mut versions, mut bases, mut values) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (n, put) in (1i32..).zip(puts) {
        let stored = stored_checkpoint(put.checkpoint);
        threads.push(put.thread_id);
        namespaces.push(put.checkpoint_ns);
        ids.push(stored.id.clone());
        parents.push(put.parent_id);
        checkpoints.push(serde_json::to_string(&stored).map_err(backend)?);
        metadata.push(jsonb_safe(put.metadata).to_string());
        saved_by_runs.push(saved_by(put.metadata));
        for blob in encode_blobs(put.blobs)? {
            blob_of.push(n);
            channels.push(blob.channel);
            versions.push(blob.version);
            bases.push(blob.base);
            values.push(blob.value);
        }
    }
    // The blobs find their checkpoint's thread and namespace by its place in the arrays, not
    // by a join: the writer's connection plans without hash or merge joins (`pg_writer`), and
    // joining the blobs' UNNEST to the checkpoints was a nested loop that unnested every blob
    // again for each checkpoint (half the statement's time at 8 runs a group, and quadratic).
    let saved = sqlx::query(
        "WITH input AS ( \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
                                  $6::text[], $7::uuid[]) \
             WITH ORDINALITY AS u(thread_id, ns, id, parent, cp, md, saved_by, n) \
         ), live AS ( \
             SELECT run_id FROM runs WHERE run_id IN (SELECT saved_by FROM input) FOR KEY SHARE \
         ), ok AS ( \
             SELECT * FROM input WHERE saved_by IS NULL OR saved_by IN (SELECT run_id FROM live) \
         ), new_blobs AS ( \
             INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, base, value) \
             SELECT ($1::text[])[b.n], ($2::text[])[b.n], b.ch, b.v, b.base, b.val \
             FROM UNNEST($8::int4[], $9::text[], $10::int8[], $11::int8[], $12::bytea[]) \
                  AS b(n, ch, v, base, val) \
             WHERE b.n = ANY (ARRAY(SELECT n FROM ok)) \
             ON CONFLICT DO NOTHING \
         ), stale_writes AS ( \
             DELETE FROM checkpoint_writes w USING ok \
             WHERE w.thread_id = ok.thread_id AND w.checkpoint_ns = ok.ns \
               AND w.checkpoint_id = ok.id \
               AND EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = ok.thread_id \
                           AND c.checkpoint_ns = ok.ns AND c.checkpoint_id = ok.id) \
         ) \
         INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, \
                                  checkpoint, metadata) \
         SELECT thread_id, ns, id, parent, cp::jsonb, md::jsonb FROM ok \
         ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET \
             parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, \
             checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata",
    )
    .bind(threads)
    .bind(namespaces)
    .bind(&ids)
    .bind(parents)
    .bind(checkpoints)
    .bind(metadata)
    .bind(&saved_by_runs)
    .bind(blob_of)
    .bind(channels)
    .bind(versions)
    .bind(bases)
    .bind(values)
    .execute(conn)
    .await
    .map_err(backend)?;
    if saved.rows_affected() != puts.len() as u64 {
        return Err(CheckpointError::Backend(format!(
            "{} of {} checkpoints were not saved: their runs were deleted",
            puts.len() as u64 - saved.rows_affected(),
            puts.len()
        )));
    }
    Ok(())
}

/// Saves the pending writes of several checkpoints in two statements (a writer's group, see
/// `pg_writer`), each batch as [`insert_writes`] saves one, in order: batches of one checkpoint
/// are numbered one after the other. That holds while no batch replaces writes of a
/// checkpoint an earlier batch here wrote to, which the caller sees to.
pub(crate) async fn insert_writes_of(
    conn: &mut PgConnection,
    batches: &[WritesOf<'_>],
) -> Result<(), CheckpointError> {
    let (mut keys_thread, mut keys_ns, mut keys_id) = (Vec::new(), Vec::new(), Vec::new());
    let (mut r_thread, mut r_ns, mut r_id, mut r_task, mut r_channel) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut thread, mut ns, mut id, mut task, mut channel, mut value) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for batch in batches {
        let plan = plan_writes(batch.writes);
        keys_thread.push(batch.thread_id);
        keys_ns.push(batch.checkpoint_ns);
        keys_id.push(batch.checkpoint_id);
        for (t, c) in plan.replace {
            r_thread.push(batch.thread_id);
            r_ns.push(batch.checkpoint_ns);
            r_id.push(batch.checkpoint_id);
            r_task.push(t);
            r_channel.push(c);
        }
        for write in plan.insert {
            thread.push(batch.thread_id);
            ns.push(batch.checkpoint_ns);
            id.push(batch.checkpoint_id);
            task.push(write.task_id.as_str());
            channel.push(write.channel.as_str());
            value.push(encode_write(write)?);
        }
    }
    // As in `insert_writes`: the checkpoints' rows serialise concurrent savers of one step
    // (in a fixed order, so two groups cannot wait for each other).
    sqlx::query(
        "SELECT 1 FROM checkpoints WHERE (thread_id, checkpoint_ns, checkpoint_id) IN ( \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[])) \
         ORDER BY thread_id, checkpoint_ns, checkpoint_id FOR UPDATE",
    )
    .bind(&keys_thread)
    .bind(&keys_ns)
    .bind(&keys_id)
    .fetch_all(&mut *conn)
    .await
    .map_err(backend)?;
    // Each new write numbers itself from its checkpoint's last index (one lookup by index per
    // row) rather than joining a table of those to the input: without hash joins (`pg_writer`)
    // that join read the input again for every checkpoint.
    sqlx::query(
        "WITH replaced AS ( \
             DELETE FROM checkpoint_writes w \
             USING UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) \
                   AS r(t, ns, c, task, ch) \
             WHERE w.thread_id = r.t AND w.checkpoint_ns = r.ns AND w.checkpoint_id = r.c \
               AND w.task_id = r.task AND w.channel = r.ch \
         ), input AS ( \
             SELECT * FROM UNNEST($6::text[], $7::text[], $8::text[], $9::text[], $10::text[], \
                                  $11::bytea[]) WITH ORDINALITY AS u(t, ns, c, task, ch, val, n) \
         ) \
         INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, idx, task_id, \
                                        channel, value) \
         SELECT i.t, i.ns, i.c, \
                COALESCE((SELECT MAX(w.idx) FROM checkpoint_writes w \
                          WHERE w.thread_id = i.t AND w.checkpoint_ns = i.ns \
                            AND w.checkpoint_id = i.c), -1) \
                + ROW_NUMBER() OVER (PARTITION BY i.t, i.ns, i.c ORDER BY i.n), \
                i.task, i.ch, i.val \
         FROM input i",
    )
    .bind(r_thread)
    .bind(r_ns)
    .bind(r_id)
    .bind(r_task)
    .bind(r_channel)
    .bind(thread)
    .bind(ns)
    .bind(id)
    .bind(task)
    .bind(channel)
    .bind(value)
    .execute(&mut *conn)
    .await
    .map_err(backend)?;
    Ok(())
}

/// Copies every checkpoint, blob and pending write of thread `from` to thread `to`, in SQL
/// (on the caller's transaction). Checkpoint ids stay as they are, as LangGraph's copy keeps
/// them; delta chains stay valid since blobs keep their versions and bases.
pub(crate) async fn copy_checkpoints(
    conn: &mut PgConnection,
    from: &str,
    to: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH c AS ( \
             INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, \
                                      parent_checkpoint_id, checkpoint, metadata, created_at) \
             SELECT $2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, \
                    metadata, created_at \
             FROM checkpoints WHERE thread_id = $1 \
         ), b AS ( \
             INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, base, value) \
             SELECT $2, checkpoint_ns, channel, version, base, value \
             FROM checkpoint_blobs WHERE thread_id = $1 \
         ) \
         INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, idx, task_id, \
                                        channel, value) \
         SELECT $2, checkpoint_ns, checkpoint_id, idx, task_id, channel, value \
         FROM checkpoint_writes WHERE thread_id = $1",
    )
    .bind(from)
    .bind(to)
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes the checkpoints a run saved (every namespace: its metadata's `run_id`), their
/// pending writes, and the blobs no checkpoint left reaches (on the caller's transaction).
pub(crate) async fn delete_run_checkpoints(
    conn: &mut PgConnection,
    thread_id: &str,
    run_id: uuid::Uuid,
) -> Result<(), sqlx::Error> {
    let deleted: i64 = sqlx::query_scalar(
        "WITH gone AS ( \
             DELETE FROM checkpoints WHERE thread_id = $1 AND metadata ->> 'run_id' = $2 \
             RETURNING checkpoint_ns, checkpoint_id \
         ), writes AS ( \
             DELETE FROM checkpoint_writes w USING gone g WHERE w.thread_id = $1 \
               AND w.checkpoint_ns = g.checkpoint_ns AND w.checkpoint_id = g.checkpoint_id \
         ) \
         SELECT COUNT(*) FROM gone",
    )
    .bind(thread_id)
    .bind(run_id.to_string())
    .fetch_one(&mut *conn)
    .await?;
    if deleted > 0 {
        delete_unreached_blobs(conn, thread_id).await?;
    }
    Ok(())
}

/// Removes the thread's blobs that no checkpoint of it reaches, through its channel versions
/// and the delta chains they build on (`base`).
pub(crate) async fn delete_unreached_blobs(
    conn: &mut PgConnection,
    thread_id: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH RECURSIVE reached(checkpoint_ns, channel, version) AS ( \
             SELECT c.checkpoint_ns, v.key COLLATE \"C\", v.value::bigint FROM checkpoints c, \
                    jsonb_each_text(c.checkpoint -> 'channel_versions') v WHERE c.thread_id = $1 \
           UNION \
             SELECT b.checkpoint_ns, b.channel, b.base FROM reached r \
             JOIN checkpoint_blobs b ON b.thread_id = $1 AND b.checkpoint_ns = r.checkpoint_ns \
              AND b.channel = r.channel AND b.version = r.version \
             WHERE b.base IS NOT NULL \
         ) \
         DELETE FROM checkpoint_blobs b WHERE b.thread_id = $1 AND NOT EXISTS ( \
             SELECT 1 FROM reached r WHERE r.checkpoint_ns = b.checkpoint_ns \
               AND r.channel = b.channel AND r.version = b.version)",
    )
    .bind(thread_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Saves pending writes of a checkpoint, numbered after its last ones, inside the caller's
/// transaction. The checkpoint need not be stored yet: as with LangGraph's own savers, a
/// Python graph's loop saves a step's writes while the checkpoint they were made on is still
/// being saved.
async fn insert_writes(
    conn: &mut PgConnection,
    thread_id: &str,
    checkpoint_ns: &str,
    checkpoint_id: &str,
    writes: &[PendingWrite],
) -> Result<(), CheckpointError> {
    let plan = plan_writes(writes);
    let values = plan
        .insert
        .iter()
        .map(|w| encode_write(w))
        .collect::<Result<Vec<_>, _>>()?;
    // Tasks of one step finish concurrently and save against the same checkpoint: locking
    // its row serialises them, so each sees the others' last index. (The next statement
    // takes a new snapshot, after the lock was granted.) A run's saves reach the database one
    // at a time anyway (its event pump orders them), so writes that come before their
    // checkpoint need no lock.
    sqlx::query(
        "SELECT 1 FROM checkpoints \
             WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3 FOR UPDATE",
    )
    .bind(thread_id)
    .bind(checkpoint_ns)
    .bind(checkpoint_id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(backend)?;
    let replace_tasks: Vec<&str> = plan.replace.iter().map(|(t, _)| *t).collect();
    let replace_channels: Vec<&str> = plan.replace.iter().map(|(_, c)| *c).collect();
    let tasks: Vec<&str> = plan.insert.iter().map(|w| w.task_id.as_str()).collect();
    let channels: Vec<&str> = plan.insert.iter().map(|w| w.channel.as_str()).collect();
    let values: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    // The `DELETE` and the next index read the same snapshot: indexes of replaced writes
    // are not reused, which only leaves gaps.
    sqlx::query(
            "WITH replaced AS ( \
                 DELETE FROM checkpoint_writes \
                 WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3 \
                   AND (task_id, channel) IN (SELECT * FROM UNNEST($4::text[], $5::text[])) \
             ), next AS ( \
                 SELECT COALESCE(MAX(idx), -1) + 1 AS idx FROM checkpoint_writes \
                 WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3 \
             ) \
             INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, idx, task_id, \
                                            channel, value) \
             SELECT $1, $2, $3, next.idx + u.n - 1, u.task, u.ch, u.val \
             FROM next, UNNEST($6::text[], $7::text[], $8::bytea[]) WITH ORDINALITY AS u(task, ch, val, n)",
        )
        .bind(thread_id)
        .bind(checkpoint_ns)
        .bind(checkpoint_id)
        .bind(replace_tasks)
        .bind(replace_channels)
        .bind(tasks)
        .bind(channels)
        .bind(values)
        .execute(&mut *conn)
        .await
        .map_err(backend)?;
    Ok(())
}

/// Stores a run's save and the events it carries, the events first ([`LoggedSave`]), on the
/// caller's transaction (the writer's group, `pg_writer`).
pub(crate) async fn store_logged(
    conn: &mut PgConnection,
    save: &LoggedSave,
) -> Result<(), CheckpointError> {
    insert_events(conn, &save.events).await?;
    match Save::of(&save.write) {
        Save::Checkpoint(put) => insert_checkpoint(conn, &put, saved_by(put.metadata)).await,
        Save::Writes(of) => {
            insert_writes(
                conn,
                of.thread_id,
                of.checkpoint_ns,
                of.checkpoint_id,
                of.writes,
            )
            .await
        }
    }
}

#[async_trait]
impl Checkpointer for PostgresCheckpointer {
    async fn put(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint: &Checkpoint,
        metadata: &Value,
        parent_id: Option<&str>,
        blobs: &[ChannelBlob],
    ) -> Result<(), CheckpointError> {
        let mut conn = self.pool.acquire().await.map_err(backend)?;
        let put = Put {
            thread_id,
            checkpoint_ns,
            checkpoint,
            metadata,
            parent_id,
            blobs,
        };
        insert_checkpoint(&mut conn, &put, saved_by(metadata)).await
    }

    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        writes: &[PendingWrite],
    ) -> Result<(), CheckpointError> {
        let mut tx = self.pool.begin().await.map_err(backend)?;
        insert_writes(&mut tx, thread_id, checkpoint_ns, checkpoint_id, writes).await?;
        tx.commit().await.map_err(backend)
    }

    async fn get_tuple(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointTuple>, CheckpointError> {
        let mut conn = self.pool.acquire().await.map_err(backend)?;
        let sql = match checkpoint_id {
            Some(_) => format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints \
                 WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = $3"
            ),
            None => format!(
                "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints \
                 WHERE thread_id = $1 AND checkpoint_ns = $2 \
                 ORDER BY checkpoint_id DESC LIMIT 1"
            ),
        };
        let mut query = sqlx::query_as(&sql).bind(thread_id).bind(checkpoint_ns);
        if let Some(id) = checkpoint_id {
            query = query.bind(id);
        }
        let rows: Vec<CheckpointRow> = query.fetch_all(&mut *conn).await.map_err(backend)?;
        Ok(load(&mut conn, thread_id, rows, false).await?.pop())
    }

    async fn list(
        &self,
        thread_id: &str,
        checkpoint_ns: Option<&str>,
        filter: &ListFilter,
    ) -> Result<Vec<CheckpointTuple>, CheckpointError> {
        let mut conn = self.pool.acquire().await.map_err(backend)?;
        let mut qb: QueryBuilder<'_, Postgres> = QueryBuilder::new(format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = "
        ));
        qb.push_bind(thread_id);
        if let Some(ns) = checkpoint_ns {
            qb.push(" AND checkpoint_ns = ").push_bind(ns);
        }
        if let Some(before) = &filter.before {
            qb.push(" AND checkpoint_id < ").push_bind(before.as_str());
        }
        if let Some(metadata) = metadata_filter(filter.metadata.as_ref()) {
            qb.push(" AND metadata @> ").push_bind(Json(metadata));
        }
        qb.push(" ORDER BY checkpoint_id DESC");
        if checkpoint_ns.is_none() {
            qb.push(", checkpoint_ns DESC");
        }
        if filter.limit.is_some() {
            qb.push(" LIMIT ").push_bind(limit_to_db(filter.limit));
        }
        let rows: Vec<CheckpointRow> = qb
            .build_query_as()
            .fetch_all(&mut *conn)
            .await
            .map_err(backend)?;
        load(&mut conn, thread_id, rows, true).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        sqlx::query(
            "WITH w AS (DELETE FROM checkpoint_writes WHERE thread_id = $1), \
                  b AS (DELETE FROM checkpoint_blobs WHERE thread_id = $1) \
             DELETE FROM checkpoints WHERE thread_id = $1",
        )
        .bind(thread_id)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        if from == to {
            return Ok(());
        }
        let mut tx = self.pool.begin().await.map_err(backend)?;
        let exists: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM checkpoints WHERE thread_id = $1 LIMIT 1")
                .bind(from)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
        if exists.is_none() {
            return Ok(());
        }
        // The copy replaces whatever `to` had, as the engine's in-memory saver does. The
        // deletions and insertions are separate statements: in one statement the inserts
        // would not see the deletions and collide with the rows they remove.
        sqlx::query(
            "WITH w AS (DELETE FROM checkpoint_writes WHERE thread_id = $1), \
                  b AS (DELETE FROM checkpoint_blobs WHERE thread_id = $1) \
             DELETE FROM checkpoints WHERE thread_id = $1",
        )
        .bind(to)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        copy_checkpoints(&mut tx, from, to).await.map_err(backend)?;
        tx.commit().await.map_err(backend)
    }
}
