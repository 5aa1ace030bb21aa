//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use serde_json::{json, Map, Value};
use spindle_graph::checkpoint::InMemoryCheckpointer;
use spindle_graph::{
    examples, Graph, RunConfig, RunEnv, RunError, RunInput, RunOutcome, StreamEvent, StreamMode,
};
use tokio::sync::mpsc;

/// A graph file's graph from its YAML text (named `t`, from `t.yaml`).
pub fn graph_from_yaml(yaml: &str) -> Arc<Graph> {
    let g = spindle_graph::spec::load_str(yaml, "t.yaml", "t", spindle_graph::spec::Format::Yaml);
    Arc::new(g.unwrap_or_else(|e| panic!("{e}")))
}

/// A run's input of one human message.
pub fn human_input(text: &str) -> RunInput {
    RunInput::Values(json!({"messages": [{"type": "human", "content": text}]}))
}

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
            sink: Some(tx.into()),
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

pub fn is_id(s: &str) -> bool {
    let hex = |c: char| c.is_ascii_hexdigit();
    (s.len() == 36
        && s.chars().filter(|c| *c == '-').count() == 4
        && s.chars().all(|c| hex(c) || c == '-'))
        || (s.len() == 32 && s.chars().all(hex))
        || s.starts_with("lc_run--")
        || s.starts_with("run-")
}

pub fn is_timestamp(s: &str) -> bool {
    s.len() >= 25 && s.as_bytes()[4] == b'-' && s.as_bytes()[10] == b'T' && s.ends_with("+00:00")
}

pub fn norm_str(s: &str) -> String {
    if is_id(s) {
        return "<id>".into();
    }
    if is_timestamp(s) {
        return "<ts>".into();
    }
    // Namespaces: `child:<task id>`.
    s.split('|')
        .map(|part| match part.split_once(':') {
            Some((a, b)) if is_id(b) => format!("{a}:<id>"),
            _ => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// A payload with ids and timestamps replaced by placeholders; references to checkpoints
/// (whose contents the server adds) only kept as present or absent.
pub fn norm(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(norm_str(s)),
        Value::Array(a) => Value::Array(a.iter().map(norm).collect()),
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                let v = match k.as_str() {
                    // Who added these is the server's business: compare presence only.
                    "config" | "parent_config" | "checkpoint" | "parent_checkpoint" => {
                        json!(if v.is_null() { "null" } else { "<ref>" })
                    }
                    _ => norm(v),
                };
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}
