//! Engine overhead: per super-step of `chain` with the in-memory checkpointer, and per turn
//! on a 1,000-message thread (also reporting the bytes a turn writes).
//!
//! Run with `cargo bench -p spindle-graph --bench engine`.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::{json, Value};
use spindle_graph::builder::{node_fn, GraphBuilder};
use spindle_graph::channels::{ChannelKind, ChannelSpec};
use spindle_graph::checkpoint::{Checkpointer, InMemoryCheckpointer};
use spindle_graph::node::Command;
use spindle_graph::{Durability, Graph, RunConfig, RunEnv, RunInput, END, START};

/// `chain` built in Rust: measures the engine, not the script interpreter.
fn rust_chain() -> Arc<Graph> {
    let inc = || {
        node_fn(|s: Value| {
            Ok(Command::update(
                json!({"n": s["n"].as_i64().unwrap_or(0) + 1}),
            ))
        })
    };
    Arc::new(
        GraphBuilder::new("chain")
            .channel(ChannelSpec::new("n", ChannelKind::LastValue))
            .node("a", inc())
            .node("b", inc())
            .node("c", inc())
            .edge(START, "a")
            .edge("a", "b")
            .edge("b", "c")
            .edge("c", END)
            .compile()
            .expect("valid graph"),
    )
}

fn yaml_graph(id: &str) -> Arc<Graph> {
    Arc::new(
        spindle_graph::examples::get(id)
            .expect("known example")
            .expect("example compiles"),
    )
}

async fn run_once(
    g: &Arc<Graph>,
    saver: &Arc<InMemoryCheckpointer>,
    thread: &str,
    input: Value,
    durability: Durability,
) {
    let cfg = RunConfig {
        thread_id: Some(thread.to_string()),
        durability,
        ..Default::default()
    };
    let env = RunEnv {
        checkpointer: Some(saver.clone()),
        ..Default::default()
    };
    spindle_graph::pregel::run(g, RunInput::Values(input), cfg, env)
        .await
        .expect("run succeeds");
}

/// A run of `chain` is 4 super-steps (the input step and a, b, c), each with a checkpoint.
const CHAIN_STEPS: u32 = 4;

fn chain(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("chain_run_4_steps");
    for (name, g) in [
        ("rust_nodes", rust_chain()),
        ("yaml_rhai_nodes", yaml_graph("chain")),
    ] {
        for (dname, d) in [("sync", Durability::Sync), ("async", Durability::Async)] {
            let saver = Arc::new(InMemoryCheckpointer::new());
            let mut i = 0u64;
            group.bench_function(format!("{name}/{dname}"), |b| {
                b.iter(|| {
                    i += 1;
                    // A fresh thread each run, as a server run on a new thread would be.
                    rt.block_on(run_once(&g, &saver, &format!("t{i}"), json!({"n": 0}), d))
                })
            });
        }
    }
    group.finish();
    eprintln!("(divide chain_run_4_steps times by {CHAIN_STEPS} for the per-super-step figure)");
}

fn long_thread(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let g = yaml_graph("echo");
    let template = Arc::new(InMemoryCheckpointer::counting_bytes());
    let history: Vec<Value> = (0..1000)
        .map(|i| {
            json!({"role": if i % 2 == 0 { "user" } else { "assistant" },
                   "content": format!("message number {i} with a few more words of text in it")})
        })
        .collect();
    rt.block_on(run_once(
        &g,
        &template,
        "base",
        json!({"messages": history}),
        Durability::Sync,
    ));

    // Bytes one turn writes (checkpoint rows, changed blobs, pending writes).
    let before = template.bytes_written();
    rt.block_on(copy(&template, "base", "measure"));
    let after_copy = template.bytes_written();
    rt.block_on(run_once(
        &g,
        &template,
        "measure",
        json!({"messages": [{"role": "user", "content": "one more question"}]}),
        Durability::Sync,
    ));
    let per_turn = template.bytes_written() - after_copy;
    let _ = before;
    eprintln!("bytes written per turn on a 1,000-message thread: {per_turn}");

    let mut n = 0u64;
    c.bench_function("echo_turn_on_1000_message_thread", |b| {
        b.iter_batched(
            || {
                n += 1;
                let t = format!("turn{n}");
                rt.block_on(copy(&template, "base", &t));
                t
            },
            |t| {
                rt.block_on(run_once(
                    &g,
                    &template,
                    &t,
                    json!({"messages": [{"role": "user", "content": "one more question"}]}),
                    Durability::Sync,
                ))
            },
            BatchSize::SmallInput,
        )
    });
}

async fn copy(saver: &InMemoryCheckpointer, from: &str, to: &str) {
    saver.copy_thread(from, to).await.expect("copy");
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = chain, long_thread
}
criterion_main!(benches);
