//! A search of the long-term store by meaning on SQLite. One user has 11,000 items with one
//! 384-dimension embedding each (the size of the offline MiniLM model's): 1,000 under one
//! namespace, 10,000 under another. A search ranks a page of 10 against a query embedding,
//! over all the items of one namespace or over a tenth of them (a deeper prefix).
//!
//! Run with `cargo bench -p spindle-storage --bench store_search`.
//!
//! Measured on the 2-core machine (shared), 2026-11-23, criterion's medians. "Before" is the
//! first implementation: every embedding of the user read into the process and ranked
//! there. "Scan": ranked in SQLite with sqlite-vec, the items under the prefix driving the
//! query. "Now": the 10,000 items (over a third of the user's 11,000) are searched through
//! the nearest-neighbour index; the smaller prefixes still scan, which is faster for them.
//! Scan and index were measured alternately, three times each (index 29.8, 30.2, 28.0 ms;
//! scan 67.3, 53.0, 60.5 ms): this machine drifts by ±15 % over minutes.
//!
//! | search, page of 10 | before | scan | now |
//! | --- | --- | --- | --- |
//! | the 1,000 items | 50.0 ms | 6.7 ms | (scan) |
//! | a tenth of the 1,000 | 29.0 ms | 1.1 ms | (scan) |
//! | the 10,000 items | 304 ms | 60.5 ms | 29.8 ms |
//! | a tenth of the 10,000 | 57.0 ms | 6.7 ms | (scan) |

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use spindle_storage::model::{Page, Scope};
use spindle_storage::sqlite::SqliteStorage;
use spindle_storage::{ItemSearch, ItemStore, ItemVector, PutItem};

const SIZES: [usize; 2] = [1_000, 10_000];
const DIMS: usize = 384;

/// A deterministic embedding that differs from item to item (a cheap hash spread over `DIMS`).
fn embedding(seed: usize) -> Vec<f32> {
    let mut x = seed as u64 * 0x9E37_79B9_7F4A_7C15 + 1;
    (0..DIMS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

async fn fill(storage: &SqliteStorage, scope: &Scope, n: usize) {
    for i in 0..n {
        let put = PutItem {
            namespace: vec![format!("s{n}"), format!("g{}", i % 10)],
            key: format!("k{i}"),
            value: json!({"text": format!("item {i}"), "i": i}),
            ttl_minutes: None,
            vectors: vec![ItemVector {
                field: "text".into(),
                embedding: embedding(i),
            }],
        };
        storage.put_item(scope, put).await.expect("put");
    }
}

fn search(prefix: Vec<String>, query: &[f32]) -> ItemSearch {
    ItemSearch {
        prefix,
        filter: Vec::new(),
        page: Page {
            limit: 10,
            offset: 0,
        },
        refresh_ttl: false,
        query: Some(query.to_vec()),
    }
}

fn store_search(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = dir.path().join("bench.db");
    let storage = rt
        .block_on(SqliteStorage::open(url.to_str().expect("UTF-8 path")))
        .expect("open SQLite");
    let scope = Scope::new("bench");
    for n in SIZES {
        rt.block_on(fill(&storage, &scope, n));
    }
    let query = embedding(usize::MAX / 3);

    let mut group = c.benchmark_group("store_search_sqlite");
    for n in SIZES {
        let whole = search(vec![format!("s{n}")], &query);
        group.bench_function(format!("by_meaning/{n}_items"), |b| {
            b.iter(|| {
                let found = rt
                    .block_on(storage.search_items(&scope, whole.clone()))
                    .expect("search");
                assert_eq!(found.len(), 10);
            })
        });
        let tenth = search(vec![format!("s{n}"), "g3".into()], &query);
        group.bench_function(format!("by_meaning_under_a_tenth/{n}_items"), |b| {
            b.iter(|| {
                let found = rt
                    .block_on(storage.search_items(&scope, tenth.clone()))
                    .expect("search");
                assert_eq!(found.len(), 10);
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = store_search
}
criterion_main!(benches);
