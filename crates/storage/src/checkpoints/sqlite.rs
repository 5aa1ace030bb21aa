//! Checkpoints in SQLite: writes run on the storage's writer thread (`sqlite_writer`), reads
//! through its read-only pool, each read in one transaction so its queries see one snapshot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::Utc;
use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
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
    run_gone, saved_by, stored_checkpoint, wanted_blobs, BlobRow, Blobs, CheckpointRow,
    EncodedBlob, Put, WriteRow, CHECKPOINT_COLUMNS,
};
use crate::json_filter::push_sqlite_contains;
use crate::runs::sqlite::{insert_events, EventRows};
use crate::sqlite_reader::Readers;
use crate::sqlite_values::ts;
use crate::sqlite_writer::Writer;
use crate::LoggedSave;

/// The engine's [`Checkpointer`] over the SQLite backend: reads through its pool, writes
/// through its writer thread.
pub struct SqliteCheckpointer {
    read: SqlitePool,
    readers: Arc<Readers>,
    writer: Arc<Writer>,
    open: Arc<OpenBatches>,
}

impl SqliteCheckpointer {
    pub(crate) fn new(read: SqlitePool, readers: Arc<Readers>, writer: Arc<Writer>) -> Self {
        Self {
            read,
            readers,
            writer,
            open: Arc::default(),
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
    /// The run whose save this is (as `runs.run_id` stores it), if the metadata names one.
    saved_by: Option<String>,
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
            saved_by: saved_by(put.metadata).map(|run| run.hyphenated().to_string()),
        })
    }
}

/// Whether checkpoint `checkpoint_id` of `thread_id` in `checkpoint_ns` is stored, as seen by
/// the write connection's transaction.
pub(crate) fn checkpoint_stored(
    conn: &Connection,
    thread_id: &str,
    checkpoint_ns: &str,
    checkpoint_id: &str,
) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT 1 FROM checkpoints WHERE thread_id = ?1 AND checkpoint_ns = ?2 \
         AND checkpoint_id = ?3",
    )?
    .exists((thread_id, checkpoint_ns, checkpoint_id))
}

/// Refuses a queued checkpoint whose parent is not stored. Saves are queued while the run goes
/// on, so the one before may have failed after this one was queued: storing this one would
/// leave a checkpoint whose history, and the blobs its deltas build on, are missing.
fn require_parent(conn: &Connection, put: &EncodedCheckpoint) -> Result<(), CheckpointError> {
    let Some(parent) = &put.parent_id else {
        return Ok(());
    };
    let stored =
        checkpoint_stored(conn, &put.thread_id, &put.checkpoint_ns, parent).map_err(backend)?;
    if !stored {
        return Err(CheckpointError::Missing(format!(
            "checkpoint {parent} of {}, the parent of {}",
            put.thread_id, put.checkpoint_id
        )));
    }
    Ok(())
}

