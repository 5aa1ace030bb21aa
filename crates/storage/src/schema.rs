//! Whether a database's schema is the one this build needs: `ping` (the server's `/ready`)
//! checks it, so a server whose database lacks its tables (dropped, restored from an old
//! backup, or a SQLite database that is not the file the migrations ran on) is not reported
//! ready while every request would fail.

use sqlx::migrate::Migrator;

use crate::{StorageError, StorageResult};

/// The newest migration applied, as read from `_sqlx_migrations`.
pub(crate) const LATEST_APPLIED: &str = "SELECT max(version) FROM _sqlx_migrations WHERE success";

/// `applied` (the answer to [`LATEST_APPLIED`]) against the newest migration of `migrator`:
/// `Schema` when the migrations table is missing or behind. A newer schema (a newer Spindle
/// migrated the database) is current: migrations only add.
pub(crate) fn check_current(
    migrator: &Migrator,
    applied: Result<Option<i64>, sqlx::Error>,
) -> StorageResult<()> {
    let needed = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    match applied {
        Ok(Some(version)) if version >= needed => Ok(()),
        Ok(version) => Err(StorageError::Schema(format!(
            "the database's schema is behind this Spindle's: migration {needed} is not applied \
             (newest applied: {}); run `spindle migrate`",
            version.map_or_else(|| "none".to_owned(), |v| v.to_string())
        ))),
        Err(err) if is_missing_table(&err) => Err(StorageError::Schema(
            "the database has no Spindle schema (no migrations table); run `spindle migrate` \
             or start Spindle on the database it migrated"
                .to_owned(),
        )),
        Err(err) => Err(err.into()),
    }
}

/// PostgreSQL's `undefined_table`, or SQLite's `no such table` (SQLite has no code of its own
/// for it).
fn is_missing_table(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(e) => {
            e.code().as_deref() == Some("42P01") || e.message().starts_with("no such table")
        }
        _ => false,
    }
}
