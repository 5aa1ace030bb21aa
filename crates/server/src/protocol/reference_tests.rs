//! The thread event stream of v2 runs compared with what the reference server sent for the
//! Python twins (`crates/graph/tests/fixtures/ref/protocol_v2.json`, from
//! `capture_protocol_v2.py`): each graph runs through the engine, the write side
//! ([`Normalizer`]) and the read side ([`envelope`]), as a `run.start` run does.
//!
//! Compared: `custom`, `updates`, a subgraph's `lifecycle` and `input.requested`, in order,
//! with ids normalised and messages reduced to `(type, content)`. Left out: the root lifecycle
//! (the worker logs it, not the write side), values (the reference trims messages to the
//! protocol's shape), tasks and checkpoints (the reference's transformers keep them off its
//! wire), and the reference's empty `updates` for an interrupt.

use spindle_storage::ResourceId;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use spindle_graph::checkpoint::InMemoryCheckpointer;
use spindle_graph::pregel::{parse_stream_modes, RunConfig, RunEnv};
use spindle_graph::{Graph, RunInput};
use spindle_storage::LoggedEvent;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::envelope::{envelope, Filter};
use super::normalize::Normalizer;
use super::V2_STREAM_MODES;

fn fixture(key: &str) -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../graph/tests/fixtures/ref/protocol_v2.json"
    );
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture"))
        .expect("fixture json");
    all[key].as_array().expect("fixture key").clone()
}

fn example(id: &str) -> Arc<Graph> {
    Arc::new(spindle_graph::examples::get(id).unwrap().unwrap())
}

/// The custom writer twin: one node writes a named dict, an unnamed one and a string.
fn writer() -> Arc<Graph> {
    let yaml = r##"
state: {ticks: integer}
nodes:
  a:
    kind: script
    code: |
      emit(#{ name: "progress", pct: 50 });
      emit(#{ tick: "a" });
      emit("plain");
      #{ ticks: (state.ticks ?? 0) + 1 }
edges:
  - {from: __start__, to: a}
  - {from: a, to: __end__}
"##;
    let format = spindle_graph::spec::Format::Yaml;
    Arc::new(spindle_graph::spec::load_str(yaml, "writer.yaml", "writer", format).unwrap())
}

/// The envelopes a v2 run of `graph` logs, in order.
async fn ours(graph: &Arc<Graph>, input: Value) -> Vec<Value> {
    let names: Vec<String> = V2_STREAM_MODES.iter().map(|m| m.to_string()).collect();
    let (tx, mut rx) = mpsc::channel(10_000);
    let cfg = RunConfig {
        thread_id: Some(Uuid::new_v4().to_string()),
        stream_modes: parse_stream_modes(&names).unwrap(),
        stream_subgraphs: true,
        ..Default::default()
    };
    let env = RunEnv {
        checkpointer: Some(Arc::new(InMemoryCheckpointer::new())),
        sink: Some(tx.into()),
        ..Default::default()
    };
    spindle_graph::pregel::run(graph, RunInput::Values(input), cfg, env)
        .await
        .unwrap();
    let mut normalizer = Normalizer::default();
    let mut logged = Vec::new();
    while let Ok(event) = rx.try_recv() {
        logged.extend(normalizer.push(event));
    }
    logged.extend(normalizer.finish(None));
    logged
        .into_iter()
        .enumerate()
        .filter_map(|(i, (event, data))| {
            let logged = LoggedEvent {
                thread_id: ResourceId::from(Uuid::nil()),
                seq: i as i64 + 1,
                run_id: Uuid::nil(),
                event,
                data,
                created_at: chrono::Utc::now(),
            };
            envelope(&logged, false)
        })
        .collect()
}

/// What is compared of an envelope, or nothing for what is left out.
fn view(envelope: &Value) -> Option<Value> {
    let method = envelope["method"].as_str()?;
    let ns = &envelope["params"]["namespace"];
    let data = &envelope["params"]["data"];
    let kept = match method {
        "custom" | "input.requested" => true,
        "updates" => data.as_object().is_some_and(|d| !d.is_empty()),
        "lifecycle" => ns.as_array().is_some_and(|n| !n.is_empty()),
        _ => false,
    };
    kept.then(|| json!([method, norm(ns), norm(data)]))
}

fn views(envelopes: &[Value]) -> Vec<Value> {
    envelopes.iter().filter_map(view).collect()
}

/// Ids become `ID` (also after a namespace segment's `:`); messages become `[type, content]`.
fn norm(v: &Value) -> Value {
    match v {
        Value::String(s) => match s.split_once(':') {
            Some((name, id)) if is_id(id) => json!(format!("{name}:ID")),
            _ if is_id(s) => json!("ID"),
            _ => v.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(norm).collect()),
        Value::Object(o) if o.contains_key("type") && o.contains_key("content") => {
            json!([o["type"], o["content"]])
        }
        Value::Object(o) => {
            let out: Map<String, Value> = o.iter().map(|(k, v)| (k.clone(), norm(v))).collect();
            Value::Object(out)
        }
        _ => v.clone(),
    }
}

fn is_id(s: &str) -> bool {
    let hex = |c: char| c.is_ascii_hexdigit() || c == '-';
    (s.len() == 36 || s.len() == 32) && s.chars().all(hex)
}

fn assert_same(label: &str, ours: &[Value], theirs: &[Value]) {
    assert_eq!(
        ours,
        theirs,
        "{label}\nours: {}\nref:  {}",
        Value::Array(ours.to_vec()),
        Value::Array(theirs.to_vec())
    );
}

#[tokio::test]
async fn custom_events_match_the_reference() {
    let got = ours(&writer(), json!({})).await;
    assert_same("custom", &views(&got), &views(&fixture("custom_v2")));
    let progress = Filter {
        channels: ["custom:progress".to_string()].into(),
        ..Filter::default()
    };
    let selected: Vec<Value> = got.into_iter().filter(|e| progress.matches(e)).collect();
    let theirs: Vec<Value> = fixture("custom_v2/custom:progress")
        .into_iter()
        .filter(|e| e["method"] == "custom")
        .collect();
    assert_same("custom:progress", &views(&selected), &views(&theirs));
}

#[tokio::test]
async fn a_subgraphs_lifecycle_and_updates_match_the_reference() {
    let input = json!({"messages": [{"role": "user", "content": "hi"}]});
    let got = ours(&example("nested"), input).await;
    assert_same("nested", &views(&got), &views(&fixture("nested_v2")));
}

#[tokio::test]
async fn input_requested_matches_the_reference_and_adds_value() {
    let input = json!({"messages": [{"role": "user", "content": "go"}]});
    let got = ours(&example("approval"), input).await;
    let asked: Vec<&Value> = got
        .iter()
        .filter(|e| e["method"] == "input.requested")
        .collect();
    assert_eq!(asked.len(), 1);
    let data = &asked[0]["params"]["data"];
    assert_eq!(
        data["value"], data["payload"],
        "the Python client reads `value`"
    );
    let without_value: Vec<Value> = got
        .iter()
        .cloned()
        .map(|mut e| {
            let asked = e["method"] == "input.requested";
            if let Some(d) = e["params"]["data"].as_object_mut().filter(|_| asked) {
                d.remove("value");
            }
            e
        })
        .collect();
    assert_same(
        "approval",
        &views(&without_value),
        &views(&fixture("approval_v2")),
    );
}
