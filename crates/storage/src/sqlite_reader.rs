//! Point reads on SQLite on the caller's thread.
//!
//! Through sqlx every statement of a read is a round trip to a connection thread; the reads a
//! run makes on its way (its assistant, its thread's latest checkpoint, the run itself) are
//! point lookups of tens of microseconds, so they run here directly on a pooled read-only
//! connection, which costs less than one hand-off. Reads that can be long (searches, history
//! pages) stay on the sqlx pool and do not hold up the async runtime.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{Connection, OpenFlags};

use crate::{StorageError, StorageResult};

/// Idle connections kept; more are opened when more reads run at once.
const MAX_IDLE: usize = 8;

/// Prepared statements each read connection keeps.
const STATEMENT_CACHE: usize = 64;

pub(crate) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    pub(crate) fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `read` on a read-only connection, in one transaction, so that its queries see
    /// one snapshot of the database.
    pub(crate) fn read<T, E: From<StorageError>>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, E>,
    ) -> Result<T, E> {
        let conn = match self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            Some(conn) => conn,
            None => self.connect()?,
        };
        let tx = conn
            .unchecked_transaction()
            .map_err(|e| E::from(e.into()))?;
        let result = read(&tx);
        // Read-only: ending the transaction either way only releases the snapshot.
        drop(tx);
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
        result
    }

    fn connect(&self) -> StorageResult<Connection> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.path, flags)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Ok(conn)
    }
}
