//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use serde_json::Value;
use spindle_graph::checkpoint::InMemoryCheckpointer;
use spindle_graph::{
    examples, Graph, RunConfig, RunEnv, RunError, RunInput, RunOutcome, StreamEvent, StreamMode,
};
use tokio::sync::mpsc;

pub fn example(id: &str) -> Arc<Graph> {
    Arc::new(
        examples::get(id)
            .expect("known example")
            .expect("example compiles"),
    )
}

pub struct Harness {
    pub saver: Arc<InMemoryCheckpointer>,
}

impl Harness {
    pub fn new() -> Self {
        Harness {
            saver: Arc::new(InMemoryCheckpointer::new()),
        }
    }

    pub async fn run(
        &self,
        graph: &Arc<Graph>,
        thread: Option<&str>,
        input: RunInput,
        modes: &[StreamMode],
        tweak: impl FnOnce(&mut RunConfig),
    ) -> (Result<RunOutcome, RunError>, Vec<StreamEvent>) {
        let (tx, mut rx) = mpsc::channel(10_000);
        let mut cfg = RunConfig {
            thread_id: thread.map(str::to_string),
            stream_modes: modes.to_vec(),
            ..Default::default()
        };
        tweak(&mut cfg);
        let env = RunEnv {
            checkpointer: Some(self.saver.clone()),
            sink: Some(tx),
            ..Default::default()
        };
        let out = spindle_graph::pregel::run(graph, input, cfg, env).await;
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        (out, events)
    }
}

pub fn texts(values: &Value) -> Vec<String> {
    values["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|x| x["content"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}
