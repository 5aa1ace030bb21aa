//! Checkpoints in SQLite: writes run on the storage's writer thread (`sqlite_writer`), reads
//! through its read-only pool, each read in one transaction so its queries see one snapshot.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use rusqlite::{Connection, OptionalExtension};
use serde_json::Value;
use spindle_graph::checkpoint::{
    ChannelBlob, Checkpoint, CheckpointError, CheckpointTuple, Checkpointer, ListFilter,
    PendingWrite, QueuedWrite, WriteReceipt,
};
use sqlx::sqlite::SqlitePool;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

use super::{
    assemble, backend, encode_blobs, encode_write, limit_to_db, metadata_filter, plan_writes,
    stored_checkpoint, wanted_blobs, BlobRow, Blobs, CheckpointRow, EncodedBlob, Put, WritePlan,
    WriteRow, CHECKPOINT_COLUMNS,
};
use crate::json_filter::push_sqlite_contains;
use crate::sqlite_reader::Readers;
use crate::sqlite_values::ts;
use crate::sqlite_writer::Writer;

/// The engine's [`Checkpointer`] over the SQLite backend: reads through its pool, writes
/// through its writer thread.
pub struct SqliteCheckpointer {
    read: SqlitePool,
    readers: Arc<Readers>,
    writer: Arc<Writer>,
}

impl SqliteCheckpointer {
    pub(crate) fn new(read: SqlitePool, readers: Arc<Readers>, writer: Arc<Writer>) -> Self {
        Self {
            read,
            readers,
            writer,
        }
    }
}

/// The blobs of delta chains: a recursive CTE starts from the wanted `(namespace, channel,
/// version)` triples (`$2`, a JSON array of them) and follows `base`, ending each chain with a
/// `NULL` version, which matches no blob.
///
/// The step looks `base` up in a scalar subquery rather than a join: given `sqlite_stat1`
/// (after `ANALYZE` or `PRAGMA optimize`), SQLite would put a Bloom filter on a joined
/// lookup, and building it scans the table at every step of the recursion.
const BLOBS_SQL: &str = "WITH RECURSIVE chain(checkpoint_ns, channel, version) AS ( \
        SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), \
               json_extract(value, '$[2]') FROM json_each($2) \
      UNION \
        SELECT c.checkpoint_ns, c.channel, \
               (SELECT b.base FROM checkpoint_blobs b WHERE b.thread_id = $1 \
                  AND b.checkpoint_ns = c.checkpoint_ns AND b.channel = c.channel \
                  AND b.version = c.version AND b.base < b.version) \
        FROM chain c WHERE c.version IS NOT NULL \
    ) \
    SELECT b.checkpoint_ns, b.channel, b.version, b.value FROM chain c \
    JOIN checkpoint_blobs b ON b.thread_id = $1 AND b.checkpoint_ns = c.checkpoint_ns \
     AND b.channel = c.channel AND b.version = c.version";

/// The pending writes of the checkpoints `$2` (a JSON array of `[namespace, id]`) of thread
/// `$1`, ordered by checkpoint and `idx`.
const WRITES_SQL: &str = "WITH page(checkpoint_ns, checkpoint_id) AS ( \
         SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each($2) \
     ) \
     SELECT w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.value \
     FROM page p JOIN checkpoint_writes w ON w.thread_id = $1 \
      AND w.checkpoint_ns = p.checkpoint_ns AND w.checkpoint_id = p.checkpoint_id \
     ORDER BY w.checkpoint_ns, w.checkpoint_id, w.idx";

/// `$1` and `$2` of [`BLOBS_SQL`] and [`WRITES_SQL`], bound by name: SQLite numbers `$N`
/// parameters in order of first use, and `$2` comes first.
macro_rules! by_name {
    ($thread_id:expr, $keys:expr) => {
        rusqlite::named_params! {"$1": $thread_id, "$2": $keys}
    };
}

