use serde_json::json;
use spindle_storage::test_util::{for_each_backend, TestDatabase};
use spindle_storage::*;

use crate::common::*;

/// How many migrations a backend ships (SQLite has three PostgreSQL does not need: an integer
/// key for embeddings, which its nearest-neighbour indexes refer to, the run tables made
/// WITHOUT ROWID, and an unread index dropped; PostgreSQL two of its own: partial indexes over
/// the active runs, and the event log's foreign keys dropped).
fn migrations(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 13,
        Backend::Postgres => 15,
    }
}

#[tokio::test]
async fn migrate_only_is_idempotent() {
    let mut failures = Vec::new();
    for database in TestDatabase::all().await {
        let name = database.backend().as_str();
        let url = database.url().to_owned();
        assert_eq!(
            backend_of(&url),
            database.backend(),
            "{name}: backend_of({url})"
        );

        let first = migrate(&url).await;
        let second = migrate(&url).await;
        match (first, second) {
            (Ok(applied), Ok(0)) if applied == migrations(database.backend()) => {}
            other => failures.push(format!("[{name}] first and second migrate: {other:?}")),
        }

        // The migrated database opens (which migrates again, harmlessly) and works.
        let storage = connect(&url)
            .await
            .unwrap_or_else(|e| panic!("[{name}] connect: {e}"));
        assert_eq!(storage.backend(), database.backend(), "[{name}]");
        storage
            .ping()
            .await
            .unwrap_or_else(|e| panic!("[{name}] ping: {e}"));
        let third = migrate(&url).await;
        if !matches!(third, Ok(0)) {
            failures.push(format!("[{name}] migrate after connect: {third:?}"));
        }
        storage
            .create_thread(&Scope::local(), new_thread(json!({})))
            .await
            .unwrap_or_else(|e| panic!("[{name}] create after migrate: {e}"));
        drop(storage);
        database.remove().await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn an_opened_database_has_nothing_pending() {
    for_each_backend(|db| async move {
        assert_eq!(migrate(db.url()).await.unwrap(), 0);
        db.storage().ping().await.unwrap();
        assert_eq!(db.storage().backend(), db.backend());
    })
    .await;
}

#[tokio::test]
async fn sqlite_accepts_sqlite_urls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("by-url.db");
    let url = format!("sqlite://{}", path.display());
    assert_eq!(backend_of(&url), Backend::Sqlite);
    assert_eq!(migrate(&url).await.unwrap(), migrations(Backend::Sqlite));
    assert_eq!(migrate(&url).await.unwrap(), 0);
    let storage = connect(&url).await.unwrap();
    storage.ping().await.unwrap();
    assert!(path.exists(), "the URL's path is the file used");
}
