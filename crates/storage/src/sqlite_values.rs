//! Values as the SQLite backend stores them, for code on the write connection (rusqlite),
//! which must write exactly what the read pool (sqlx) decodes and what SQL compares:
//! timestamps as RFC 3339 text in sqlx's format (they are compared and ordered as text), JSON
//! as text, ids as hyphenated text.

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::types::{FromSqlError, Type, ValueRef};
use rusqlite::Row;
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

use crate::{ResourceId, StorageError, StorageResult};

/// A timestamp as sqlx encodes `DateTime<Utc>` for SQLite.
pub(crate) fn ts(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, false)
}

/// A value as JSON text (also what `spindle_create_group` takes on PostgreSQL).
pub(crate) fn json<T: Serialize + ?Sized>(value: &T) -> StorageResult<String> {
    serde_json::to_string(value).map_err(|e| StorageError::Invalid(format!("cannot encode: {e}")))
}

/// An id as the text SQLite keeps.
pub(crate) fn id(id: impl StoredId) -> String {
    id.stored_text()
}

/// The ids SQLite keeps as text: UUIDs (runs, crons) hyphenated, threads' and assistants'
/// ids as they are.
pub(crate) trait StoredId {
    fn stored_text(self) -> String;
}

impl StoredId for Uuid {
    fn stored_text(self) -> String {
        self.hyphenated().to_string()
    }
}

impl StoredId for ResourceId {
    fn stored_text(self) -> String {
        self.as_str().to_owned()
    }
}

fn conversion(
    idx: usize,
    kind: Type,
    error: impl std::error::Error + Send + Sync + 'static,
) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, kind, Box::new(error))
}

fn text<'a>(row: &'a Row<'_>, col: &str) -> rusqlite::Result<Option<&'a str>> {
    let idx = row.as_ref().column_index(col)?;
    match row.get_ref(idx)? {
        ValueRef::Null => Ok(None),
        ValueRef::Text(bytes) => std::str::from_utf8(bytes)
            .map(Some)
            .map_err(|e| conversion(idx, Type::Text, e)),
        other => Err(rusqlite::Error::FromSqlConversionFailure(
            idx,
            other.data_type(),
            Box::new(FromSqlError::InvalidType),
        )),
    }
}

fn required<T>(value: Option<T>, row: &Row<'_>, col: &str) -> rusqlite::Result<T> {
    value.ok_or_else(|| match row.as_ref().column_index(col) {
        Ok(idx) => rusqlite::Error::InvalidColumnType(idx, col.to_owned(), Type::Null),
        Err(e) => e,
    })
}

/// Reading the backend's encodings from a row, by column name.
pub(crate) trait RowExt {
    fn uuid(&self, col: &str) -> rusqlite::Result<Uuid>;
    fn opt_uuid(&self, col: &str) -> rusqlite::Result<Option<Uuid>>;
    fn resource_id(&self, col: &str) -> rusqlite::Result<ResourceId>;
    fn opt_resource_id(&self, col: &str) -> rusqlite::Result<Option<ResourceId>>;
    fn ts(&self, col: &str) -> rusqlite::Result<DateTime<Utc>>;
    fn opt_ts(&self, col: &str) -> rusqlite::Result<Option<DateTime<Utc>>>;
    fn json<T: DeserializeOwned>(&self, col: &str) -> rusqlite::Result<T>;
    fn opt_json<T: DeserializeOwned>(&self, col: &str) -> rusqlite::Result<Option<T>>;
}

impl RowExt for Row<'_> {
    fn uuid(&self, col: &str) -> rusqlite::Result<Uuid> {
        required(self.opt_uuid(col)?, self, col)
    }

    fn opt_uuid(&self, col: &str) -> rusqlite::Result<Option<Uuid>> {
        text(self, col)?
            .map(|s| Uuid::parse_str(s).map_err(|e| conversion(0, Type::Text, e)))
            .transpose()
    }

    fn resource_id(&self, col: &str) -> rusqlite::Result<ResourceId> {
        required(self.opt_resource_id(col)?, self, col)
    }

    fn opt_resource_id(&self, col: &str) -> rusqlite::Result<Option<ResourceId>> {
        text(self, col)?
            .map(|s| ResourceId::parse(s).map_err(|e| conversion(0, Type::Text, e)))
            .transpose()
    }

    fn ts(&self, col: &str) -> rusqlite::Result<DateTime<Utc>> {
        required(self.opt_ts(col)?, self, col)
    }

    fn opt_ts(&self, col: &str) -> rusqlite::Result<Option<DateTime<Utc>>> {
        text(self, col)?
            .map(|s| {
                DateTime::parse_from_rfc3339(s)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|e| conversion(0, Type::Text, e))
            })
            .transpose()
    }

    fn json<T: DeserializeOwned>(&self, col: &str) -> rusqlite::Result<T> {
        required(self.opt_json(col)?, self, col)
    }

    fn opt_json<T: DeserializeOwned>(&self, col: &str) -> rusqlite::Result<Option<T>> {
        text(self, col)?
            .map(|s| serde_json::from_str(s).map_err(|e| conversion(0, Type::Text, e)))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row as _;

    /// What the write connection stores, the read pool decodes, and the other way round.
    #[tokio::test]
    async fn timestamps_and_json_read_the_same_through_both_drivers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (at TEXT, doc TEXT, id TEXT)")
            .unwrap();
        let at = Utc::now();
        let doc = serde_json::json!({"a": [1, "b"]});
        let uuid = Uuid::new_v4();
        conn.execute(
            "INSERT INTO t VALUES (?1, ?2, ?3)",
            (ts(at), json(&doc).unwrap(), id(uuid)),
        )
        .unwrap();

        let url = format!("sqlite://{}", path.display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let row = sqlx::query("SELECT at, doc, id FROM t")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(row.get::<DateTime<Utc>, _>("at"), at);
        assert_eq!(
            row.get::<sqlx::types::Json<serde_json::Value>, _>("doc").0,
            doc
        );
        assert_eq!(row.get::<uuid::fmt::Hyphenated, _>("id").into_uuid(), uuid);
        sqlx::query("UPDATE t SET at = $1")
            .bind(at)
            .execute(&pool)
            .await
            .unwrap();

        let (back, doc_back, id_back) = conn
            .query_row("SELECT at, doc, id FROM t", [], |r| {
                Ok((
                    r.ts("at")?,
                    r.json::<serde_json::Value>("doc")?,
                    r.uuid("id")?,
                ))
            })
            .unwrap();
        assert_eq!((back, doc_back, id_back), (at, doc, uuid));
    }
}
