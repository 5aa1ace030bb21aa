//! `then:` after a node of another kind: in the same step a model node also writes other
//! keys, emits custom events, interrupts on a condition or chooses where to go, as a Python
//! node that calls a model and returns a `Command` does.

mod common;

use common::{graph_from_yaml, human_input, texts, Harness};
use serde_json::{json, Value};
use spindle_graph::spec::{load_str, Format};
use spindle_graph::{RunInput, StreamMode};

const MODEL_THEN: &str = r#"
state: {messages: messages, answer: string, checked: boolean}
models:
  m: {provider: scripted, responses: ["ready to go"], model_name: gpt-test}
nodes:
  ask:
    kind: model
    model: m
    then: |
      update.answer = text(reply);
      emit(#{answered: text(reply)});
      if text(reply).starts_with("ready") { command(update, "check") }
  check: {kind: script, code: '#{checked: true}'}
edges:
  - {from: __start__, to: ask}
"#;

#[tokio::test]
async fn a_model_node_writes_other_keys_emits_and_chooses_where_to_go() {
    let (out, events) = Harness::new()
        .run(
            &graph_from_yaml(MODEL_THEN),
            None,
            human_input("hi"),
            &[StreamMode::Custom],
            |_| {},
        )
        .await;
    let values = out.unwrap().values;
    assert_eq!(values["answer"], "ready to go");
    assert_eq!(values["checked"], true, "the goto ran `check`: {values}");
    // The reply still went where a model node's goes, with the model it stood for.
    assert_eq!(texts(&values), ["hi", "ready to go"]);
    let reply = values["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(reply["response_metadata"]["model_name"], "gpt-test");
    let custom: Vec<&Value> = events
        .iter()
        .filter(|e| e.mode == StreamMode::Custom)
        .map(|e| &e.data)
        .collect();
    assert_eq!(custom, [&json!({"answered": "ready to go"})]);
}

const INTERRUPT_THEN: &str = r#"
state: {messages: messages, approved: any}
models:
  m: {provider: scripted, responses: ["delete everything?"]}
nodes:
  propose:
    kind: model
    model: m
    then: |
      if text(reply).ends_with("?") {
        update.approved = interrupt(#{question: text(reply)});
      }
edges:
  - {from: __start__, to: propose}
  - {from: propose, to: __end__}
"#;

#[tokio::test]
async fn a_model_node_interrupts_on_a_condition_and_takes_the_answer() {
    let h = Harness::new();
    let g = graph_from_yaml(INTERRUPT_THEN);
    let (out, _) = h.run(&g, Some("t1"), human_input("hi"), &[], |_| {}).await;
    let out = out.unwrap();
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(
        out.interrupts[0].value,
        json!({"question": "delete everything?"})
    );
    let resume = RunInput::Command {
        resume: Some(json!("no")),
        update: None,
        goto: Vec::new(),
    };
    let (out, _) = h.run(&g, Some("t1"), resume, &[], |_| {}).await;
    let values = out.unwrap().values;
    assert_eq!(values["approved"], "no");
    assert_eq!(texts(&values), ["hi", "delete everything?"]);
}

const TOOLS_THEN: &str = r#"
state: {messages: messages, calls: integer, reported: boolean}
models:
  m: {provider: scripted, responses: [{content: "", tool_calls: [{name: add, args: {a: 1, b: 2}}]}]}
tools:
  add:
    kind: script
    parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}}
    code: 'args.a + args.b'
nodes:
  agent: {kind: model, model: m, tools: [add]}
  tools:
    kind: tools
    tools: [add]
    then: 'update.calls = update.messages.len(); command(update, "report")'
  report: {kind: script, code: '#{reported: true}'}
edges:
  - {from: __start__, to: agent}
  - {from: agent, to: tools}
"#;

#[tokio::test]
async fn a_tools_node_chooses_where_to_go_with_its_update() {
    let (out, _) = Harness::new()
        .run(
            &graph_from_yaml(TOOLS_THEN),
            None,
            human_input("hi"),
            &[],
            |_| {},
        )
        .await;
    let values = out.unwrap().values;
    assert_eq!(values["calls"], 1);
    assert_eq!(values["reported"], true);
    assert_eq!(texts(&values), ["hi", "", "3"]);
}

#[tokio::test]
async fn then_is_refused_on_a_script_node_which_does_it_itself() {
    let yaml = r#"
state: {x: integer}
nodes:
  a: {kind: script, code: '#{x: 1}', then: '()'}
edges:
  - {from: __start__, to: a}
"#;
    let err = load_str(yaml, "t.yaml", "t", Format::Yaml).unwrap_err();
    assert!(err.to_string().contains("then"), "{err}");
}

#[tokio::test]
async fn an_agent_nodes_then_sees_its_final_reply() {
    let yaml = r#"
state: {messages: messages, final: string}
models:
  m: {provider: scripted, responses: ["all done"]}
nodes:
  helper: {kind: agent, model: m, then: 'update.final = text(reply);'}
edges:
  - {from: __start__, to: helper}
  - {from: helper, to: __end__}
"#;
    let (out, _) = Harness::new()
        .run(&graph_from_yaml(yaml), None, human_input("hi"), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values["final"], "all done");
}

/// Where a `then` (or a script) may go, declared as LangGraph's `add_node(..., destinations=)`
/// declares it, is drawn as LangGraph draws it. The expected edges are what LangGraph 1.x's
/// `get_graph().to_json()` gives for the Python twin:
///
/// ```python
/// b = StateGraph(S)
/// b.add_node("decide", decide, destinations=("zeta", "approve", END))
/// b.add_node("approve", f); b.add_node("zeta", f)
/// b.add_edge(START, "decide"); b.add_edge("decide", END)
/// b.add_edge("approve", END); b.add_edge("zeta", END)
/// ```
#[test]
fn destinations_are_drawn_as_langgraph_draws_a_commands_targets() {
    let yaml = r#"
state: {answer: string}
nodes:
  decide:
    kind: script
    destinations: [zeta, approve, __end__]
    code: 'command(#{answer: "x"}, "zeta")'
  approve: {kind: script, code: '#{answer: "a"}'}
  zeta: {kind: script, code: '#{answer: "z"}'}
edges:
  - {from: __start__, to: decide}
  - {from: decide, to: __end__}
  - {from: approve, to: __end__}
  - {from: zeta, to: __end__}
"#;
    assert_eq!(
        drawn_edges(yaml),
        json!([
            {"source": "__start__", "target": "decide"},
            {"source": "decide", "target": "__end__", "conditional": true},
            {"source": "decide", "target": "approve", "conditional": true},
            {"source": "decide", "target": "zeta", "conditional": true},
            {"source": "approve", "target": "__end__"},
            {"source": "zeta", "target": "__end__"},
        ])
    );
}

#[tokio::test]
async fn destinations_only_draw_a_goto_elsewhere_still_goes_there() {
    let yaml = r#"
state: {messages: messages, answer: string}
models:
  m: {provider: scripted, responses: ["fine"]}
nodes:
  ask:
    kind: model
    model: m
    destinations: [approve]
    then: 'command(update, "other")'
  approve: {kind: script, code: '#{answer: "approved"}'}
  other: {kind: script, code: '#{answer: "other"}'}
edges:
  - {from: __start__, to: ask}
"#;
    let (out, _) = Harness::new()
        .run(&graph_from_yaml(yaml), None, human_input("hi"), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values["answer"], "other");
}

#[test]
fn an_unknown_destination_is_refused_where_it_is_written() {
    let yaml = r#"
state: {x: integer}
nodes:
  a: {kind: script, destinations: [b, nowhere], code: '#{x: 1}'}
  b: {kind: script, code: '#{x: 2}'}
edges:
  - {from: __start__, to: a}
"#;
    let err = load_str(yaml, "t.yaml", "t", Format::Yaml).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("nodes.a.destinations[1]"), "{message}");
    assert!(message.contains("unknown node `nowhere`"), "{message}");
}

