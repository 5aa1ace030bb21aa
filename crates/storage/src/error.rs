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
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// Saving or removing checkpoints failed.
    #[error("checkpoint storage failed: {0}")]
    Checkpoint(String),
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
