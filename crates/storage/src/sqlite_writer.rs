//! The SQLite writer: one thread owns the database's only write connection and runs every
//! write there, as a closure, committing the writes that queued up meanwhile together.
//!
//! Why a thread of our own: SQLite takes one writer at a time, and through an async driver
//! every statement of a transaction is a round trip between the caller's task and the
//! connection's thread, with the write lock held in between. Under load those hand-offs (futex
//! wakes and context switches) were most of the server's CPU time and the single connection
//! sat idle between statements. Here a whole write runs in one go on the thread that owns the
//! connection, with its statements prepared once and cached, and the caller waits once.
//!
//! Writes not yet written as closures still use an async connection of their own; they first
//! take the [`WritePermit`], which parks the writer thread between transactions, so there is
//! still one writer at a time and nobody waits on SQLite's lock.
//!
//! Group commit: the thread runs every write queued while it was busy, and those that come
//! while the group runs, in one transaction (up to [`MAX_GROUP`]), each after the first inside
//! its own savepoint. A write that fails is rolled back alone and its caller gets its error;
//! the others' callers get their results only after the shared `COMMIT` succeeded, so an
//! answer is never given for a change that was not committed. Taking in the late comers
//! (rather than only what was queued when the group began) spares each of them a wait for
//! this commit before its own, and shares one commit among more writes.
//!
//! Writes a request waits on before it can answer at all (a new run, whose stream's first
//! event follows its commit; a new thread) go ahead of the queue ([`Writer::write_ahead`]):
//! the thread takes them before the queued writes of runs in progress (checkpoints, events,
//! ends), and a group holding one commits once no other write waits ahead, instead of taking
//! late comers for as long as they come. Under load the queue holds a few dozen writes of
//! runs in progress; behind them, a new run's first event waited for all of them and for
//! the commit of a group that kept growing.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use crate::sqlite_notices::{self, Notices};
use crate::{sqlite_wal_io, StorageError, StorageResult};

/// Most writes one transaction carries, so a long queue still commits (and answers) often.
const MAX_GROUP: usize = 64;

/// Prepared statements the write connection keeps (every write path's statements fit).
const STATEMENT_CACHE: usize = 256;

/// Commits after which the writer asks for a WAL checkpoint.
const CHECKPOINT_EVERY: u32 = 200;
/// How often the WAL is checkpointed when few commits come.
const CHECKPOINT_IDLE: Duration = Duration::from_secs(1);
/// WAL frames (pages) past which the checkpoint thread rewinds the WAL: 256 MiB of 4 KiB
/// pages. A rewind holds writes back for some 5 ms; at full load it comes every 2 s or so.
const REWIND_FRAMES: i64 = 65_536;
/// Before a rewind, passive passes until fewer than this many frames were committed since
/// the pass before...
const CATCH_UP_FRAMES: i64 = 256;
/// ...or this many passes were made.
const CATCH_UP_PASSES: usize = 4;

/// A queued write: runs on the writer thread, answers its caller once the outcome is known.
trait Job: Send {
    /// Runs the write inside the open transaction. With `savepoint`, a failed write is rolled
    /// back to its savepoint before this returns; without, the caller rolls back the whole
    /// transaction when this answers false.
    fn run(&mut self, conn: &Connection, savepoint: bool) -> bool;
    /// Sends the caller its result, or the commit's failure if the write itself succeeded.
    fn answer(self: Box<Self>, commit: Result<(), &str>);
}

struct Call<T, E, F> {
    write: Option<F>,
    result: Option<Result<T, E>>,
    reply: oneshot::Sender<Result<T, E>>,
    /// Counts the write among the queued until it is answered (or dropped unanswered).
    _queued: Queued,
}

/// One write in [`Writer::queued`]'s count, from its submission until it is dropped.
struct Queued(Arc<AtomicUsize>);