/// The JSON array of blob keys [`BLOBS_SQL`] takes; `None` when no blob is wanted.
fn blob_keys(rows: &[CheckpointRow]) -> Result<Option<String>, CheckpointError> {
    let wanted = wanted_blobs(rows)?;
    if wanted.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(&wanted)
        .map(Some)
        .map_err(|e| CheckpointError::Backend(format!("cannot encode blob keys: {e}")))
}

/// The JSON array of checkpoint keys [`WRITES_SQL`] takes.
fn write_keys(rows: &[CheckpointRow]) -> Result<String, CheckpointError> {
    let keys: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.checkpoint_ns.as_str(), r.checkpoint_id.as_str()))
        .collect();
    serde_json::to_string(&keys)
        .map_err(|e| CheckpointError::Backend(format!("cannot encode checkpoint keys: {e}")))
}

/// A checkpoint with its blobs and writes, read on the caller's thread (`sqlite_reader`).
fn load_one(
    conn: &Connection,
    thread_id: &str,
    row: CheckpointRow,
) -> Result<CheckpointTuple, CheckpointError> {
    let rows = vec![row];
    let blobs = match blob_keys(&rows)? {
        Some(keys) => {
            let mut statement = conn.prepare_cached(BLOBS_SQL).map_err(backend)?;
            let found = statement
                .query_map(by_name!(thread_id, keys), BlobRow::from_sqlite)
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            Blobs::decode(found)?
        }
        None => Blobs::default(),
    };
    let keys = write_keys(&rows)?;
    let writes = conn
        .prepare_cached(WRITES_SQL)
        .map_err(backend)?
        .query_map(by_name!(thread_id, keys), WriteRow::from_sqlite)
        .map_err(backend)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(backend)?;
    let mut tuples = assemble(thread_id, rows, blobs, writes, false)?;
    tuples
        .pop()
        .ok_or_else(|| CheckpointError::Backend("a loaded checkpoint vanished".to_owned()))
}

/// The blobs that rebuild `rows`' channels, delta chains included, in one query
/// ([`BLOBS_SQL`]).
async fn fetch_blobs(
    conn: &mut SqliteConnection,
    thread_id: &str,
    rows: &[CheckpointRow],
) -> Result<Blobs, CheckpointError> {
    let Some(wanted) = blob_keys(rows)? else {
        return Ok(Blobs::default());
    };
    let rows: Vec<BlobRow> = sqlx::query_as(BLOBS_SQL)
        .bind(thread_id)
        .bind(wanted)
        .fetch_all(conn)
        .await
        .map_err(backend)?;
    Blobs::decode(rows)
}

/// The pending writes of `rows`' checkpoints, ordered by checkpoint and `idx`.
async fn fetch_writes(
    conn: &mut SqliteConnection,
    thread_id: &str,
    rows: &[CheckpointRow],
) -> Result<Vec<WriteRow>, CheckpointError> {
    let keys = write_keys(rows)?;
    sqlx::query_as(WRITES_SQL)
        .bind(thread_id)
        .bind(keys)
        .fetch_all(conn)
        .await
        .map_err(backend)
}

async fn load(
    conn: &mut SqliteConnection,
    thread_id: &str,
    rows: Vec<CheckpointRow>,
    shared_blobs: bool,
) -> Result<Vec<CheckpointTuple>, CheckpointError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let blobs = fetch_blobs(conn, thread_id, &rows).await?;
    let writes = fetch_writes(conn, thread_id, &rows).await?;
    assemble(thread_id, rows, blobs, writes, shared_blobs)
}

/// A checkpoint's rows, encoded on the caller's thread: the writer thread, which only
/// inserts them, is the bottleneck.
struct EncodedCheckpoint {
    thread_id: String,
    checkpoint_ns: String,
    checkpoint_id: String,
    parent_id: Option<String>,
    checkpoint: String,
    metadata: String,
    blobs: Vec<EncodedBlob>,
}

