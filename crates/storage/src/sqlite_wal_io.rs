//! Keeps the WAL's disk work off the writer: the part it is about to write is allocated on disk
//! and read into the page cache ahead of it, and the part it left behind is written out to disk
//! a little at a time.
//!
//! Why read ahead: the WAL is rewound under load (see `sqlite_writer::checkpoint`), so the
//! writer overwrites frames it wrote a few seconds earlier. A frame (24 + 4,096 bytes) does not
//! start or end on a block boundary, so each write covers part of a block, which the kernel
//! must read first when the page cache no longer holds it, and the machines this runs on drop
//! clean file pages within seconds. Measured (create + stream, 16 clients): the writer waited
//! on such reads (`ext4_block_write_begin`) in up to 12 % of its samples, up to 6.5 MB per
//! 10 s, some for tens of milliseconds while the checkpoint's `fsync` kept the disk busy.
//! Before the first rewind the WAL grows instead, and appends waited for ext4 to reserve new
//! blocks (`ext4_da_get_block_prep`) while the write-out below allocated the blocks behind
//! them: the blocks ahead are allocated beforehand (`fallocate(FALLOC_FL_KEEP_SIZE)`, which
//! leaves the file's length, all SQLite reads, alone).
//!
//! Why write behind: with `synchronous=NORMAL` a commit only appends to the WAL, and the WAL is
//! synced before each checkpoint, which under load wrote ~40 MB in one go, every quarter second;
//! reads queued behind it. Asking the kernel to start writing each MiB once the writer has
//! moved past it (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not wait for the disk)
//! spreads that out, as PostgreSQL's `wal_writer_flush_after` and RocksDB's
//! `wal_bytes_per_sync` do. Neither changes what is durable when: the sync before a
//! checkpoint still happens.
//!
//! The writer's position comes from SQLite's WAL hook, called after every commit on the write
//! connection with the WAL's length in frames; the reads and writes run on a thread of their
//! own (`sqlite-wal-io`). Linux only; elsewhere nothing is installed.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rusqlite::Connection;

/// Bytes of a WAL file's header, before its first frame.
const WAL_HEADER: u64 = 32;
/// Bytes of a frame's header, before its page.
const FRAME_HEADER: u64 = 24;
/// How far past the writer the WAL is made ready (allocated, in the page cache). Refilled when
/// the writer is half way there: at full load it writes this much in some 50 ms, and the disk
/// reads it in a few.
const AHEAD: u64 = 8 << 20;
/// How far the writer moves on before what it left behind is handed over for writing out.
const BEHIND: u64 = 1 << 20;
/// Requests not yet served. When the thread is behind, requests are dropped, not queued: the
/// next preparation covers the writer's position then, and the next write-out starts where the
/// last one handed over ended, so nothing is skipped.
const QUEUE: usize = 4;

/// What the thread is asked to do with a range of the WAL (byte offsets).
#[derive(Debug, PartialEq)]
enum Request {
    /// Allocate its blocks and read it into the page cache: the writer is about to write it.
    Prepare(Range<u64>),
    /// Start writing its dirty pages to disk: the writer is done with it.
    WriteOut(Range<u64>),
}

/// Where the writer is in the WAL, and what was asked of the thread; see [`Tracker::committed`].
struct Tracker {
    frame_bytes: u64,
    /// A page of the page cache: the one the next frame starts in is never written out, so
    /// the writer never waits for it to reach the disk.
    page: u64,
    /// The end of the last commit.
    end: u64,
    /// The WAL is prepared up to here...
    prepared_to: u64,
    /// ...and handed over for writing out up to here.
    written_to: u64,
    requests: mpsc::SyncSender<Request>,
}

impl Tracker {
    /// After a commit that left `frames` frames in the WAL: asks for the next stretch ahead
    /// of the writer to be prepared and for what it left behind to be written out.
    fn committed(&mut self, frames: u64) {
        let end = WAL_HEADER + frames * self.frame_bytes;
        if end < self.end {
            // The WAL was rewound (a checkpoint reset it): the writer starts over at its head.
            self.prepared_to = 0;
            self.written_to = 0;
        }
        self.end = end;
        if end + AHEAD / 2 >= self.prepared_to {
            let ahead = self.prepared_to.max(end)..end + AHEAD;
            if self.requests.try_send(Request::Prepare(ahead)).is_ok() {
                self.prepared_to = end + AHEAD;
            }
        }
        let behind = end.saturating_sub(self.page) / self.page * self.page;
        if behind >= self.written_to + BEHIND {
            let done = self.written_to..behind;
            if self.requests.try_send(Request::WriteOut(done)).is_ok() {
                self.written_to = behind;
            }
        }
    }
}

/// The WAL I/O of one write connection. The connection's WAL hook points into it: it must
/// outlive the connection (drop the connection first).
pub(crate) struct WalIo {
    tracker: *mut Tracker,
}