impl Queued {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T, E, F> Job for Call<T, E, F>
where
    T: Send + 'static,
    E: From<StorageError> + Send + 'static,
    F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
{
    fn run(&mut self, conn: &Connection, savepoint: bool) -> bool {
        let Some(write) = self.write.take() else {
            return false;
        };
        let noted = sqlite_notices::noted();
        let result = if savepoint {
            in_savepoint(conn, write)
        } else {
            guarded(conn, write)
        };
        let ok = result.is_ok();
        if !ok {
            // Rolled back: what it changed, nobody is to be woken for.
            sqlite_notices::forget_since(noted);
        }
        self.result = Some(result);
        ok
    }

    fn answer(self: Box<Self>, commit: Result<(), &str>) {
        let Call {
            result,
            reply,
            _queued: queued,
            ..
        } = *self;
        // Out of the count before its caller can look.
        drop(queued);
        let failed = |msg: &str| Err(StorageError::Commit(msg.to_owned()).into());
        let result = match (result, commit) {
            (Some(Ok(_)), Err(msg)) | (None, Err(msg)) => failed(msg),
            (Some(result), _) => result,
            (None, Ok(())) => failed("the write did not run"),
        };
        // The caller may have stopped waiting (its request was dropped); the write stands.
        let _ = reply.send(result);
    }
}

/// Runs `write` between `SAVEPOINT` and `RELEASE`, rolling it back when it fails or panics.
fn in_savepoint<T, E: From<StorageError>>(
    conn: &Connection,
    write: impl FnOnce(&Connection) -> Result<T, E>,
) -> Result<T, E> {
    let sql = |sql: &str| control(conn, sql).map_err(|e| E::from(e.into()));
    sql("SAVEPOINT write")?;
    let result = guarded(conn, write);
    if result.is_err() {
        sql("ROLLBACK TO write")?;
    }
    sql("RELEASE write")?;
    result
}

/// Runs a transaction control statement, prepared once: every write of a group runs two.
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Runs `write`, turning a panic into an error: one bad write must not stop the writer.
fn guarded<T, E: From<StorageError>>(
    conn: &Connection,
    write: impl FnOnce(&Connection) -> Result<T, E>,
) -> Result<T, E> {
    catch_unwind(AssertUnwindSafe(|| write(conn))).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(panic = %what, "a database write panicked; it was rolled back");
        Err(StorageError::Commit(format!("the write panicked: {what}")).into())
    })
}

/// What the writer thread is asked to do.
enum Request {
    Write(Box<dyn Job>),
    /// A write was put in the lane ahead of the queue; wakes the thread if it is waiting.
    Ahead,
    /// Hand the database to an async connection until the permit is dropped.
    Yield {
        granted: oneshot::Sender<()>,
        released: mpsc::Receiver<()>,
    },
}

/// Exclusive use of the database for a write on another connection; the writer thread
/// resumes when it is dropped.
pub(crate) struct WritePermit {
    _release: mpsc::Sender<()>,
}

/// Writes that go ahead of the queue, in the order they came.
type AheadLane = Arc<Mutex<VecDeque<Box<dyn Job>>>>;

fn take_ahead(lane: &AheadLane) -> Option<Box<dyn Job>> {
    // A panic while the lock was held left the queue whole (pushes and pops only).
    lane.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop_front()
}

/// The handle writes are sent through; the thread stops when the last handle is dropped.
pub(crate) struct Writer {
    jobs: mpsc::Sender<Request>,
    ahead: AheadLane,
    /// Writes submitted and not answered yet.
    queued: Arc<AtomicUsize>,
}