impl EncodedCheckpoint {
    fn new(put: &Put<'_>) -> Result<Self, CheckpointError> {
        let stored = stored_checkpoint(put.checkpoint);
        Ok(Self {
            thread_id: put.thread_id.to_owned(),
            checkpoint_ns: put.checkpoint_ns.to_owned(),
            checkpoint: serde_json::to_string(&stored).map_err(encoding)?,
            checkpoint_id: stored.id,
            parent_id: put.parent_id.map(str::to_owned),
            metadata: serde_json::to_string(put.metadata).map_err(encoding)?,
            blobs: encode_blobs(put.blobs)?,
        })
    }
}

/// Refuses a queued checkpoint whose parent is not stored. Saves are queued while the run goes
/// on, so the one before may have failed after this one was queued: storing this one would
/// leave a checkpoint whose history, and the blobs its deltas build on, are missing.
fn require_parent(conn: &Connection, put: &EncodedCheckpoint) -> Result<(), CheckpointError> {
    let Some(parent) = &put.parent_id else {
        return Ok(());
    };
    let stored = conn
        .prepare_cached(
            "SELECT 1 FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2 \
             AND checkpoint_id = ?3",
        )
        .map_err(backend)?
        .exists((&put.thread_id, &put.checkpoint_ns, parent))
        .map_err(backend)?;
    if !stored {
        return Err(CheckpointError::Missing(format!(
            "checkpoint {parent} of {}, the parent of {}",
            put.thread_id, put.checkpoint_id
        )));
    }
    Ok(())
}

/// Saves one checkpoint with its blobs on the write connection (inside the caller's write),
/// so it can be part of a larger change (a state update saves it with the thread's new
/// columns).
pub(crate) fn insert_checkpoint(conn: &Connection, put: &Put<'_>) -> Result<(), CheckpointError> {
    insert_encoded(conn, &EncodedCheckpoint::new(put)?)
}

fn insert_encoded(conn: &Connection, put: &EncodedCheckpoint) -> Result<(), CheckpointError> {
    let key = (&put.thread_id, &put.checkpoint_ns, &put.checkpoint_id);
    let mut insert_blob = conn
        .prepare_cached(
            "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, base, value) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        )
        .map_err(backend)?;
    // Versions are immutable: an existing blob already holds this content.
    for b in &put.blobs {
        insert_blob
            .execute((
                key.0,
                key.1,
                &b.channel,
                b.version,
                b.base,
                b.value.as_slice(),
            ))
            .map_err(backend)?;
    }
    let inserted = conn
        .prepare_cached(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, \
             parent_checkpoint_id, checkpoint, metadata, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO NOTHING",
        )
        .map_err(backend)?
        .execute((
            key.0,
            key.1,
            key.2,
            &put.parent_id,
            &put.checkpoint,
            &put.metadata,
            ts(Utc::now()),
        ))
        .map_err(backend)?;
    if inserted == 0 {
        // Saved again under the same id: it replaces the earlier one, writes included.
        conn.prepare_cached(
            "UPDATE checkpoints SET parent_checkpoint_id = ?4, checkpoint = ?5, metadata = ?6 \
             WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3",
        )
        .map_err(backend)?
        .execute((
            key.0,
            key.1,
            key.2,
            &put.parent_id,
            &put.checkpoint,
            &put.metadata,
        ))
        .map_err(backend)?;
        conn.prepare_cached(
            "DELETE FROM checkpoint_writes \
             WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3",
        )
        .map_err(backend)?
        .execute(key)
        .map_err(backend)?;
    }
    Ok(())
}

fn encoding(e: serde_json::Error) -> CheckpointError {
    CheckpointError::Backend(format!("cannot encode a checkpoint: {e}"))
}

/// Saves pending writes of a checkpoint, numbered after its last one; none when the
/// checkpoint does not exist.
fn insert_writes(
    conn: &Connection,
    thread_id: &str,
    checkpoint_ns: &str,
    checkpoint_id: &str,
    plan: &WritePlan<'_>,
    values: &[Vec<u8>],
) -> Result<(), CheckpointError> {
    let key = (thread_id, checkpoint_ns, checkpoint_id);
    let mut replace = conn
        .prepare_cached(
            "DELETE FROM checkpoint_writes WHERE thread_id = ?1 AND checkpoint_ns = ?2 \
             AND checkpoint_id = ?3 AND task_id = ?4 AND channel = ?5",
        )
        .map_err(backend)?;
    for (task, channel) in &plan.replace {
        replace
            .execute((key.0, key.1, key.2, *task, *channel))
            .map_err(backend)?;
    }
    if plan.insert.is_empty() {
        return Ok(());
    }
    // The writer thread runs one write at a time, so the numbering cannot race.
    let next: Option<i64> = conn
        .prepare_cached(
            "SELECT (SELECT COALESCE(MAX(w.idx), -1) + 1 FROM checkpoint_writes w \
              WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns \
              AND w.checkpoint_id = c.checkpoint_id) \
             FROM checkpoints c WHERE c.thread_id = ?1 AND c.checkpoint_ns = ?2 \
             AND c.checkpoint_id = ?3",
        )
        .map_err(backend)?
        .query_row(key, |r| r.get(0))
        .optional()
        .map_err(backend)?;
    let Some(next) = next else {
        return Err(CheckpointError::Missing(format!(
            "checkpoint {checkpoint_id} of {thread_id}"
        )));
    };
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, idx, \
             task_id, channel, value) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(backend)?;
    for (offset, (w, value)) in plan.insert.iter().zip(values).enumerate() {
        insert
            .execute((
                key.0,
                key.1,
                key.2,
                next + offset as i64,
                w.task_id.as_str(),
                w.channel.as_str(),
                value.as_slice(),
            ))
            .map_err(backend)?;
    }
    Ok(())
}

