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
use crate::postgres::PgQuery;
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

/// Checkpoints with their blobs as a writer's group saves them (the `c_` and `b_` arrays of
/// `spindle_write_group`, migration 0014): each as [`insert_checkpoint`] saves one, which
/// holds while no two are the same checkpoint (the caller sees to it). A blob names its
/// checkpoint by its place (from 1) in the checkpoints' arrays.
#[derive(Default)]
pub(crate) struct CheckpointArrays<'a> {
    threads: Vec<&'a str>,
    namespaces: Vec<&'a str>,
    ids: Vec<String>,
    parents: Vec<Option<&'a str>>,
    checkpoints: Vec<String>,
    metadata: Vec<String>,
    saved_by_runs: Vec<Option<uuid::Uuid>>,
    blob_of: Vec<i32>,
    channels: Vec<String>,
    versions: Vec<i64>,
    bases: Vec<Option<i64>>,
    values: Vec<Vec<u8>>,
}

impl<'a> CheckpointArrays<'a> {
    pub(crate) fn of(puts: &[Put<'a>]) -> Result<Self, CheckpointError> {
        let mut arrays = Self::default();
        for (n, put) in (1i32..).zip(puts) {
            let stored = stored_checkpoint(put.checkpoint);
            arrays.threads.push(put.thread_id);
            arrays.namespaces.push(put.checkpoint_ns);
            arrays.ids.push(stored.id.clone());
            arrays.parents.push(put.parent_id);
            arrays
                .checkpoints
                .push(serde_json::to_string(&stored).map_err(backend)?);
            arrays.metadata.push(jsonb_safe(put.metadata).to_string());
            arrays.saved_by_runs.push(saved_by(put.metadata));
            for blob in encode_blobs(put.blobs)? {
                arrays.blob_of.push(n);
                arrays.channels.push(blob.channel);
                arrays.versions.push(blob.version);
                arrays.bases.push(blob.base);
                arrays.values.push(blob.value);
            }
        }
        Ok(arrays)
    }

    /// Binds the arrays, in the function's order.
    pub(crate) fn bind(self, query: PgQuery<'a>) -> PgQuery<'a> {
        query
            .bind(self.threads)
            .bind(self.namespaces)
            .bind(self.ids)
            .bind(self.parents)
            .bind(self.checkpoints)
            .bind(self.metadata)
            .bind(self.saved_by_runs)
            .bind(self.blob_of)
            .bind(self.channels)
            .bind(self.versions)
            .bind(self.bases)
            .bind(self.values)
    }
}

/// The pending writes of several checkpoints as a writer's group saves them (the `k_`, `x_`
/// and `w_` arrays of `spindle_write_group`): each batch as [`insert_writes`] saves one, in
/// order, batches of one checkpoint numbered one after the other. That holds while no batch
/// replaces writes of a checkpoint an earlier batch here wrote to (the caller sees to it).
#[derive(Default)]
pub(crate) struct PendingWriteArrays<'a> {
    /// The checkpoints written to, whose rows are locked.
    locked: [Vec<&'a str>; 3],
    /// Writes replaced: thread, namespace, checkpoint, task, channel.
    replaced: [Vec<&'a str>; 5],
    /// Writes inserted: thread, namespace, checkpoint, task, channel, and their values.
    inserted: [Vec<&'a str>; 5],
    values: Vec<Vec<u8>>,
}

impl<'a> PendingWriteArrays<'a> {
    pub(crate) fn of(batches: &[WritesOf<'a>]) -> Result<Self, CheckpointError> {
        let mut arrays = Self::default();
        for batch in batches {
            let key = [batch.thread_id, batch.checkpoint_ns, batch.checkpoint_id];
            let plan = plan_writes(batch.writes);
            push_all(&mut arrays.locked, key);
            for (task, channel) in plan.replace {
                push_all(
                    &mut arrays.replaced,
                    [key[0], key[1], key[2], task, channel],
                );
            }
            for write in plan.insert {
                let row = [key[0], key[1], key[2], &write.task_id, &write.channel];
                push_all(&mut arrays.inserted, row);
                arrays.values.push(encode_write(write)?);
            }
        }
        Ok(arrays)
    }

    /// Binds the arrays, in the function's order.
    pub(crate) fn bind(self, query: PgQuery<'a>) -> PgQuery<'a> {
        let query = self.locked.into_iter().fold(query, |q, a| q.bind(a));
        let query = self.replaced.into_iter().fold(query, |q, a| q.bind(a));
        let query = self.inserted.into_iter().fold(query, |q, a| q.bind(a));
        query.bind(self.values)
    }
}

fn push_all<'a, const N: usize>(columns: &mut [Vec<&'a str>; N], row: [&'a str; N]) {
    for (column, value) in columns.iter_mut().zip(row) {
        column.push(value);
    }
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
