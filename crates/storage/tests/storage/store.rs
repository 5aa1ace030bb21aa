//! The long-term store: puts, reads, filters, namespaces, TTL and ranking by embeddings.

use chrono::Utc;
use serde_json::{json, Value};
use spindle_storage::store::parse_filter;
use spindle_storage::test_util::for_each_backend;
use spindle_storage::*;

use crate::common::*;

fn ns(labels: &[&str]) -> Vec<String> {
    labels.iter().map(|s| s.to_string()).collect()
}

fn put(namespace: &[&str], key: &str, value: Value) -> PutItem {
    PutItem {
        namespace: ns(namespace),
        key: key.to_owned(),
        value,
        ttl_minutes: None,
        vectors: Vec::new(),
    }
}

fn search(prefix: &[&str], filter: Value) -> ItemSearch {
    ItemSearch {
        prefix: ns(prefix),
        filter: parse_filter(&obj(filter)).expect("a valid filter"),
        page: all(),
        refresh_ttl: false,
        query: None,
    }
}

fn keys(items: &[StoreItem]) -> Vec<String> {
    let mut keys: Vec<String> = items.iter().map(|i| i.key.clone()).collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn put_get_replace_and_delete() {
    for_each_backend(|db| async move {
        let (s, me) = (db.storage(), Scope::local());
        s.put_item(
            &me,
            put(&["users", "u1"], "prefs", json!({"theme": "dark"})),
        )
        .await
        .unwrap();
        let first = s
            .get_item(&me, &ns(&["users", "u1"]), "prefs", false)
            .await
            .unwrap();
        assert_eq!(first.value, json!({"theme": "dark"}));
        assert_eq!(first.namespace, ns(&["users", "u1"]));
        assert_eq!(first.created_at, first.updated_at);

        s.put_item(
            &me,
            put(&["users", "u1"], "prefs", json!({"theme": "light"})),
        )
        .await
        .unwrap();
        let second = s
            .get_item(&me, &ns(&["users", "u1"]), "prefs", false)
            .await
            .unwrap();
        assert_eq!(second.value, json!({"theme": "light"}));
        assert_eq!(
            second.created_at, first.created_at,
            "a replace keeps created_at"
        );
        assert!(second.updated_at >= first.updated_at);

        // Another user sees nothing of it.
        let other = Scope::new("someone-else");
        assert!(matches!(
            s.get_item(&other, &ns(&["users", "u1"]), "prefs", false)
                .await,
            Err(StorageError::NotFound(_))
        ));
        assert!(s
            .search_items(&other, search(&[], json!({})))
            .await
            .unwrap()
            .is_empty());

        s.delete_item(&me, &ns(&["users", "u1"]), "prefs")
            .await
            .unwrap();
        s.delete_item(&me, &ns(&["users", "u1"]), "prefs")
            .await
            .unwrap();
        assert!(matches!(
            s.get_item(&me, &ns(&["users", "u1"]), "prefs", false).await,
            Err(StorageError::NotFound(_))
        ));
    })
    .await;
}

#[tokio::test]
async fn search_by_prefix_and_filters() {
    for_each_backend(|db| async move {
        let (s, me) = (db.storage(), Scope::local());
        let docs = [
            (
                &["docs", "a"][..],
                "1",
                json!({"kind": "note", "n": 1, "tags": ["x"], "meta": {"lang": "en", "v": 2.5}}),
            ),
            (
                &["docs", "a", "deep"][..],
                "2",
                json!({"kind": "note", "n": 5, "meta": {"lang": "fr", "v": 1}}),
            ),
            (
                &["docs", "ab"][..],
                "3",
                json!({"kind": "todo", "n": 10, "flag": true}),
            ),
            (
                &["other"][..],
                "4",
                json!({"kind": "note", "n": 3, "flag": false}),
            ),
        ];
        for (namespace, key, value) in docs {
            s.put_item(&me, put(namespace, key, value)).await.unwrap();
        }
        let found = |prefix: &'static [&'static str], filter: Value| {
            let search = search(prefix, filter);
            async move { keys(&s.search_items(&Scope::local(), search).await.unwrap()) }
        };
        assert_eq!(found(&[], json!({})).await, ["1", "2", "3", "4"]);
        // A prefix is whole labels: docs.a holds docs.a.deep but not docs.ab.
        assert_eq!(found(&["docs", "a"], json!({})).await, ["1", "2"]);
        assert_eq!(found(&["docs"], json!({"kind": "note"})).await, ["1", "2"]);
        assert_eq!(found(&[], json!({"n": {"$gt": 1}})).await, ["2", "3", "4"]);
        assert_eq!(
            found(&[], json!({"n": {"$gte": 3, "$lt": 10}})).await,
            ["2", "4"]
        );
        assert_eq!(found(&[], json!({"n": {"$lte": 3}})).await, ["1", "4"]);
        assert_eq!(found(&[], json!({"n": {"$eq": 5}})).await, ["2"]);
        // $ne also matches items without the field, as LangGraph's store does.
        assert_eq!(
            found(&[], json!({"flag": {"$ne": true}})).await,
            ["1", "2", "4"]
        );
        assert_eq!(found(&[], json!({"flag": false})).await, ["4"]);
        assert_eq!(found(&[], json!({"meta": {"lang": "fr"}})).await, ["2"]);
        assert_eq!(found(&[], json!({"meta": {"v": {"$gt": 2}}})).await, ["1"]);
        assert_eq!(found(&[], json!({"tags": ["x"]})).await, ["1"]);
        assert_eq!(found(&[], json!({"kind": {"$gt": "o"}})).await, ["3"]);
        // A number is not equal to the string of it.
        assert!(found(&[], json!({"n": "5"})).await.is_empty());
        assert!(found(&[], json!({"missing": 1})).await.is_empty());

        // Pages, most recently updated first.
        let mut paged = search(&[], json!({}));
        paged.page = page(2, 1);
        let page_keys: Vec<String> = s
            .search_items(&me, paged)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.key)
            .collect();
        assert_eq!(page_keys, ["3", "2"]);
    })
    .await;
}

