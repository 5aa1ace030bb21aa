//! What scripts reach beyond their state: a model whose tokens stream as a model node's do,
//! a declared tool, the clock, the steps left (LangGraph's `RemainingSteps` and `IsLastStep`)
//! and the node names `START` and `END`.

mod common;

use common::{graph_from_yaml, human_input, texts, Harness};
use serde_json::{json, Value};
use spindle_graph::{RunError, RunInput, StreamMode};

const CALLS: &str = r#"
state: {messages: messages, total: any, quiet: string}
models:
  m: {provider: scripted, responses: ["three words here"], chunk: word}
tools:
  add:
    kind: script
    description: Adds two numbers.
    parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}, required: [a, b]}
    code: 'args.a + args.b'
nodes:
  think:
    kind: script
    code: |
      let reply = call_model("m", state.messages);
      let total = call_tool("add", #{a: 1, b: 2});
      #{messages: [reply], total: total}
edges:
  - {from: __start__, to: think}
  - {from: think, to: __end__}
"#;

#[tokio::test]
async fn a_script_streams_its_model_calls_tokens_and_calls_a_tool() {
    let modes = [StreamMode::Messages, StreamMode::Tools];
    let (out, events) = Harness::new()
        .run(
            &graph_from_yaml(CALLS),
            None,
            human_input("hi"),
            &modes,
            |_| {},
        )
        .await;
    let values = out.unwrap().values;
    assert_eq!(texts(&values), ["hi", "three words here"]);
    assert_eq!(values["total"], "3");
    let tokens: Vec<&Value> = events
        .iter()
        .filter(|e| e.mode == StreamMode::Messages)
        .map(|e| &e.data[0]["content"])
        .collect();
    assert_eq!(
        tokens,
        ["three", " ", "words", " ", "here"],
        "one messages event per token, from the node `think`"
    );
    let meta = &events
        .iter()
        .find(|e| e.mode == StreamMode::Messages)
        .unwrap()
        .data[1];
    assert_eq!(meta["langgraph_node"], "think");
    let tool_events: Vec<&Value> = events
        .iter()
        .filter(|e| e.mode == StreamMode::Tools)
        .map(|e| &e.data["event"])
        .collect();
    assert_eq!(tool_events, ["tool-started", "tool-finished"]);
}

#[tokio::test]
async fn a_script_can_call_a_model_without_streaming_it() {
    let yaml = CALLS.replace(
        r#"call_model("m", state.messages)"#,
        r#"call_model("m", state.messages, #{stream: false})"#,
    );
    let (out, events) = Harness::new()
        .run(
            &graph_from_yaml(&yaml),
            None,
            human_input("hi"),
            &[StreamMode::Messages],
            |_| {},
        )
        .await;
    out.unwrap();
    let chunks = events
        .iter()
        .filter(|e| e.mode == StreamMode::Messages)
        .filter(|e| e.data[0]["type"] == "AIMessageChunk")
        .count();
    assert_eq!(chunks, 0, "{events:?}");
}

#[tokio::test]
async fn a_failing_tool_call_can_be_caught_by_the_script() {
    let yaml = r#"
state: {result: string}
tools:
  picky:
    kind: script
    parameters: {type: object, properties: {n: {type: integer}}, required: [n]}
    code: 'args.n'
nodes:
  a:
    kind: script
    code: |
      let result = "";
      try { result = call_tool("picky", #{}); } catch (e) { result = "caught: " + e.error; }
      #{result: result}
edges:
  - {from: __start__, to: a}
"#;
    let (out, _) = Harness::new()
        .run(
            &graph_from_yaml(yaml),
            None,
            RunInput::Values(json!({})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(out.unwrap().values["result"], "caught: ToolException");
}

#[tokio::test]
async fn an_unknown_tool_fails_the_node_naming_the_declared_ones() {
    let yaml = CALLS.replace(r#"call_tool("add""#, r#"call_tool("ad""#);
    let (out, _) = Harness::new()
        .run(
            &graph_from_yaml(&yaml),
            None,
            human_input("hi"),
            &[],
            |_| {},
        )
        .await;
    let err = out.unwrap_err().to_string();
    assert!(err.contains("unknown tool `ad`; declared: add"), "{err}");
}

#[tokio::test]
async fn scripts_read_the_clock() {
    let yaml = r#"
state: {at: string, ms: integer}
nodes:
  a: {kind: script, code: '#{at: now(), ms: now_ms()}'}
edges:
  - {from: __start__, to: a}
"#;
    let before = chrono::Utc::now().timestamp_millis();
    let (out, _) = Harness::new()
        .run(
            &graph_from_yaml(yaml),
            None,
            RunInput::Values(json!({})),
            &[],
            |_| {},
        )
        .await;
    let values = out.unwrap().values;
    let ms = values["ms"].as_i64().unwrap();
    assert!(ms >= before && ms - before < 10_000, "{ms} vs {before}");
    let at = chrono::DateTime::parse_from_rfc3339(values["at"].as_str().unwrap()).unwrap();
    assert!((at.timestamp_millis() - ms).abs() < 10_000);
    assert!(values["at"].as_str().unwrap().ends_with('Z'));
}

const COUNTDOWN: &str = r#"
state: {left: append}
nodes:
  step: {kind: script, code: '#{left: [remaining_steps]}'}
edges:
  - {from: __start__, to: step}
  - from: step
    route: 'if is_last_step { END } else { "step" }'
"#;

#[tokio::test]
async fn a_loop_sees_the_steps_left_and_stops_on_the_last_one() {
    let (out, _) = Harness::new()
        .run(
            &graph_from_yaml(COUNTDOWN),
            None,
            RunInput::Values(json!({})),
            &[],
            |c| c.recursion_limit = 4,
        )
        .await;
    assert_eq!(out.unwrap().values["left"], json!([4, 3, 2, 1]));
}

#[tokio::test]
async fn a_loop_that_ignores_the_steps_left_hits_the_limit() {
    let yaml = COUNTDOWN.replace("if is_last_step { END } else { \"step\" }", "\"step\"");
    let (out, _) = Harness::new()
        .run(
            &graph_from_yaml(&yaml),
            None,
            RunInput::Values(json!({})),
            &[],
            |c| c.recursion_limit = 4,
        )
        .await;
    assert!(matches!(out, Err(RunError::Recursion(4))), "{out:?}");
}

#[tokio::test]
async fn start_and_end_name_the_graphs_ends() {
    let yaml = r#"
state: {seen: string}
nodes:
  a: {kind: script, code: '#{seen: START + " " + END}'}
edges:
  - {from: __start__, to: a}
  - {from: a, route: 'END'}
"#;
    let (out, _) = Harness::new()
        .run(
            &graph_from_yaml(yaml),
            None,
            RunInput::Values(json!({})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(out.unwrap().values["seen"], "__start__ __end__");
}