/// Refuses a run's checkpoint once its run is gone. A rolled-back run is deleted with its
/// checkpoints in one write (its end, or the claim that ends it after its worker was lost);
/// a worker that still executes it after that (one that lost its lease, not its process)
/// must not put checkpoints back on the thread, where the next run would continue from
/// them. Every write goes through the one writer thread, so this check and that deletion
/// never interleave: a save is either before the deletion (and deleted by it) or refused.
fn require_live_run(conn: &Connection, put: &EncodedCheckpoint) -> Result<(), CheckpointError> {
    let Some(run_id) = &put.saved_by else {
        return Ok(());
    };
    let live = conn
        .prepare_cached("SELECT 1 FROM runs WHERE run_id = ?1")
        .and_then(|mut s| s.exists([run_id]))
        .map_err(backend)?;
    if !live {
        return Err(run_gone(run_id, &put.checkpoint_id));
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

/// Pending writes of a checkpoint, planned and encoded on the caller's thread: what the
/// writer thread deletes and inserts, nothing left to work out there.
struct EncodedWrites {
    thread_id: String,
    checkpoint_ns: String,
    checkpoint_id: String,
    /// `(task_id, channel)` of the special writes these replace.
    replace: Vec<(String, String)>,
    /// `(task_id, channel, value)` of the rows to insert, in order.
    insert: Vec<(String, String, Vec<u8>)>,
}

impl EncodedWrites {
    fn new(
        thread_id: String,
        checkpoint_ns: String,
        checkpoint_id: String,
        writes: &[PendingWrite],
    ) -> Result<Self, CheckpointError> {
        let plan = plan_writes(writes);
        let insert = plan
            .insert
            .iter()
            .map(|w| Ok((w.task_id.clone(), w.channel.clone(), encode_write(w)?)))
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        let replace = plan
            .replace
            .iter()
            .map(|&(task, channel)| (task.to_owned(), channel.to_owned()))
            .collect();
        Ok(Self {
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            replace,
            insert,
        })
    }
}

/// Saves pending writes of a checkpoint, numbered after its last one. The checkpoint need
/// not be stored yet: as with LangGraph's own savers, a Python graph's loop saves a step's
/// writes while the checkpoint they were made on is still being saved.
fn insert_writes(conn: &Connection, writes: &EncodedWrites) -> Result<(), CheckpointError> {
    let (thread_id, checkpoint_id) = (&writes.thread_id, &writes.checkpoint_id);
    let key = (thread_id, &writes.checkpoint_ns, checkpoint_id);
    let mut replace = conn
        .prepare_cached(
            "DELETE FROM checkpoint_writes WHERE thread_id = ?1 AND checkpoint_ns = ?2 \
             AND checkpoint_id = ?3 AND task_id = ?4 AND channel = ?5",
        )
        .map_err(backend)?;
    for (task, channel) in &writes.replace {
        replace
            .execute((key.0, key.1, key.2, task, channel))
            .map_err(backend)?;
    }
    if writes.insert.is_empty() {
        return Ok(());
    }
    // The writer thread runs one write at a time, so the numbering cannot race.
    let next: i64 = conn
        .prepare_cached(
            "SELECT COALESCE(MAX(idx), -1) + 1 FROM checkpoint_writes \
             WHERE thread_id = ?1 AND checkpoint_ns = ?2 AND checkpoint_id = ?3",
        )
        .map_err(backend)?
        .query_row(key, |r| r.get(0))
        .map_err(backend)?;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, idx, \
             task_id, channel, value) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(backend)?;
    for (offset, (task, channel, value)) in writes.insert.iter().enumerate() {
        insert
            .execute((
                key.0,
                key.1,
                key.2,
                next + offset as i64,
                task,
                channel,
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

/// Removes the checkpoints a run saved (every namespace: its metadata's `run_id`), their
/// pending writes, and the blobs no checkpoint left reaches (inside the caller's write).
pub(crate) fn delete_run_checkpoints(
    conn: &Connection,
    thread_id: &str,
    run_id: &str,
) -> rusqlite::Result<()> {
    const OF_RUN: &str = "SELECT checkpoint_ns, checkpoint_id FROM checkpoints \
         WHERE thread_id = ?1 AND json_extract(metadata, '$.run_id') = ?2";
    conn.prepare_cached(&format!(
        "DELETE FROM checkpoint_writes WHERE thread_id = ?1 \
         AND (checkpoint_ns, checkpoint_id) IN ({OF_RUN})"
    ))?
    .execute([thread_id, run_id])?;
    let deleted = conn
        .prepare_cached(
            "DELETE FROM checkpoints WHERE thread_id = ?1 \
             AND json_extract(metadata, '$.run_id') = ?2",
        )?
        .execute([thread_id, run_id])?;
    if deleted > 0 {
        delete_unreached_blobs(conn, thread_id)?;
    }
    Ok(())
}

/// Removes the thread's blobs that no checkpoint of it reaches, through its channel versions
/// and the delta chains they build on (`base`).
pub(crate) fn delete_unreached_blobs(conn: &Connection, thread_id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "WITH RECURSIVE reached(checkpoint_ns, channel, version) AS ( \
             SELECT c.checkpoint_ns, v.key, v.value FROM checkpoints c, \
                    json_each(c.checkpoint, '$.channel_versions') v WHERE c.thread_id = ?1 \
           UNION \
             SELECT b.checkpoint_ns, b.channel, b.base FROM reached r \
             JOIN checkpoint_blobs b ON b.thread_id = ?1 AND b.checkpoint_ns = r.checkpoint_ns \
              AND b.channel = r.channel AND b.version = r.version \
             WHERE b.base IS NOT NULL \
         ) \
         DELETE FROM checkpoint_blobs WHERE thread_id = ?1 \
         AND (checkpoint_ns, channel, version) NOT IN (SELECT * FROM reached)",
    )?
    .execute([thread_id])?;
    Ok(())
}

/// A save encoded on the caller's thread (the writer thread, which only inserts it, is the
/// bottleneck), ready to be applied there.
enum EncodedSave {
    Checkpoint(EncodedCheckpoint),
    Writes(EncodedWrites),
}

impl EncodedSave {
    fn new(write: QueuedWrite) -> Result<Self, CheckpointError> {
        match write {
            QueuedWrite::Checkpoint {
                thread_id,
                checkpoint_ns,
                checkpoint,
                metadata,
                parent_id,
                blobs,
            } => EncodedCheckpoint::new(&Put {
                thread_id: &thread_id,
                checkpoint_ns: &checkpoint_ns,
                checkpoint: &checkpoint,
                metadata: &metadata,
                parent_id: parent_id.as_deref(),
                blobs: &blobs,
            })
            .map(Self::Checkpoint),
            QueuedWrite::Writes {
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                writes,
            } => EncodedWrites::new(thread_id, checkpoint_ns, checkpoint_id, &writes)
                .map(Self::Writes),
        }
    }

    fn thread_id(&self) -> &str {
        match self {
            Self::Checkpoint(put) => &put.thread_id,
            Self::Writes(writes) => &writes.thread_id,
        }
    }

    /// Applies the save on the write connection.
    fn apply(&self, conn: &Connection) -> Result<(), CheckpointError> {
        match self {
            Self::Checkpoint(put) => {
                require_parent(conn, put)?;
                require_live_run(conn, put)?;
                insert_encoded(conn, put)
            }
            Self::Writes(writes) => insert_writes(conn, writes),
        }
    }
}

/// A save as queued: the run's events it carries ([`LoggedSave`]), inserted first, then the
/// save itself.
struct QueuedSave {
    events: Option<EventRows>,
    /// `None` for events queued alone ([`SqliteCheckpointer::submit_events`]).
    save: Option<EncodedSave>,
}

/// Applies a thread's batch of queued saves: the events they carry first, in one insert
/// (one move of the thread's event counter, not one per save), then the saves in order. The
/// batch is one write, so each save still commits with the events before it.
fn apply_batch(conn: &Connection, batch: Vec<QueuedSave>) -> Result<(), CheckpointError> {
    let (events, saves): (Vec<_>, Vec<_>) = batch.into_iter().map(|q| (q.events, q.save)).unzip();
    if let Some(events) = EventRows::concat(events.into_iter().flatten()) {
        insert_events(conn, &events)?;
    }
    saves.iter().flatten().try_for_each(|save| save.apply(conn))
}

/// Resolves when a batch of saves is committed (or failed), for every save in it.
type BatchDone = Shared<BoxFuture<'static, Result<(), CheckpointError>>>;

/// Saves of a thread queued on the writer thread whose write has not started yet.
struct OpenBatch {
    saves: Vec<QueuedSave>,
    done: BatchDone,
}

/// Per thread, the batch of saves still waiting for the writer thread. A run queues a save
/// per step and per task's writes, and each write on the writer thread costs a savepoint,
/// a hand-off and a wake on top of its inserts: a save queued while the thread's previous
/// ones still wait joins them, so a quick run's saves take one or two writes, not nine.
#[derive(Default)]
struct OpenBatches(Mutex<HashMap<String, OpenBatch>>);

impl OpenBatches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, OpenBatch>> {
        // The map is consistent between statements: a panic elsewhere cannot break it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SqliteCheckpointer {
    /// Queues a save on the writer thread. A thread's saves are applied in the order they
    /// come; a save joins its thread's batch when one is still waiting (so it is applied
    /// earlier than writes queued between the two, which never depend on it), and then
    /// shares that batch's outcome: if any save of a batch fails, none of it is stored.
    fn submit(&self, write: QueuedWrite) -> WriteReceipt {
        match EncodedSave::new(write) {
            Ok(save) => self.submit_encoded(None, save),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// Queues a save with the events it carries, as [`SqliteCheckpointer::submit`]: the events
    /// go in the save's own write, so they commit with it (a batch is all or nothing), and
    /// never after writes queued behind it.
    pub(crate) fn submit_logged(&self, logged: LoggedSave) -> WriteReceipt {
        let events = (!logged.events.is_empty()).then(|| EventRows::new(&logged.events));
        match EncodedSave::new(logged.write) {
            Ok(save) => self.submit_encoded(events, save),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// Queues events of a run's log (one thread's) in order with its saves: into the
    /// thread's batch when one is waiting, so a save queued after them never commits before
    /// them (a batch inserts its events first, in the order they were queued).
    pub(crate) fn submit_events(&self, events: &[crate::LoggedEvent]) -> WriteReceipt {
        let Some(first) = events.first() else {
            return Box::pin(std::future::ready(Ok(())));
        };
        let thread_id = first.thread_id.to_string();
        self.submit_encoded_for(
            thread_id,
            QueuedSave {
                events: Some(EventRows::new(events)),
                save: None,
            },
        )
    }

    fn submit_encoded(&self, events: Option<EventRows>, save: EncodedSave) -> WriteReceipt {
        let thread_id = save.thread_id().to_owned();
        let save = Some(save);
        self.submit_encoded_for(thread_id, QueuedSave { events, save })
    }

    fn submit_encoded_for(&self, thread_id: String, save: QueuedSave) -> WriteReceipt {
        let mut open = self.open.lock();
        if let Some(batch) = open.get_mut(&thread_id) {
            batch.saves.push(save);
            return Box::pin(batch.done.clone());
        }
        let batches = self.open.clone();
        let key = thread_id.clone();
        // Queued while the map is locked, so the write cannot take the batch before it is in.
        let done = self
            .writer
            .submit(move |conn| {
                let saves = batches.lock().remove(&key).map(|b| b.saves);
                apply_batch(conn, saves.unwrap_or_default())
            })
            .boxed()
            .shared();
        open.insert(
            thread_id,
            OpenBatch {
                saves: vec![save],
                done: done.clone(),
            },
        );
        Box::pin(done)
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

/// Copies every checkpoint, blob and pending write of thread `from` to thread `to`, in SQL
/// (inside the caller's write). Checkpoint ids stay as they are, as LangGraph's copy keeps
/// them; delta chains stay valid since blobs keep their versions and bases.
pub(crate) fn copy_checkpoints(conn: &Connection, from: &str, to: &str) -> rusqlite::Result<()> {
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

    /// A checkpointer over a fresh database, with the storage it writes through.
    async fn saver() -> (
        tempfile::TempDir,
        crate::sqlite::SqliteStorage,
        SqliteCheckpointer,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let storage = crate::sqlite::SqliteStorage::open(dir.path().join("db").to_str().unwrap())
            .await
            .unwrap();
        let saver = SqliteCheckpointer::new(
            storage.read.clone(),
            storage.readers.clone(),
            storage.writer.clone(),
        );
        (dir, storage, saver)
    }

    /// A checkpoint save of `thread` (channel `n` at `version`) below `parent`; its id.
    fn save(thread: &str, parent: Option<&str>, version: u64) -> (QueuedWrite, String) {
        let id = spindle_graph::checkpoint::new_checkpoint_id();
        let checkpoint = Checkpoint {
            v: 1,
            id: id.clone(),
            ts: Utc::now().to_rfc3339(),
            channel_values: Default::default(),
            channel_versions: [("n".to_owned(), version)].into(),
            versions_seen: Default::default(),
            updated_channels: Vec::new(),
            delta_depths: Default::default(),
        };
        let write = QueuedWrite::Checkpoint {
            thread_id: thread.to_owned(),
            checkpoint_ns: String::new(),
            checkpoint: Box::new(checkpoint),
            metadata: serde_json::json!({"step": version}),
            parent_id: parent.map(str::to_owned),
            blobs: vec![ChannelBlob {
                channel: "n".into(),
                version,
                value: spindle_graph::checkpoint::BlobValue::Full {
                    value: serde_json::json!(version),
                },
            }],
        };
        (write, id)
    }

    fn writes(thread: &str, checkpoint_id: &str) -> QueuedWrite {
        QueuedWrite::Writes {
            thread_id: thread.to_owned(),
            checkpoint_ns: String::new(),
            checkpoint_id: checkpoint_id.to_owned(),
            writes: vec![PendingWrite {
                task_id: "task".into(),
                channel: "n".into(),
                value: serde_json::json!(1),
            }],
        }
    }

    /// Saves queued while the writer is busy are written as one write, in the order they
    /// came, and each is told once they are committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn saves_queued_while_the_writer_is_busy_are_written_together() {
        let (_dir, storage, saver) = saver().await;
        let thread = "0190a9e4-0000-7000-8000-000000000001";
        let busy = storage.writer.permit().await.unwrap();
        let (first, first_id) = save(thread, None, 1);
        let (second, second_id) = save(thread, Some(&first_id), 2);
        let receipts = vec![
            saver.submit(first),
            saver.submit(writes(thread, &first_id)),
            saver.submit(second),
        ];
        assert_eq!(
            saver.open.lock().get(thread).map(|b| b.saves.len()),
            Some(3),
            "one batch holds all three"
        );
        drop(busy);
        for receipt in receipts {
            receipt.await.unwrap();
        }
        assert!(saver.open.lock().is_empty());
        let history = saver
            .list(thread, Some(""), &ListFilter::default())
            .await
            .unwrap();
        let ids: Vec<&str> = history.iter().map(|t| t.checkpoint.id.as_str()).collect();
        assert_eq!(ids, [second_id.as_str(), first_id.as_str()]);
        assert_eq!(history[0].parent_id.as_deref(), Some(first_id.as_str()));
        assert_eq!(history[1].pending_writes.len(), 1);
    }

    /// A batch is one write: when one of its saves fails, none is stored and every one of
    /// them hears of it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_with_a_failed_save_stores_none_of_it() {
        let (_dir, storage, saver) = saver().await;
        let thread = "0190a9e4-0000-7000-8000-000000000002";
        let busy = storage.writer.permit().await.unwrap();
        let (first, first_id) = save(thread, None, 1);
        let (orphan, _) = save(thread, Some("missing"), 2);
        let (third, _) = save(thread, Some(&first_id), 3);
        let receipts = vec![
            saver.submit(first),
            saver.submit(orphan),
            saver.submit(third),
        ];
        drop(busy);
        for receipt in receipts {
            let result = receipt.await;
            assert!(
                matches!(result, Err(CheckpointError::Missing(_))),
                "{result:?}"
            );
        }
        assert!(saver.get_tuple(thread, "", None).await.unwrap().is_none());
        // The next save of the thread starts a batch of its own.
        let (fresh, fresh_id) = save(thread, None, 1);
        saver.submit(fresh).await.unwrap();
        let latest = saver.get_tuple(thread, "", None).await.unwrap().unwrap();
        assert_eq!(latest.checkpoint.id, fresh_id);
    }

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
            let writes =
                EncodedWrites::new(thread.into(), String::new(), id.clone(), &writes).unwrap();
            insert_writes(&conn, &writes).unwrap();
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

        let thread_id = crate::ResourceId::parse(thread).unwrap();
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