#[tokio::test]
async fn namespaces_are_listed_with_prefix_suffix_and_depth() {
    for_each_backend(|db| async move {
        let (s, me) = (db.storage(), Scope::local());
        for namespace in [
            &["a", "b", "c"][..],
            &["a", "b", "d"],
            &["a", "x", "c"],
            &["b"],
        ] {
            s.put_item(&me, put(namespace, "k", json!({})))
                .await
                .unwrap();
        }
        let list = |prefix: &[&str], suffix: &[&str], max_depth: Option<usize>, limit, offset| {
            let search = NamespaceSearch {
                prefix: ns(prefix),
                suffix: ns(suffix),
                max_depth,
                page: page(limit, offset),
            };
            async move {
                s.list_namespaces(&Scope::local(), search)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|labels| labels.join("."))
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(
            list(&[], &[], None, 100, 0).await,
            ["a.b.c", "a.b.d", "a.x.c", "b"]
        );
        assert_eq!(
            list(&["a"], &[], None, 100, 0).await,
            ["a.b.c", "a.b.d", "a.x.c"]
        );
        assert_eq!(list(&["a"], &["c"], None, 100, 0).await, ["a.b.c", "a.x.c"]);
        assert_eq!(
            list(&["a", "*", "c"], &[], None, 100, 0).await,
            ["a.b.c", "a.x.c"]
        );
        assert_eq!(list(&[], &[], Some(2), 100, 0).await, ["a.b", "a.x", "b"]);
        assert_eq!(list(&[], &[], None, 2, 1).await, ["a.b.d", "a.x.c"]);
    })
    .await;
}

#[tokio::test]
async fn items_expire_refresh_and_are_swept() {
    for_each_backend(|db| async move {
        let (s, me) = (db.storage(), Scope::local());
        let mut short = put(&["t"], "short", json!({"v": 1}));
        short.ttl_minutes = Some(0.01); // 0.6 s
        s.put_item(&me, short).await.unwrap();
        let mut long = put(&["t"], "long", json!({"v": 2}));
        long.ttl_minutes = Some(60.0);
        s.put_item(&me, long).await.unwrap();
        s.put_item(&me, put(&["t"], "forever", json!({"v": 3})))
            .await
            .unwrap();

        assert!(s.get_item(&me, &ns(&["t"]), "short", true).await.is_ok());
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        // Past its TTL an item is gone for reads even before the sweep.
        assert!(matches!(
            s.get_item(&me, &ns(&["t"]), "short", false).await,
            Err(StorageError::NotFound(_))
        ));
        assert_eq!(
            keys(
                &s.search_items(&me, search(&["t"], json!({})))
                    .await
                    .unwrap()
            ),
            ["forever", "long"]
        );
        let swept = s.sweep_expired_items(Utc::now(), 100).await.unwrap();
        assert_eq!(swept, 1);
        assert_eq!(s.sweep_expired_items(Utc::now(), 100).await.unwrap(), 0);
        // In an hour the long one expires; a refresh moves that back by its TTL.
        let later = Utc::now() + chrono::Duration::minutes(61);
        s.get_item(&me, &ns(&["t"]), "long", true).await.unwrap();
        assert_eq!(
            s.sweep_expired_items(later - chrono::Duration::minutes(2), 100)
                .await
                .unwrap(),
            0
        );
        assert_eq!(s.sweep_expired_items(later, 100).await.unwrap(), 1);
        assert!(s.get_item(&me, &ns(&["t"]), "forever", false).await.is_ok());
    })
    .await;
}

#[tokio::test]
async fn search_by_meaning_ranks_by_cosine_over_fields() {
    for_each_backend(|db| async move { ranks_by_cosine_over_fields(db.storage()).await }).await;
}

/// PostgreSQL with pgvector ranks in the database, with the same order and scores. The
/// server comes from [`PGVECTOR_URL_ENV`] (`scripts/pgvector-server` starts one); the test
/// installs the extension through the storage itself, as a first search does.
#[tokio::test]
async fn search_by_meaning_ranks_the_same_with_pgvector() {
    let Some(url) = pgvector_url() else { return };
    let db = spindle_storage::test_util::TestDatabase::postgres(&url).await;
    let storage = spindle_storage::postgres::PostgresStorage::connect(
        db.url(),
        spindle_storage::default_pg_writers(),
    )
    .await
    .expect("connect to the pgvector server");
    assert!(
        storage.ranks_with_pgvector().await,
        "pgvector is available at {PGVECTOR_URL_ENV} but the storage does not rank with it"
    );
    ranks_by_cosine_over_fields(&storage).await;
    drop(storage);
    db.remove().await;
}

const PGVECTOR_URL_ENV: &str = "SPINDLE_TEST_PGVECTOR_URL";

/// The URL of a PostgreSQL server that has pgvector, or `None` after saying loudly that the
/// test is skipped (a failure when `SPINDLE_TEST_REQUIRE_PGVECTOR` is set, as in CI).
fn pgvector_url() -> Option<String> {
    match std::env::var(PGVECTOR_URL_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required = std::env::var("SPINDLE_TEST_REQUIRE_PGVECTOR")
                .is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !required,
                "SPINDLE_TEST_REQUIRE_PGVECTOR is set but {PGVECTOR_URL_ENV} is not"
            );
            eprintln!(
                "\n*** SKIPPED: ranking with pgvector: {PGVECTOR_URL_ENV} is not set \
                 (scripts/pgvector-server starts a server that has it) ***\n"
            );
            None
        }
    }
}