/// A node entered (here only by a goto) with no way out ends the run, and is drawn with an edge
/// to `__end__` after the others, by name, as LangGraph 1.x draws the Python twin:
///
/// ```python
/// b.add_node("decide", f, destinations=("zeta", "approve"))
/// b.add_node("approve", f); b.add_node("zeta", f)
/// b.add_edge(START, "decide")
/// ```
#[test]
fn a_node_with_no_way_out_is_drawn_ending_the_run() {
    let yaml = r#"
state: {answer: string}
nodes:
  decide: {kind: script, destinations: [zeta, approve], code: 'command(#{answer: "x"}, "zeta")'}
  approve: {kind: script, code: '#{answer: "a"}'}
  zeta: {kind: script, code: '#{answer: "z"}'}
edges:
  - {from: __start__, to: decide}
"#;
    assert_eq!(
        drawn_edges(yaml),
        json!([
            {"source": "__start__", "target": "decide"},
            {"source": "decide", "target": "approve", "conditional": true},
            {"source": "decide", "target": "zeta", "conditional": true},
            {"source": "approve", "target": "__end__"},
            {"source": "zeta", "target": "__end__"},
        ])
    );
}

/// The edges of a graph file's drawing, as `GET /assistants/{id}/graph` answers them.
fn drawn_edges(yaml: &str) -> Value {
    graph_from_yaml(yaml).drawable(spindle_graph::XRay::Off)["edges"].take()
}