/// Removes every checkpoint row of a thread (inside the caller's write).
pub(crate) fn delete_checkpoints(conn: &Connection, thread_id: &str) -> rusqlite::Result<()> {
    for table in ["checkpoint_writes", "checkpoint_blobs", "checkpoints"] {
        conn.prepare_cached(&format!("DELETE FROM {table} WHERE thread_id = ?1"))?
            .execute([thread_id])?;
    }
    Ok(())
}

impl SqliteCheckpointer {
    /// Queues a save on the writer thread, which applies saves in the order they come.
    fn submit(&self, write: QueuedWrite) -> WriteReceipt {
        match write {
            QueuedWrite::Checkpoint {
                thread_id,
                checkpoint_ns,
                checkpoint,
                metadata,
                parent_id,
                blobs,
            } => {
                let put = Put {
                    thread_id: &thread_id,
                    checkpoint_ns: &checkpoint_ns,
                    checkpoint: &checkpoint,
                    metadata: &metadata,
                    parent_id: parent_id.as_deref(),
                    blobs: &blobs,
                };
                // Encoded here, on the caller's thread: the writer thread is the bottleneck.
                match EncodedCheckpoint::new(&put) {
                    Ok(encoded) => Box::pin(self.writer.submit(move |conn| {
                        require_parent(conn, &encoded)?;
                        insert_encoded(conn, &encoded)
                    })),
                    Err(e) => Box::pin(std::future::ready(Err(e))),
                }
            }
            QueuedWrite::Writes {
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                writes,
            } => {
                // Encoded here, on the caller's thread: the writer thread is the bottleneck.
                let values = match plan_writes(&writes)
                    .insert
                    .iter()
                    .map(|w| encode_write(w))
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(values) => values,
                    Err(e) => return Box::pin(std::future::ready(Err(e))),
                };
                Box::pin(self.writer.submit(move |conn| {
                    let plan = plan_writes(&writes);
                    insert_writes(
                        conn,
                        &thread_id,
                        &checkpoint_ns,
                        &checkpoint_id,
                        &plan,
                        &values,
                    )
                }))
            }
        }
    }
}