async fn ranks_by_cosine_over_fields(s: &dyn Storage) {
    let me = Scope::local();
    let with = |key: &str, fields: &[(&str, &[f32])]| {
        let mut item = put(&["m"], key, json!({"k": key}));
        item.vectors = fields
            .iter()
            .map(|(field, v)| ItemVector {
                field: field.to_string(),
                embedding: v.to_vec(),
            })
            .collect();
        item
    };
    s.put_item(&me, with("x", &[("$", &[1.0, 0.0, 0.0])]))
        .await
        .unwrap();
    s.put_item(
        &me,
        with("y", &[("a", &[0.0, 1.0, 0.0]), ("b", &[0.7, 0.7, 0.0])]),
    )
    .await
    .unwrap();
    s.put_item(&me, with("z", &[("$", &[0.0, 0.1, 1.0])]))
        .await
        .unwrap();
    s.put_item(&me, put(&["m"], "plain", json!({"k": "plain"})))
        .await
        .unwrap();
    // Embeddings that cannot be compared with the query score 0 instead of failing the
    // search: all zeros, and another length (left by an index whose `dims` changed).
    s.put_item(&me, with("zeros", &[("$", &[0.0, 0.0, 0.0])]))
        .await
        .unwrap();
    s.put_item(&me, with("longer", &[("$", &[1.0, 0.0, 0.0, 0.0])]))
        .await
        .unwrap();
    let mut query = search(&["m"], json!({}));
    query.query = Some(vec![1.0, 0.1, 0.0]);
    let found = s.search_items(&me, query.clone()).await.unwrap();
    let order: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        order,
        ["x", "y", "z", "longer", "zeros"],
        "items without embeddings are left out; ties are in namespace and key order"
    );
    let scores: Vec<f64> = found.iter().map(|i| i.score.unwrap()).collect();
    assert!(scores[0] > scores[1] && scores[1] > scores[2], "{scores:?}");
    assert!((scores[0] - 0.995).abs() < 0.001, "{scores:?}");
    // The best field counts: y's "b" is close to the query (0.7 + 0.07 over |b| |q|).
    assert!((scores[1] - 0.7741).abs() < 0.001, "{scores:?}");
    assert!((scores[2] - 0.0099).abs() < 0.0001, "{scores:?}");
    assert_eq!(&scores[3..], [0.0, 0.0], "{scores:?}");
    query.page = page(1, 1);
    assert_eq!(
        keys(&s.search_items(&me, query.clone()).await.unwrap()),
        ["y"]
    );
    // Filters apply before the page is cut.
    let mut filtered = search(&["m"], json!({"k": {"$ne": "x"}}));
    filtered.query = query.query.clone();
    filtered.page = page(2, 0);
    assert_eq!(
        keys(&s.search_items(&me, filtered).await.unwrap()),
        ["y", "z"]
    );
    // A re-put without embeddings takes the item out of semantic search.
    s.put_item(&me, put(&["m"], "x", json!({"k": "x"})))
        .await
        .unwrap();
    let mut query = search(&["m"], json!({}));
    query.query = Some(vec![1.0, 0.0, 0.0]);
    query.page = page(2, 0);
    let found = s.search_items(&me, query).await.unwrap();
    assert_eq!(
        found.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        ["y", "longer"],
        "y's best field, then the first of the items that score 0"
    );
}
