//! Times the parts of a turn on a 1,000-message thread (a development aid).
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use spindle_graph::checkpoint::{Checkpointer, InMemoryCheckpointer};
use spindle_graph::{Durability, RunConfig, RunEnv, RunInput};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rust = std::env::args().any(|a| a == "rust");
    let g = if rust {
        use spindle_graph::builder::{node_fn, GraphBuilder};
        use spindle_graph::channels::{ChannelKind, ChannelSpec};
        Arc::new(
            GraphBuilder::new("echo")
                .channel(ChannelSpec::new("messages", ChannelKind::Messages))
                .node(
                    "respond",
                    node_fn(|_s| {
                        Ok(spindle_graph::node::Command::update(
                            json!({"messages": [{"role": "ai", "content": "echo"}]}),
                        ))
                    }),
                )
                .edge(spindle_graph::START, "respond")
                .compile()
                .expect("graph"),
        )
    } else {
        Arc::new(
            spindle_graph::examples::get("echo")
                .and_then(Result::ok)
                .expect("echo"),
        )
    };
    let saver = Arc::new(InMemoryCheckpointer::new());
    let history: Vec<Value> = (0..1000)
        .map(|i| json!({"role": "user", "content": format!("message number {i} with a few more words")}))
        .collect();
    let run = |thread: &str, input: Value| {
        let cfg = RunConfig {
            thread_id: Some(thread.into()),
            durability: Durability::Sync,
            ..Default::default()
        };
        let env = RunEnv {
            checkpointer: Some(saver.clone()),
            ..Default::default()
        };
        let g = g.clone();
        async move { spindle_graph::pregel::run(&g, RunInput::Values(input), cfg, env).await }
    };
    run("t", json!({"messages": history}))
        .await
        .expect("first turn");
    let t = Instant::now();
    let tuple = saver.get_tuple("t", "", None).await.expect("get");
    println!("get_tuple: {:?}", t.elapsed());
    let state = tuple
        .map(|t| t.checkpoint.channel_values)
        .unwrap_or_default();
    let v = serde_json::to_value(&state).unwrap_or(Value::Null);
    let t = Instant::now();
    let d = rhai::serde::to_dynamic(&v);
    println!("to_dynamic of the state: {:?} ({})", t.elapsed(), d.is_ok());
    for i in 0..5 {
        let t = Instant::now();
        run(
            "t",
            json!({"messages": [{"role": "user", "content": "again"}]}),
        )
        .await
        .expect("turn");
        println!("turn {i}: {:?}", t.elapsed());
    }
}
