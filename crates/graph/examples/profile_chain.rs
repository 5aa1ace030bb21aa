//! Runs `chain` (Rust nodes) in a loop, for profiling the per-step overhead (a development aid).
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use spindle_graph::builder::{node_fn, GraphBuilder};
use spindle_graph::channels::{ChannelKind, ChannelSpec};
use spindle_graph::checkpoint::InMemoryCheckpointer;
use spindle_graph::node::Command;
use spindle_graph::{Durability, RunConfig, RunEnv, RunInput, END, START};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let inc = || {
        node_fn(|s: Value| {
            Ok(Command::update(
                json!({"n": s["n"].as_i64().unwrap_or(0) + 1}),
            ))
        })
    };
    let g = Arc::new(
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
            .expect("graph"),
    );
    let saver = Arc::new(InMemoryCheckpointer::new());
    let n = 20_000;
    let t = Instant::now();
    for i in 0..n {
        let cfg = RunConfig {
            thread_id: Some(format!("t{i}")),
            durability: Durability::Sync,
            ..Default::default()
        };
        let env = RunEnv {
            checkpointer: Some(saver.clone()),
            ..Default::default()
        };
        spindle_graph::pregel::run(&g, RunInput::Values(json!({"n": 0})), cfg, env)
            .await
            .expect("run");
    }
    let per_run = t.elapsed() / n;
    println!("per run: {per_run:?}, per super-step: {:?}", per_run / 4);
}