impl Writer {
    /// Opens the write connection to the database file at `path` (which must exist, with its
    /// schema) and starts the writer thread.
    /// A committed group's wake-ups go to `notices`.
    pub(crate) fn open(path: &Path, notices: Arc<Notices>) -> StorageResult<Self> {
        let conn = open_write_connection(path)?;
        // After `open_write_connection`'s `wal_autocheckpoint`, which would replace its hook.
        let wal_io = sqlite_wal_io::install(&conn, path)?;
        let conn = WriteConnection {
            conn,
            _wal_io: wal_io,
        };
        let checkpoints = start_checkpointer(path)?;
        let (jobs, queue) = mpsc::channel::<Request>();
        let ahead = AheadLane::default();
        let queues = Queues {
            queue,
            ahead: ahead.clone(),
        };
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || serve(conn, queues, checkpoints, &notices))
            .map_err(|e| StorageError::Commit(format!("cannot start the writer thread: {e}")))?;
        Ok(Self {
            jobs,
            ahead,
            queued: Arc::default(),
        })
    }

    /// Writes submitted and not answered yet: queued, or in the transaction being committed.
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Runs `write` on the write connection, in a transaction, and returns its result once the
    /// transaction is committed. `write` must only do database work: other writes wait for it.
    pub(crate) async fn write<T, E, F>(&self, write: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        self.submit(write).await
    }

    /// As [`Writer::submit`], for a write a request waits on before it can answer at all: it
    /// runs before the writes queued with [`Writer::write`] and [`Writer::submit`] (and so
    /// may commit before writes submitted earlier: none of them may be one it depends on),
    /// after those gone ahead before it.
    pub(crate) fn write_ahead<T, E, F>(
        &self,
        write: F,
    ) -> impl std::future::Future<Output = Result<T, E>> + Send + Sync + 'static
    where
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let (job, answer) = call(write, &self.queued);
        self.ahead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(job);
        let woken = self.jobs.send(Request::Ahead).is_ok();
        answer_of(woken, answer)
    }

    /// Queues `write` before returning (writes submitted one after another run in that
    /// order) and gives the future of its result, as [`Writer::write`]'s, which need not be
    /// awaited for the write to happen.
    pub(crate) fn submit<T, E, F>(
        &self,
        write: F,
    ) -> impl std::future::Future<Output = Result<T, E>> + Send + Sync + 'static
    where
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let (job, answer) = call(write, &self.queued);
        let queued = self.jobs.send(Request::Write(job)).is_ok();
        answer_of(queued, answer)
    }

    /// Waits until the writer thread has committed what it was doing and parks it; writes on
    /// another connection may run until the permit is dropped.
    pub(crate) async fn permit(&self) -> StorageResult<WritePermit> {
        let (granted, grant) = oneshot::channel();
        let (release, released) = mpsc::channel();
        self.jobs
            .send(Request::Yield { granted, released })
            .map_err(|_| stopped())?;
        grant.await.map_err(|_| stopped())?;
        Ok(WritePermit { _release: release })
    }
}

/// `write` as a job for the writer thread, and the receiver of its result.
fn call<T, E, F>(
    write: F,
    queued: &Arc<AtomicUsize>,
) -> (Box<dyn Job>, oneshot::Receiver<Result<T, E>>)
where
    T: Send + 'static,
    E: From<StorageError> + Send + 'static,
    F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let job = Box::new(Call {
        write: Some(write),
        result: None,
        reply,
        _queued: Queued::new(queued),
    });
    (job, answer)
}

/// The result of a job, once the writer thread answers; `queued` says whether it reached
/// the thread's queue at all.
async fn answer_of<T, E: From<StorageError>>(
    queued: bool,
    answer: oneshot::Receiver<Result<T, E>>,
) -> Result<T, E> {
    if !queued {
        return Err(E::from(stopped()));
    }
    answer.await.map_err(|_| E::from(stopped()))?
}

/// The write connection and its WAL I/O. Fields drop in order: the connection, whose WAL hook
/// points into `_wal_io`, closes first.
struct WriteConnection {
    conn: Connection,
    _wal_io: Option<sqlite_wal_io::WalIo>,
}

fn stopped() -> StorageError {
    StorageError::Commit("the writer thread has stopped".to_owned())
}

fn open_write_connection(path: &Path) -> StorageResult<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    // As the read pool's connections: WAL, and NORMAL, which in WAL mode loses nothing when
    // the process crashes (only a power loss can drop the last commits).
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.busy_handler(Some(retry_soon))?;
    // Checkpoints (copying the WAL into the database file, with an fsync) run on their own
    // thread, not inside a commit that every queued write waits for.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    // A group commit gives each write a savepoint, whose journal of original pages would spill
    // to a temporary file past 64 KiB: a file created, written and deleted per group.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Retries a locked database every 100 µs, for up to 10 s. Not SQLite's default back-off (1,
