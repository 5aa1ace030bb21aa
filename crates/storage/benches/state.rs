//! Thread state reads on SQLite: the latest state and a history page of 10, on a thread of 10
//! checkpoints and on one of 10,000 (`chain`'s counter written at each checkpoint, so every
//! state has the same size and only the number of checkpoints differs). The figures should not
//! depend on the thread's length: both reads cost a fixed number of queries over the primary
//! key, and a history page materialises only its own checkpoints' channels. (A state whose
//! values grow, such as a chat's message list, costs in proportion to those values.)
//!
//! Run with `cargo bench -p spindle-storage --bench state`.
//!
//! Measured on the 2-core machine (shared), 2026-11-23, medians:
//!
//! | read | 10 checkpoints | 10,000 checkpoints |
//! | --- | --- | --- |
//! | `get_state` (latest) | 171 µs | 186 µs |
//! | history page of 10 (newest) | 320 µs | 407 µs |
//! | history page of 10 before the middle checkpoint | | 592 µs |
//!
//! For contrast, on an `echo` thread whose message list grows by one message per checkpoint,
//! the latest state at 10,000 checkpoints (10,000 messages) took 88 ms and a page of 10 such
//! states 1.1 s: there the cost follows the size of the values read, not the history.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use spindle_graph::checkpoint::{Checkpointer, ListFilter};
use spindle_graph::pregel::{self, NodeUpdate};
use spindle_graph::Graph;
use spindle_storage::sqlite::SqliteStorage;
use spindle_storage::Storage;

const SIZES: [usize; 2] = [10, 10_000];

/// A thread of `n` checkpoints of `chain`, each an update of its counter as node `a`.
async fn grow(graph: &Graph, saver: &dyn Checkpointer, thread: &str, n: usize) {
    let mut base = None;
    for i in 0..n {
        let update = NodeUpdate {
            values: json!({"n": i}),
            as_node: Some("a".into()),
            goto: Vec::new(),
        };
        let prepared = pregel::prepare_update(graph, thread, base.as_ref(), &[update])
            .await
            .expect("update applies");
        prepared.save(saver).await.expect("checkpoint saved");
        base = Some(prepared.tuple);
    }
}

fn state_reads(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = dir.path().join("bench.db");
    let storage = rt
        .block_on(SqliteStorage::open(url.to_str().expect("UTF-8 path")))
        .expect("open SQLite");
    let saver: Arc<dyn Checkpointer> = storage.checkpointer();
    let graph = spindle_graph::examples::get("chain")
        .expect("known example")
        .expect("example compiles");
    for n in SIZES {
        rt.block_on(grow(&graph, saver.as_ref(), &format!("t{n}"), n));
    }

    let mut group = c.benchmark_group("thread_state_sqlite");
    for n in SIZES {
        let thread = format!("t{n}");
        group.bench_function(format!("get_state/{n}_checkpoints"), |b| {
            b.iter(|| {
                rt.block_on(pregel::get_state(&graph, saver.as_ref(), &thread, "", None))
                    .expect("state")
                    .expect("a checkpoint")
            })
        });
        let page = ListFilter {
            limit: Some(10),
            ..ListFilter::default()
        };
        group.bench_function(format!("history_page_10/{n}_checkpoints"), |b| {
            b.iter(|| {
                let states = rt
                    .block_on(pregel::get_state_history(
                        &graph,
                        saver.as_ref(),
                        &thread,
                        "",
                        &page,
                    ))
                    .expect("history");
                assert_eq!(states.len(), 10);
            })
        });
    }
    // A page from the middle of the long thread (`before`), as a client paging back gets.
    let thread = format!("t{}", SIZES[1]);
    let middle = rt
        .block_on(saver.list(
            &thread,
            Some(""),
            &ListFilter {
                limit: Some(SIZES[1] / 2),
                ..ListFilter::default()
            },
        ))
        .expect("list")
        .pop()
        .expect("a checkpoint")
        .at
        .checkpoint_id;
    let deep = ListFilter {
        before: Some(middle),
        limit: Some(10),
        metadata: None,
    };
    group.bench_function(
        format!("history_page_10_before_middle/{}_checkpoints", SIZES[1]),
        |b| {
            b.iter(|| {
                rt.block_on(pregel::get_state_history(
                    &graph,
                    saver.as_ref(),
                    &thread,
                    "",
                    &deep,
                ))
                .expect("history")
            })
        },
    );
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50);
    targets = state_reads
}
criterion_main!(benches);