#[async_trait]
impl Checkpointer for SqliteCheckpointer {
    async fn put(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint: &Checkpoint,
        metadata: &Value,
        parent_id: Option<&str>,
        blobs: &[ChannelBlob],
    ) -> Result<(), CheckpointError> {
        self.submit(QueuedWrite::Checkpoint {
            thread_id: thread_id.to_owned(),
            checkpoint_ns: checkpoint_ns.to_owned(),
            checkpoint: Box::new(checkpoint.clone()),
            metadata: metadata.clone(),
            parent_id: parent_id.map(str::to_owned),
            blobs: blobs.to_vec(),
        })
        .await
    }

    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: &str,
        writes: &[PendingWrite],
    ) -> Result<(), CheckpointError> {
        self.submit(QueuedWrite::Writes {
            thread_id: thread_id.to_owned(),
            checkpoint_ns: checkpoint_ns.to_owned(),
            checkpoint_id: checkpoint_id.to_owned(),
            writes: writes.to_vec(),
        })
        .await
    }

    async fn get_tuple(
        &self,
        thread_id: &str,
        checkpoint_ns: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointTuple>, CheckpointError> {
        let sql = format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = ?1 \
             AND checkpoint_ns = ?2 AND (?3 IS NULL OR checkpoint_id = ?3) \
             ORDER BY checkpoint_id DESC LIMIT 1"
        );
        self.readers.read(|conn| {
            let row = conn
                .prepare_cached(&sql)
                .map_err(backend)?
                .query_row(
                    (thread_id, checkpoint_ns, checkpoint_id),
                    CheckpointRow::from_sqlite,
                )
                .optional()
                .map_err(backend)?;
            row.map(|row| load_one(conn, thread_id, row)).transpose()
        })
    }

    async fn list(
        &self,
        thread_id: &str,
        checkpoint_ns: Option<&str>,
        filter: &ListFilter,
    ) -> Result<Vec<CheckpointTuple>, CheckpointError> {
        let mut tx = self.read.begin().await.map_err(backend)?;
        let mut qb: QueryBuilder<'_, Sqlite> = QueryBuilder::new(format!(
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
            qb.push(" AND ");
            push_sqlite_contains(&mut qb, "metadata", metadata);
        }
        qb.push(" ORDER BY checkpoint_id DESC");
        if checkpoint_ns.is_none() {
            qb.push(", checkpoint_ns DESC");
        }
        qb.push(" LIMIT ").push_bind(limit_to_db(filter.limit));
        let rows: Vec<CheckpointRow> = qb
            .build_query_as()
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
        let tuples = load(&mut tx, thread_id, rows, true).await?;
        tx.commit().await.map_err(backend)?;
        Ok(tuples)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<(), CheckpointError> {
        let thread_id = thread_id.to_owned();
        self.writer
            .write(move |conn| delete_checkpoints(conn, &thread_id).map_err(backend))
            .await
    }

    fn queue(&self, write: QueuedWrite) -> Result<WriteReceipt, Box<QueuedWrite>> {
        Ok(self.submit(write))
    }

    async fn copy_thread(&self, from: &str, to: &str) -> Result<(), CheckpointError> {
        if from == to {
            return Ok(());
        }
        let (from, to) = (from.to_owned(), to.to_owned());
        self.writer
            .write(move |conn| copy_checkpoints(conn, &from, &to).map_err(backend))
            .await
    }
}

fn copy_checkpoints(conn: &Connection, from: &str, to: &str) -> rusqlite::Result<()> {
    let exists = conn
        .prepare_cached("SELECT 1 FROM checkpoints WHERE thread_id = ?1 LIMIT 1")?
        .exists([from])?;
    if !exists {
        return Ok(());
    }
    // The copy replaces whatever `to` had, as the engine's in-memory saver does.
    delete_checkpoints(conn, to)?;
    for sql in COPY_SQL {
        conn.prepare_cached(sql)?.execute([from, to])?;
    }
    Ok(())
}