/// 2, 5, 10, 15, 20, 25 ms, ...): the waits here are short (a rewind of the WAL waiting for
/// point reads; the writer waiting for a rewind), and each would otherwise cost tens of ms.
fn retry_soon(attempt: i32) -> bool {
    std::thread::sleep(Duration::from_micros(100));
    attempt < 100_000
}

/// Starts the thread that checkpoints the WAL: when the writer says enough was committed,
/// and every [`CHECKPOINT_IDLE`]. It stops when the writer thread does.
fn start_checkpointer(path: &Path) -> StorageResult<mpsc::SyncSender<()>> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_handler(Some(retry_soon))?;
    let (due, wake) = mpsc::sync_channel::<()>(1);
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || loop {
            match wake.recv_timeout(CHECKPOINT_IDLE) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = checkpoint(&conn, REWIND_FRAMES) {
                        tracing::warn!(error = %e, "cannot checkpoint the SQLite WAL");
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        })
        .map_err(|e| StorageError::Commit(format!("cannot start the checkpoint thread: {e}")))?;
    Ok(due)
}

/// Copies the WAL into the database without blocking writers (PASSIVE), and rewinds it once it
/// is long.
///
/// Why rewind: SQLite starts the WAL over only when a write begins after every frame was
/// copied and no reader still reads from it. Under steady load that moment never comes (new
/// commits land while the copy runs), and the WAL grows without bound, hundreds of MB a minute,
/// each append allocating new blocks. RESTART holds writers back while it copies the rest
/// (little, right after a passive pass) and waits for readers still in the WAL (point reads,
/// a millisecond); the commits after it overwrite the WAL's start.
///
/// A passive pass that does not reach the WAL's end (under load, none does) leaves the pages
/// it copied unsynced: SQLite syncs the database file only when a pass copies everything,
/// which here is the RESTART, with writers held back. That sync, of everything copied since
/// the last rewind, was most of the 25–35 ms writers waited; it is done first, before the
/// RESTART takes the write lock, so the RESTART copies and syncs only its own remainder.
fn checkpoint(conn: &Connection, rewind_frames: i64) -> rusqlite::Result<()> {
    let mut log = passive_checkpoint(conn)?;
    if log > rewind_frames {
        sync_database_file(conn)?;
        // Each pass copies what was committed since the one before, so each is shorter: the
        // RESTART, which holds writers back while it copies, gets only a short tail.
        for _ in 0..CATCH_UP_PASSES {
            let before = std::mem::replace(&mut log, passive_checkpoint(conn)?);
            if log - before < CATCH_UP_FRAMES {
                break;
            }
        }
        sync_database_file(conn)?;
        conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))?;
    }
    Ok(())
}

/// Copies what it can of the WAL into the database without blocking writers; returns the WAL's
/// length in frames.
fn passive_checkpoint(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
}

/// Syncs the database file (not the WAL) through the connection's own file handle, as SQLite
/// would: a file descriptor of our own could not be closed without dropping the process's
/// POSIX locks on the file, which SQLite's connections hold.
fn sync_database_file(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::ffi;
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: the handle is this connection's, used on this thread only; FILE_POINTER writes
    // the main database's `sqlite3_file` (owned by the connection, valid while it is open and
    // no transaction is changing it: none is open here) into `file`, whose `xSync` is the
    // VFS's own sync, callable outside a transaction.
    let rc = unsafe {
        let rc = ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&mut file as *mut *mut ffi::sqlite3_file).cast(),
        );
        match (rc, file.as_ref().and_then(|f| f.pMethods.as_ref())) {
            (ffi::SQLITE_OK, Some(methods)) => match methods.xSync {
                Some(x_sync) => x_sync(file, ffi::SQLITE_SYNC_NORMAL),
                None => ffi::SQLITE_OK,
            },
            (ffi::SQLITE_OK, None) => ffi::SQLITE_OK,
            (rc, _) => rc,
        }
    };
    match rc {
        ffi::SQLITE_OK => Ok(()),
        rc => Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None)),
    }
}