// SAFETY: the tracker is only used by the WAL hook, on the thread that owns the connection,
// and freed by `drop`, after that connection is gone.
unsafe impl Send for WalIo {}

impl Drop for WalIo {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` in `install`; the hook that used it went with its
        // connection.
        drop(unsafe { Box::from_raw(self.tracker) });
    }
}

/// Starts the WAL I/O of `conn`, the write connection of the database at `path`. Call it after
/// the last `wal_autocheckpoint` setting: SQLite keeps one WAL hook per connection, and that
/// pragma replaces it. `None` where there is nothing to do (not Linux) or no thread to do it.
pub(crate) fn install(conn: &Connection, path: &Path) -> rusqlite::Result<Option<WalIo>> {
    if !cfg!(target_os = "linux") {
        return Ok(None);
    }
    let page_size: u64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
    let (requests, queue) = mpsc::sync_channel(QUEUE);
    let started = std::thread::Builder::new()
        .name("sqlite-wal-io".into())
        .spawn(move || serve(&wal, &queue));
    if let Err(e) = started {
        let what = "cannot start the WAL I/O thread; the writer will wait on the disk itself";
        tracing::warn!(error = %e, "{what}");
        return Ok(None);
    }
    let tracker = Box::into_raw(Box::new(Tracker {
        frame_bytes: FRAME_HEADER + page_size,
        page: page_size.max(4096),
        end: 0,
        prepared_to: 0,
        written_to: 0,
        requests,
    }));
    // SAFETY: `tracker` stays valid until the `WalIo` returned is dropped, which its owner
    // does after closing `conn`; SQLite calls the hook on the connection's thread only.
    unsafe {
        rusqlite::ffi::sqlite3_wal_hook(conn.handle(), Some(on_commit), tracker.cast());
    }
    Ok(Some(WalIo { tracker }))
}

/// SQLite's WAL hook: called after each commit with the WAL's length in frames.
unsafe extern "C" fn on_commit(
    tracker: *mut std::ffi::c_void,
    _db: *mut rusqlite::ffi::sqlite3,
    _schema: *const std::ffi::c_char,
    frames: std::ffi::c_int,
) -> std::ffi::c_int {
    // SAFETY: the pointer `install` registered, valid while the hook is (see `WalIo`).
    let tracker = unsafe { &mut *tracker.cast::<Tracker>() };
    tracker.committed(u64::try_from(frames).unwrap_or(0));
    rusqlite::ffi::SQLITE_OK
}

/// The thread: serves requests until the connection is gone. The WAL is opened at the first
/// (it exists once something was committed); a failure costs only the help.
fn serve(wal: &Path, queue: &mpsc::Receiver<Request>) {
    let mut file = None;
    while let Ok(request) = queue.recv() {
        if file.is_none() {
            // Written to by `fallocate` only, which needs write access.
            file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(wal)
                .inspect_err(|e| tracing::debug!(error = %e, "cannot open the WAL"))
                .ok();
        }
        let Some(file) = &file else { continue };
        if let Err(e) = apply(file, request) {
            tracing::debug!(error = %e, "cannot prepare or write out part of the WAL");
        }
    }
}

#[cfg(target_os = "linux")]
fn apply(file: &std::fs::File, request: Request) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Request::Prepare(range) | Request::WriteOut(range)) = &request;
    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(range.start),
        libc::off64_t::try_from(range.end - range.start),
    ) else {
        return Ok(());
    };
    let fd = file.as_raw_fd();
    // SAFETY: these calls take a valid open file descriptor and read no memory of ours. None
    // waits for the disk to read or write the range's data: fallocate allocates blocks (a
    // no-op where the WAL has them), WILLNEED starts reading the pages the cache lacks,
    // SYNC_FILE_RANGE_WRITE starts writing the dirty ones.
    match request {
        Request::Prepare(_) => {
            let allocated =
                match unsafe { libc::fallocate64(fd, libc::FALLOC_FL_KEEP_SIZE, offset, len) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                };
            // Read in even when the disk is full: the part inside the WAL still helps.
            match unsafe { libc::posix_fadvise64(fd, offset, len, libc::POSIX_FADV_WILLNEED) } {
                0 => allocated,
                errno => Err(std::io::Error::from_raw_os_error(errno)),
            }
        }
        Request::WriteOut(_) => {
            match unsafe { libc::sync_file_range(fd, offset, len, libc::SYNC_FILE_RANGE_WRITE) } {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn apply(_file: &std::fs::File, _request: Request) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: u64 = FRAME_HEADER + 4096;

    fn tracker(queue: usize) -> (Tracker, mpsc::Receiver<Request>) {
        let (requests, asked) = mpsc::sync_channel(queue);
        let tracker = Tracker {
            frame_bytes: FRAME,
            page: 4096,
            end: 0,
            prepared_to: 0,
            written_to: 0,
            requests,
        };
        (tracker, asked)
    }

    /// The frames that end at `bytes` into the WAL, or just before.
    fn frames_at(bytes: u64) -> u64 {
        (bytes - WAL_HEADER) / FRAME
    }

    fn asked(asked: &mpsc::Receiver<Request>) -> Vec<Request> {
        asked.try_iter().collect()
    }

    /// The ranges prepared, as (start, end).
    fn prepared(requests: &[Request]) -> Vec<(u64, u64)> {
        let ranges = requests.iter().filter_map(|r| match r {
            Request::Prepare(range) => Some((range.start, range.end)),
            Request::WriteOut(_) => None,
        });
        ranges.collect()
    }

    fn write_outs(requests: &[Request]) -> Vec<Range<u64>> {
        let ranges = requests.iter().filter_map(|r| match r {
            Request::WriteOut(range) => Some(range.clone()),
            Request::Prepare(_) => None,
        });
        ranges.collect()
    }

    #[test]
    fn the_wal_is_prepared_ahead_of_the_writer_and_again_half_way() {
        let (mut t, queue) = tracker(8);
        t.committed(3);
        let end = WAL_HEADER + 3 * FRAME;
        assert_eq!(asked(&queue), [Request::Prepare(end..end + AHEAD)]);
        t.committed(frames_at(AHEAD / 4));
        assert_eq!(prepared(&asked(&queue)), [], "still well ahead");
        let frames = frames_at(AHEAD / 2 + FRAME * 10);
        t.committed(frames);
        let end = WAL_HEADER + frames * FRAME;
        // From where the last preparation ended: nothing twice.
        assert_eq!(
            prepared(&asked(&queue)),
            [(WAL_HEADER + 3 * FRAME + AHEAD, end + AHEAD)]
        );
    }

    #[test]
    fn what_the_writer_left_behind_is_written_out_short_of_its_page() {
        let (mut t, queue) = tracker(8);
        t.committed(frames_at(BEHIND / 2));
        assert_eq!(write_outs(&asked(&queue)), []);
        let frames = frames_at(3 * BEHIND / 2);
        t.committed(frames);
        let end = WAL_HEADER + frames * FRAME;
        let written = write_outs(&asked(&queue));
        let [range] = &written[..] else {
            panic!("one write-out: {written:?}")
        };
        assert_eq!(range.start, 0);
        assert_eq!(range.end % 4096, 0, "whole pages: {range:?}");
        // The page the next frame is written into stays out.
        assert!(
            range.end <= end / 4096 * 4096 - 4096,
            "{range:?}, end {end}"
        );
    }

    #[test]
    fn a_rewound_wal_is_prepared_and_written_out_from_its_head() {
        let (mut t, queue) = tracker(8);
        t.committed(frames_at(4 * BEHIND));
        asked(&queue);
        let frames = frames_at(2 * BEHIND);
        t.committed(frames);
        let requests = asked(&queue);
        let end = WAL_HEADER + frames * FRAME;
        assert_eq!(prepared(&requests), [(end, end + AHEAD)]);
        assert!(matches!(&write_outs(&requests)[..], [r] if r.start == 0));
    }

    #[test]
    fn requests_a_busy_thread_could_not_take_are_made_good_later() {
        let (mut t, queue) = tracker(1);
        t.committed(frames_at(2 * BEHIND));
        // The queue is full (the preparation): the write-out waits for a later commit.
        assert_eq!(t.written_to, 0);
        asked(&queue);
        t.committed(frames_at(3 * BEHIND));
        let next = write_outs(&asked(&queue));
        assert!(
            matches!(&next[..], [r] if r.start == 0 && r.end > 2 * BEHIND),
            "{next:?}"
        );
    }

    /// Through SQLite: the hook sees each commit of the write connection, and the thread,
    /// working on the real WAL, leaves every commit readable.
    #[test]
    fn the_hook_follows_the_writer_through_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn.execute_batch("CREATE TABLE t (v BLOB)").unwrap();
        let io = install(&conn, &path).unwrap();
        assert_eq!(io.is_some(), cfg!(target_os = "linux"));
        for _ in 0..600 {
            conn.execute("INSERT INTO t VALUES (zeroblob(4000))", [])
                .unwrap();
        }
        if let Some(io) = &io {
            // SAFETY: the hook runs on this thread only, and not now.
            let tracker = unsafe { &*io.tracker };
            let wal = std::fs::metadata(dir.path().join("db-wal")).unwrap().len();
            assert_eq!(tracker.end, wal, "the hook saw the last commit");
            assert!(
                tracker.written_to >= BEHIND,
                "written out behind the writer"
            );
        }
        let count: i64 = Connection::open(&path)
            .unwrap()
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, 600);
        drop(conn);
        drop(io);
    }
}