/// Copies every row of thread `?1` to thread `?2`.
const COPY_SQL: [&str; 3] = [
    "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, \
     checkpoint, metadata, created_at) \
     SELECT ?2, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata, created_at \
     FROM checkpoints WHERE thread_id = ?1",
    "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, base, value) \
     SELECT ?2, checkpoint_ns, channel, version, base, value FROM checkpoint_blobs WHERE thread_id = ?1",
    "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, idx, task_id, channel, value) \
     SELECT ?2, checkpoint_ns, checkpoint_id, idx, task_id, channel, value \
     FROM checkpoint_writes WHERE thread_id = ?1",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// With table statistics, SQLite must still walk a delta chain by index lookups, without
    /// a Bloom filter (which scans the table) or a scan of the blobs.
    #[tokio::test]
    async fn delta_chains_are_walked_by_index_lookups_even_with_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let storage = crate::sqlite::SqliteStorage::open(dir.path().join("db").to_str().unwrap())
            .await
            .unwrap();
        let pool = storage.write_pool();
        sqlx::query(
            "WITH RECURSIVE t(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM t WHERE i < 2000) \
             INSERT INTO checkpoint_blobs SELECT 't' || (i % 20), '', 'messages', i, \
             CASE WHEN i > 20 THEN i - 20 END, x'00' FROM t",
        )
        .execute(pool)
        .await
        .unwrap();
        sqlx::query("ANALYZE").execute(pool).await.unwrap();
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {BLOBS_SQL}"))
                .bind("t1")
                .bind(r#"[["", "messages", 1981]]"#)
                .fetch_all(pool)
                .await
                .unwrap();
        let plan: Vec<String> = plan.into_iter().map(|r| r.3).collect();
        let plan = plan.join("\n");
        assert!(!plan.contains("BLOOM"), "{plan}");
        assert!(!plan.contains("SCAN b"), "{plan}");
        let rows: Vec<BlobRow> = sqlx::query_as(BLOBS_SQL)
            .bind("t1")
            .bind(r#"[["", "messages", 1981]]"#)
            .fetch_all(pool)
            .await
            .unwrap();
        assert_eq!(rows.len(), 100, "the whole chain, 1981 back to 1");
    }

    /// Checkpoints (with delta chains and pending writes) and logged events saved before the
    /// run tables became WITHOUT ROWID (0011) are read after the upgrade as they were saved,
    /// and the event log is still pruned.
    #[tokio::test]
    async fn checkpoints_and_events_saved_before_0011_are_read_after_it() {
        use spindle_graph::checkpoint::{BlobValue, ChannelBlob};

        let dir = tempfile::tempdir().unwrap();
        // At 0010, checkpoints, blobs, writes and the event log are rowid tables.
        let url = crate::sqlite::database_before(dir.path(), "0011").await;
        let thread = "0190a9e4-0000-7000-8000-000000000001";
        let run = "0190a9e4-0000-7000-8000-000000000002";
        let conn = Connection::open(dir.path().join("db")).unwrap();
        conn.execute_batch(&format!(
            "INSERT INTO threads (thread_id, created_at, updated_at, state_updated_at, event_seq) \
             VALUES ('{thread}', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', \
                     '2026-01-01T00:00:00Z', 30); \
             INSERT INTO runs (run_id, thread_id, assistant_id, status, run_after, created_at, \
                               updated_at) \
             VALUES ('{run}', '{thread}', '{run}', 'success', '2026-01-01T00:00:00Z', \
                     '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z');"
        ))
        .unwrap();
        for seq in 1..=30_i64 {
            conn.execute(
                "INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at) \
                 VALUES (?1, ?2, ?3, 'values', ?4, ?5)",
                (
                    thread,
                    seq,
                    run,
                    format!(r#"{{"n":{seq}}}"#),
                    if seq <= 10 {
                        "2026-01-01T00:00:00Z"
                    } else {
                        "2026-06-01T00:00:00Z"
                    },
                ),
            )
            .unwrap();
        }
        // Ten checkpoints, each appending a message to a list stored as deltas.
        let mut ids = Vec::new();
        let mut parent: Option<String> = None;
        for step in 1..=10_u64 {
            let id = spindle_graph::checkpoint::new_checkpoint_id();
            let checkpoint = Checkpoint {
                v: 1,
                id: id.clone(),
                ts: "2026-01-01T00:00:00Z".into(),
                channel_values: Default::default(),
                channel_versions: [("messages".to_owned(), step)].into(),
                versions_seen: Default::default(),
                updated_channels: vec!["messages".into()],
                delta_depths: Default::default(),
            };
            let value = if step == 1 {
                BlobValue::Full {
                    value: serde_json::json!(["m1"]),
                }
            } else {
                BlobValue::Append {
                    base: step - 1,
                    depth: (step - 1) as u32,
                    items: vec![serde_json::json!(format!("m{step}"))],
                }
            };
            let blobs = [ChannelBlob {
                channel: "messages".into(),
                version: step,
                value,
            }];
            let metadata = serde_json::json!({"step": step});
            let put = Put {
                thread_id: thread,
                checkpoint_ns: "",
                checkpoint: &checkpoint,
                metadata: &metadata,
                parent_id: parent.as_deref(),
                blobs: &blobs,
            };
            insert_checkpoint(&conn, &put).unwrap();
            let writes = [PendingWrite {
                task_id: format!("task{step}"),
                channel: "messages".into(),
                value: serde_json::json!(format!("w{step}")),
            }];
            let plan = plan_writes(&writes);
            let values: Vec<Vec<u8>> = plan
                .insert
                .iter()
                .map(|w| encode_write(w).unwrap())
                .collect();
            insert_writes(&conn, thread, "", &id, &plan, &values).unwrap();
            parent = Some(id.clone());
            ids.push(id);
        }
        drop(conn);

        let storage = crate::sqlite::SqliteStorage::open(&url).await.unwrap();
        let kinds: Vec<(String, String)> = sqlx::query_as(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN \
             ('checkpoints', 'checkpoint_blobs', 'checkpoint_writes', 'run_events')",
        )
        .fetch_all(storage.write_pool())
        .await
        .unwrap();
        assert_eq!(kinds.len(), 4, "{kinds:?}");
        for (name, sql) in &kinds {
            assert!(sql.contains("WITHOUT ROWID"), "{name}: {sql}");
        }

        let saver = crate::Storage::checkpointer(&storage);
        let latest = saver.get_tuple(thread, "", None).await.unwrap().unwrap();
        assert_eq!(latest.checkpoint.id, ids[9]);
        let messages: Vec<String> = (1..=10).map(|i| format!("m{i}")).collect();
        assert_eq!(
            latest.checkpoint.channel_values["messages"],
            serde_json::json!(messages)
        );
        assert_eq!(latest.metadata["step"], 10);
        assert_eq!(latest.parent_id.as_deref(), Some(ids[8].as_str()));
        assert_eq!(latest.pending_writes.len(), 1);
        assert_eq!(latest.pending_writes[0].value, "w10");
        let history = saver
            .list(thread, Some(""), &Default::default())
            .await
            .unwrap();
        let listed: Vec<&str> = history.iter().map(|t| t.checkpoint.id.as_str()).collect();
        let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
        assert_eq!(listed, newest_first);
        assert_eq!(
            history[9].checkpoint.channel_values["messages"],
            serde_json::json!(["m1"])
        );

        let thread_id = uuid::Uuid::parse_str(thread).unwrap();
        let events = crate::RunStore::read_events(&storage, thread_id, 0, None, 100)
            .await
            .unwrap();
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=30).collect::<Vec<_>>());
        assert_eq!(events[29].data, serde_json::json!({"n": 30}));
        let cutoff = "2026-03-01T00:00:00Z".parse().unwrap();
        let pruned = crate::RunStore::prune_events(&storage, cutoff, 100)
            .await
            .unwrap();
        assert_eq!(pruned, 10);
        let left = crate::RunStore::read_events(&storage, thread_id, 0, None, 100)
            .await
            .unwrap();
        assert_eq!(left.first().map(|e| e.seq), Some(11));
        assert_eq!(left.len(), 20);
    }
}
