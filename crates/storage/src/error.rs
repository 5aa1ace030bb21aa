//! Errors of the storage boundary, in terms the server can map to HTTP statuses.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum StorageError {
    /// The resource does not exist for the caller's scope.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The request collides with existing state (an existing id, a busy thread).
    #[error("{0}")]
    Conflict(String),
    /// The request names something that cannot be applied (a version that does not exist).
    #[error("{0}")]
    Invalid(String),
    /// The database failed or could not be reached.
    #[error("database error: {0}")]
    Database(sqlx::Error),
    /// The SQLite write connection failed (see `sqlite_writer`).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A write's transaction did not commit, or the writer thread is gone.
    #[error("database write failed: {0}")]
    Commit(String),
    /// The database's schema is missing or behind this build's (see `schema.rs`).
    #[error("{0}")]
    Schema(String),
    #[error("migration failed: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The assistant a run was made from changed (or went) before the run was created
    /// ([`crate::AssistantStore::assistant_for_run`]); nothing was written.
    #[error("the assistant changed while the run was being created")]
    AssistantChanged,
    /// Saving or removing checkpoints failed.
    #[error("checkpoint storage failed: {0}")]
    Checkpoint(String),
}

impl From<sqlx::Error> for StorageError {
    fn from(error: sqlx::Error) -> Self {
        // A connection found dead: the pool tests its other connections before their next use.
        crate::pg_pool::doubt(&error);
        StorageError::Database(error)
    }
}

impl From<spindle_graph::checkpoint::CheckpointError> for StorageError {
    fn from(error: spindle_graph::checkpoint::CheckpointError) -> Self {
        StorageError::Checkpoint(error.to_string())
    }
}

pub type StorageResult<T> = Result<T, StorageError>;

/// A unique-key violation (an id that is already taken) as a [`StorageError::Conflict`] with
/// `message`; any other error as it is.
pub(crate) fn conflict_if_taken(
    error: sqlx::Error,
    message: impl FnOnce() -> String,
) -> StorageError {
    match &error {
        sqlx::Error::Database(e) if e.is_unique_violation() => StorageError::Conflict(message()),
        _ => error.into(),
    }
}

/// [`conflict_if_taken`] for errors of the SQLite write connection.
pub(crate) fn sqlite_conflict_if_taken(
    error: rusqlite::Error,
    message: impl FnOnce() -> String,
) -> StorageError {
    if sqlite_constraint(&error, rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE)
        || sqlite_constraint(&error, rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
    {
        return StorageError::Conflict(message());
    }
    error.into()
}

/// Whether `error` is the SQLite constraint violation `code` (an extended result code).
pub(crate) fn sqlite_constraint(error: &rusqlite::Error, code: std::os::raw::c_int) -> bool {
    matches!(error, rusqlite::Error::SqliteFailure(e, _) if e.extended_code == code)
}