/// The writer thread: waits for a write, runs it and every write queued meanwhile in one
/// transaction, and answers each caller after the commit.
///
/// It takes the whole `WriteConnection`: a closure naming only `write.conn` would capture that
/// field alone and leave the WAL I/O, which the connection's hook points into, to be dropped
/// by the thread that started this one.
fn serve(
    write: WriteConnection,
    queues: Queues,
    checkpoints: mpsc::SyncSender<()>,
    notices: &Notices,
) {
    let conn = &write.conn;
    let mut commits = 0_u32;
    let mut next = queues.queue.recv().ok();
    while let Some(request) = next.take() {
        let first = match request {
            Request::Write(job) => (job, false),
            // Its write may have been taken by a group already.
            Request::Ahead => match take_ahead(&queues.ahead) {
                Some(job) => (job, true),
                None => {
                    next = queues.queue.recv().ok();
                    continue;
                }
            },
            Request::Yield { granted, released } => {
                // Nothing is open on this connection now; block until the permit is dropped
                // (or its holder gave up waiting).
                if granted.send(()).is_ok() {
                    let _ = released.recv();
                }
                next = queues.queue.recv().ok();
                continue;
            }
        };
        let (group, commit) = run_group(conn, first, &queues, &mut next);
        let noted = sqlite_notices::take_noted();
        if commit.is_ok() {
            notices.send(noted);
        }
        let commit = commit.as_ref().map(|_| ()).map_err(|e| e.as_str());
        for job in group {
            job.answer(commit);
        }
        commits += 1;
        if commits >= CHECKPOINT_EVERY {
            commits = 0;
            // Full means a checkpoint is already asked for.
            let _ = checkpoints.try_send(());
        }
        if next.is_none() {
            next = queues.queue.recv().ok();
        }
    }
}

/// What the writer thread takes writes from: the queue (with its wake-ups and permit
/// requests) and the lane ahead of it.
struct Queues {
    queue: mpsc::Receiver<Request>,
    ahead: AheadLane,
}

