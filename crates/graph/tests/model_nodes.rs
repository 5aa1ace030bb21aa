//! Model nodes that read the run: a system prompt filled from the run's context and config
//! (`{system_time}` included), and a model chosen per run (`model: "{model}"`), as LangGraph's
//! templates do with `runtime.context`.

mod common;

use std::sync::Arc;

use common::{texts, Harness};
use serde_json::{json, Value};
use spindle_graph::spec::{load_str, Format};
use spindle_graph::{RunInput, StreamMode};

const GRAPH: &str = r#"
state: {messages: messages}
context:
  schema: {type: object, properties: {model: {type: string, enum: [fast, smart]}}}
  default: {model: fast}
models:
  fast: {provider: scripted, responses: ["fast answer"]}
  smart: {provider: scripted, responses: ["smart answer"]}
nodes:
  answer:
    kind: model
    model: "{model}"
    system: "You help {user_name}. It is {system_time}. Reply as {\"text\": ...}."
edges:
  - {from: __start__, to: answer}
  - {from: answer, to: __end__}
"#;

fn graph() -> Arc<spindle_graph::Graph> {
    Arc::new(load_str(GRAPH, "t.yaml", "t", Format::Yaml).unwrap_or_else(|e| panic!("{e}")))
}

fn hello() -> RunInput {
    RunInput::Values(json!({"messages": [{"type": "human", "content": "hi"}]}))
}

/// The system prompt the model was called with, from the `events` stream.
fn system_prompt_sent(events: &[spindle_graph::StreamEvent]) -> String {
    let start = events
        .iter()
        .find(|e| e.data["event"] == "on_chat_model_start")
        .expect("the model's start event");
    let first = &start.data["data"]["input"]["messages"][0][0];
    assert_eq!(first["type"], "system", "{first}");
    first["content"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn each_run_chooses_its_model_from_its_context() {
    let g = graph();
    for (context, reply) in [
        (
            json!({"model": "smart", "user_name": "Ada"}),
            "smart answer",
        ),
        (json!({"model": "fast", "user_name": "Ada"}), "fast answer"),
    ] {
        let (out, _) = Harness::new()
            .run(&g, None, hello(), &[], |c| c.context = context.clone())
            .await;
        let values = out.unwrap().values;
        assert_eq!(texts(&values).last().unwrap(), reply, "{context}");
    }
}

#[tokio::test]
async fn the_system_prompt_is_filled_from_the_run() {
    let (out, events) = Harness::new()
        .run(&graph(), None, hello(), &[StreamMode::Events], |c| {
            c.context = json!({"model": "fast"});
            c.config = json!({"configurable": {"user_name": "Ada"}});
        })
        .await;
    out.unwrap();
    let prompt = system_prompt_sent(&events);
    let time = prompt
        .strip_prefix("You help Ada. It is ")
        .and_then(|rest| rest.strip_suffix(". Reply as {\"text\": ...}."))
        .unwrap_or_else(|| panic!("{prompt}"));
    chrono::DateTime::parse_from_rfc3339(time).unwrap_or_else(|e| panic!("{time}: {e}"));
    // The prompt is sent, not stored.
    let stored: Vec<Value> = out_messages(&events);
    assert!(!stored.is_empty());
    assert!(stored.iter().all(|m| m["type"] != "system"));
}

fn out_messages(events: &[spindle_graph::StreamEvent]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.data["event"] == "on_chain_end")
        .filter_map(|e| e.data["data"]["output"]["messages"].as_array().cloned())
        .flatten()
        .collect()
}

#[tokio::test]
async fn a_missing_value_or_an_undeclared_model_is_named() {
    let g = graph();
    let (out, _) = Harness::new()
        .run(&g, None, hello(), &[], |c| {
            c.context = json!({"model": "fast"})
        })
        .await;
    let err = out.unwrap_err().to_string();
    assert!(
        err.contains("KeyError") && err.contains("{user_name}"),
        "{err}"
    );

    let (out, _) = Harness::new()
        .run(&g, None, hello(), &[], |c| {
            c.context = json!({"model": "huge", "user_name": "Ada"})
        })
        .await;
    let err = out.unwrap_err().to_string();
    assert!(
        err.contains("`huge`") && err.contains("fast, smart"),
        "{err}"
    );
}

#[test]
fn a_per_run_model_needs_declared_models() {
    let yaml = "state: {messages: messages}\nnodes:\n  a: {kind: model, model: \"{model}\"}\nedges:\n  - {from: START, to: a}\n";
    let err = load_str(yaml, "t.yaml", "t", Format::Yaml).unwrap_err();
    assert_eq!(err.place, "nodes.a.model");
    assert!(err.message.contains("none is declared"), "{err}");
}

#[tokio::test]
async fn a_scripted_model_takes_its_time_when_nobody_streams_it() {
    let yaml = r#"
state: {messages: messages}
models:
  slow: {provider: scripted, chunk: word, delay_ms: 40, responses: ["one two three"]}
nodes:
  answer: {kind: model, model: slow}
edges:
  - {from: START, to: answer}
"#;
    let g = Arc::new(load_str(yaml, "t.yaml", "t", Format::Yaml).unwrap());
    let started = std::time::Instant::now();
    let (out, _) = Harness::new().run(&g, None, hello(), &[], |_| {}).await;
    // Five chunks ("one", " ", "two", " ", "three") of 40 ms each, as when streamed.
    assert!(started.elapsed() >= std::time::Duration::from_millis(200));
    assert_eq!(texts(&out.unwrap().values).last().unwrap(), "one two three");
}