/// Runs `first` and the writes queued behind it, including those that come while the group
/// runs (up to [`MAX_GROUP`]), in one transaction; returns them with the commit's outcome
/// (`Err` says why it did not commit). A write that arrives mid-group joins it instead of
/// waiting for this commit and then its own. Writes gone ahead join first, and once one is
/// in, the group takes no other write and commits when none waits ahead. A permit request
/// ends the group and is left in `next`, to be served after the commit.
fn run_group(
    conn: &Connection,
    (mut first, first_went_ahead): (Box<dyn Job>, bool),
    queues: &Queues,
    next: &mut Option<Request>,
) -> (Vec<Box<dyn Job>>, Result<(), String>) {
    if let Err(e) = control(conn, "BEGIN IMMEDIATE") {
        return (vec![first], Err(format!("cannot begin a write: {e}")));
    }
    // The first write has no neighbour to protect: a savepoint would only cost page copies.
    // If it fails, the transaction holds nothing else, so it is rolled back whole and its
    // caller gets its own error.
    if !first.run(conn, false) {
        let _ = control(conn, "ROLLBACK");
        return (vec![first], Ok(()));
    }
    let mut group = vec![first];
    let mut went_ahead = first_went_ahead;
    while group.len() < MAX_GROUP {
        if let Some(mut job) = take_ahead(&queues.ahead) {
            went_ahead = true;
            job.run(conn, true);
            group.push(job);
            continue;
        }
        if went_ahead {
            break;
        }
        match queues.queue.try_recv() {
            Ok(Request::Write(mut job)) => {
                job.run(conn, true);
                group.push(job);
            }
            // Its write was taken above.
            Ok(Request::Ahead) => {}
            Ok(yielding) => {
                *next = Some(yielding);
                break;
            }
            Err(_) => break,
        }
    }
    if let Err(e) = control(conn, "COMMIT") {
        let _ = control(conn, "ROLLBACK");
        tracing::error!(error = %e, writes = group.len(), "a database commit failed");
        return (group, Err(format!("the commit failed: {e}")));
    }
    (group, Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database file `db` with one table `t`, in a directory removed when dropped.
    fn database() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
            .unwrap();
        (dir, path)
    }

    async fn writer() -> (tempfile::TempDir, Writer) {
        let (dir, path) = database();
        let writer = Writer::open(&path, Arc::default()).unwrap();
        (dir, writer)
    }

    /// An insert, as a write whose errors are storage errors.
    fn insert(sql: &'static str) -> impl FnOnce(&Connection) -> StorageResult<usize> {
        move |conn| Ok(conn.execute(sql, [])?)
    }

    fn count(dir: &tempfile::TempDir) -> i64 {
        Connection::open(dir.path().join("db"))
            .unwrap()
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// The bundled SQLite is built as `.cargo/config.toml` says: no page cache shared by every
    /// connection behind one lock, no global lock on each allocation. Built otherwise (by a
    /// `LIBSQLITE3_FLAGS` of the environment, say), the writer waits on the readers' locks.
    #[test]
    fn sqlite_build_has_no_process_wide_locks() {
        let conn = Connection::open_in_memory().unwrap();
        let mut options = conn.prepare("PRAGMA compile_options").unwrap();
        let options: Vec<String> = options
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_in_a_group_is_rolled_back_alone() {
        let (dir, writer) = writer().await;
        let writer = std::sync::Arc::new(writer);
        let mut tasks = Vec::new();
        for k in 0..200_i64 {
            let writer = writer.clone();
            tasks.push(tokio::spawn(async move {
                writer
                    .write(move |conn| {
                        conn.execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
                        if k % 10 == 0 {
                            // Changes made before the failure must go too.
                            return Err(StorageError::Invalid(format!("refused {k}")));
                        }
                        Ok(k)
                    })
                    .await
            }));
        }
        let mut refused = 0;
        for task in tasks {
            if task.await.unwrap().is_err() {
                refused += 1;
            }
        }
        assert_eq!(refused, 20);
        assert_eq!(count(&dir), 180);
    }

    #[tokio::test]
    async fn a_panicking_write_is_an_error_and_the_writer_goes_on() {
        let (dir, writer) = writer().await;
        let panicked = writer
            .write(|conn| -> StorageResult<()> {
                conn.execute("INSERT INTO t (k, v) VALUES (1, 'x')", [])?;
                panic!("boom")
            })
            .await;
        assert!(matches!(panicked, Err(StorageError::Commit(m)) if m.contains("boom")));
        writer
            .write(insert("INSERT INTO t (k, v) VALUES (2, 'y')"))
            .await
            .unwrap();
        assert_eq!(count(&dir), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_permit_keeps_the_writer_out_until_it_is_dropped() {
        let (dir, writer) = writer().await;
        let permit = writer.permit().await.unwrap();
        let other = Connection::open(dir.path().join("db")).unwrap();
        other.busy_timeout(Duration::ZERO).unwrap();
        // The writer holds no lock while parked: another connection writes at once.
        other
            .execute("INSERT INTO t (k, v) VALUES (1, 'other')", [])
            .unwrap();
        let writer = std::sync::Arc::new(writer);
        let queued = tokio::spawn({
            let writer = writer.clone();
            async move {
                writer
                    .write(insert("INSERT INTO t (k, v) VALUES (2, 'w')"))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!queued.is_finished(), "the writer must wait for the permit");
        assert_eq!(count(&dir), 1);
        drop(permit);
        queued.await.unwrap().unwrap();
        assert_eq!(count(&dir), 2);
    }

    /// `queued` counts the writes submitted and not answered: waiting behind a write in
    /// progress, or in its group, until the group's commit answers them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_counts_writes_until_they_are_answered() {
        let (_dir, writer) = writer().await;
        assert_eq!(writer.queued(), 0);
        let (first, release) = held_first_write(&writer);
        let second = writer.submit(insert("INSERT INTO t (k, v) VALUES (2, 'x')"));
        let third = writer.write_ahead(insert("INSERT INTO t (k, v) VALUES (3, 'x')"));
        assert_eq!(writer.queued(), 3);
        release.send(()).unwrap();
        first.await.unwrap();
        second.await.unwrap();
        third.await.unwrap();
        assert_eq!(writer.queued(), 0);
    }

    /// The rows of `t` another connection sees: those committed.
    fn committed_rows(path: &Path) -> StorageResult<i64> {
        let other = Connection::open(path)?;
        Ok(other.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))?)
    }

    /// A first write (`k` = 1) that holds the writer thread, in its group, until the sender
    /// returned is used; returned once it runs, with the future of its result.
    fn held_first_write(
        writer: &Writer,
    ) -> (
        impl std::future::Future<Output = StorageResult<()>>,
        mpsc::Sender<()>,
    ) {
        let (started, first_started) = mpsc::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let first = writer.submit(move |conn| -> StorageResult<()> {
            conn.execute("INSERT INTO t (k, v) VALUES (1, 'first')", [])?;
            let _ = started.send(());
            let _ = released.recv_timeout(Duration::from_secs(10));
            Ok(())
        });
        first_started
            .recv_timeout(Duration::from_secs(10))
            .expect("the first write runs");
        (first, release)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_queued_while_a_group_runs_commits_with_it() {
        let (dir, writer) = writer().await;
        let path = dir.path().join("db");
        let (first, release) = held_first_write(&writer);
        // Queued while the first write's group is running.
        let second = writer.submit(move |conn| -> StorageResult<i64> {
            conn.execute("INSERT INTO t (k, v) VALUES (2, 'second')", [])?;
            // The first write is not committed when both are in one transaction.
            committed_rows(&path)
        });
        release.send(()).unwrap();
        first.await.unwrap();
        assert_eq!(
            second.await.unwrap(),
            0,
            "the second write ran after a commit"
        );
        assert_eq!(count(&dir), 2);
    }

    /// A new run's write must not wait behind the queued writes of runs in progress, nor for
    /// a group that takes them in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_gone_ahead_runs_and_commits_before_the_queue() {
        let (dir, writer) = writer().await;
        let path = dir.path().join("db");
        // Holds the thread until both writes below are waiting.
        let (first, release) = held_first_write(&writer);
        let queued = writer.submit(move |conn| -> StorageResult<i64> {
            conn.execute("INSERT INTO t (k, v) VALUES (2, 'queued')", [])?;
            committed_rows(&path)
        });
        let ahead = writer.write_ahead(move |conn| -> StorageResult<bool> {
            conn.execute("INSERT INTO t (k, v) VALUES (3, 'ahead')", [])?;
            let queued_ran: i64 =
                conn.query_row("SELECT COUNT(*) FROM t WHERE k = 2", [], |r| r.get(0))?;
            Ok(queued_ran > 0)
        });
        release.send(()).unwrap();
        first.await.unwrap();
        assert!(!ahead.await.unwrap(), "the write queued first ran first");
        assert_eq!(
            queued.await.unwrap(),
            2,
            "the write gone ahead and the first were committed before the queued one ran"
        );
        assert_eq!(count(&dir), 3);
    }

    #[tokio::test]
    async fn a_database_error_reaches_the_caller() {
        let (_dir, writer) = writer().await;
        writer
            .write(insert("INSERT INTO t (k, v) VALUES (1, 'x')"))
            .await
            .unwrap();
        let taken = writer
            .write(insert("INSERT INTO t (k, v) VALUES (1, 'x')"))
            .await;
        assert!(matches!(taken, Err(StorageError::Sqlite(_))), "{taken:?}");
    }

    /// A long WAL is copied, the database file synced and the WAL rewound: the next commit
    /// is written at its start, and nothing committed is lost.
    #[test]
    fn a_long_wal_is_rewound_and_keeps_every_commit() {
        let (_dir, path) = database();
        let writes = open_write_connection(&path).unwrap();
        for k in 0..300 {
            writes
                .execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])
                .unwrap();
        }
        let checkpoints = Connection::open(&path).unwrap();
        assert!(passive_checkpoint(&checkpoints).unwrap() >= 300);
        checkpoint(&checkpoints, 100).unwrap();
        writes
            .execute("INSERT INTO t (k, v) VALUES (300, 'x')", [])
            .unwrap();
        let log = passive_checkpoint(&checkpoints).unwrap();
        assert!(log < 10, "the WAL was not rewound: {log} frames");
        let reader = Connection::open(&path).unwrap();
        let rows: i64 = reader
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 301);
    }
}
