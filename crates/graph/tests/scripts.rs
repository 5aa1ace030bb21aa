//! The script host API and the node kinds of graph files.

mod common;

use std::sync::Arc;

use common::{texts, Harness};
use serde_json::{json, Value};
use spindle_graph::spec::{load_str, Format};
use spindle_graph::store::{InMemoryStore, Store};
use spindle_graph::{RunConfig, RunEnv, RunInput, StreamMode};

fn graph(yaml: &str) -> Arc<spindle_graph::Graph> {
    Arc::new(load_str(yaml, "t.yaml", "t", Format::Yaml).unwrap_or_else(|e| panic!("{e}")))
}

#[tokio::test]
async fn scripts_see_config_context_and_reach_the_store() {
    let g = graph(
        r#"
state: {out: any, found: any}
nodes:
  a:
    kind: script
    code: |
      store_put(["users", config.configurable.user], "prefs", #{ color: context.color });
      let got = store_get(["users", config.configurable.user], "prefs");
      let hits = store_search(["users"], #{ color: "red" }, 10);
      #{ out: got.color + "/" + config.configurable.user, found: hits.len() }
edges:
  - {from: START, to: a}
"#,
    );
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::default());
    let cfg = RunConfig {
        config: json!({"configurable": {"user": "ann"}}),
        context: json!({"color": "red"}),
        ..Default::default()
    };
    let env = RunEnv {
        store: Some(store.clone()),
        ..Default::default()
    };
    let out = spindle_graph::pregel::run(&g, RunInput::Values(json!({})), cfg, env)
        .await
        .unwrap();
    assert_eq!(out.values, json!({"out": "red/ann", "found": 1}));
    let saved = store
        .get(&["users".into(), "ann".into()], "prefs")
        .await
        .unwrap();
    assert_eq!(saved, Some(json!({"color": "red"})));
}

#[tokio::test]
async fn scripts_raise_named_errors_and_runtime_errors_are_script_errors() {
    let g = graph("nodes:\n  a: {kind: script, code: 'raise(\"PermissionError\", \"nope\")'}\nedges:\n  - {from: START, to: a}\n");
    let (out, _) = Harness::new()
        .run(&g, None, RunInput::Values(json!({})), &[], |_| {})
        .await;
    let e = out.unwrap_err();
    assert_eq!(
        (e.class(), e.message().as_str(), e.location()),
        (
            "PermissionError",
            "nope",
            Some("graph 't', node 'a': line 2, column 28 of t.yaml")
        )
    );

    let g = graph("nodes:\n  a: {kind: script, code: 'let x = 1; x.no_such_method()'}\nedges:\n  - {from: START, to: a}\n");
    let (out, _) = Harness::new()
        .run(&g, None, RunInput::Values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap_err().class(), "ScriptError");
}

#[tokio::test]
async fn runaway_scripts_are_stopped() {
    let g =
        graph("nodes:\n  a: {kind: script, code: 'loop { }'}\nedges:\n  - {from: START, to: a}\n");
    let (out, _) = Harness::new()
        .run(&g, None, RunInput::Values(json!({})), &[], |_| {})
        .await;
    let e = out.unwrap_err();
    assert_eq!(e.class(), "ScriptError");
    assert!(e.message().contains("operation limit"), "{}", e.message());
}

#[tokio::test]
async fn scripts_return_commands_with_goto() {
    let g = graph(
        r#"
state: {log: append}
nodes:
  a: {kind: script, code: 'command(#{ log: "a" }, "c")'}
  b: {kind: script, code: '#{ log: "b" }'}
  c: {kind: script, code: '#{ log: "c" }'}
edges:
  - {from: START, to: a}
"#,
    );
    let (out, _) = Harness::new()
        .run(&g, None, RunInput::Values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values["log"], json!(["a", "c"]));
}

#[tokio::test]
async fn routes_with_path_maps_and_custom_reducers() {
    let g = graph(
        r#"
state:
  n: {type: integer, default: 0}
  best: {reducer: script, code: "if current == () || update > current { update } else { current }"}
nodes:
  inc: {kind: script, code: '#{ n: state.n + 1, best: state.n * 10 }'}
edges:
  - {from: START, to: inc}
  - from: inc
    route: {code: 'if state.n < 3 { "again" } else { "stop" }', path_map: {again: inc, stop: END}}
"#,
    );
    let (out, _) = Harness::new()
        .run(&g, None, RunInput::Values(json!({})), &[], |_| {})
        .await;
    assert_eq!(out.unwrap().values, json!({"n": 3, "best": 20}));
}

#[tokio::test]
async fn interrupt_nodes_write_the_resume_value() {
    let g = graph(
        r#"
state: {answer: string}
nodes:
  ask: {kind: interrupt, payload: {question: "name?"}, write_to: answer}
edges:
  - {from: START, to: ask}
"#,
    );
    let h = Harness::new();
    let (out, _) = h
        .run(&g, Some("t"), RunInput::Values(json!({})), &[], |_| {})
        .await;
    assert_eq!(
        out.unwrap().interrupts[0].value,
        json!({"question": "name?"})
    );
    let (out, _) = h
        .run(
            &g,
            Some("t"),
            RunInput::Command {
                resume: Some(json!("Ann")),
                update: None,
                goto: vec![],
            },
            &[],
            |_| {},
        )
        .await;
    assert_eq!(out.unwrap().values, json!({"answer": "Ann"}));
}

#[tokio::test]
async fn agent_shorthand_runs_the_model_tools_loop_as_a_subgraph() {
    let g = graph(
        r#"
state: {messages: messages}
models:
  m:
    provider: scripted
    responses:
      - {content: "", tool_calls: [{name: echo, args: {text: hey}, id: t1}]}
      - "all done"
tools:
  echo: {kind: script, code: "args.text"}
nodes:
  helper: {kind: agent, model: m, tools: [echo]}
edges:
  - {from: START, to: helper}
"#,
    );
    assert_eq!(g.subgraphs().len(), 1);
    let (out, events) = Harness::new()
        .run(
            &g,
            Some("t"),
            RunInput::Values(json!({"messages": ["go"]})),
            &[StreamMode::Updates],
            |c| c.stream_subgraphs = true,
        )
        .await;
    assert_eq!(texts(&out.unwrap().values), ["go", "", "hey", "all done"]);
    assert!(events
        .iter()
        .any(|e| e.event_name().starts_with("updates|helper:")));
}

#[tokio::test]
async fn scripts_call_declared_models() {
    let g = graph(
        r#"
state: {messages: messages}
models:
  m: {provider: scripted, responses: ["from the model"]}
nodes:
  a: {kind: script, code: 'let reply = call_model("m", state.messages); #{ messages: [reply] }'}
edges:
  - {from: START, to: a}
"#,
    );
    let (out, _) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": ["hi"]})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(texts(&out.unwrap().values), ["hi", "from the model"]);
}

#[tokio::test]
async fn subgraph_input_and_output_maps() {
    let g = graph(
        r#"
state: {question: string, answer: string}
graphs:
  inner:
    state: {q: string, a: string}
    nodes:
      solve: {kind: script, code: '#{ a: "re: " + state.q }'}
    edges:
      - {from: START, to: solve}
nodes:
  sub: {kind: subgraph, graph: inner, input: {q: question}, output: {answer: a}}
edges:
  - {from: START, to: sub}
"#,
    );
    let (out, _) = Harness::new()
        .run(
            &g,
            Some("t"),
            RunInput::Values(json!({"question": "why"})),
            &[],
            |_| {},
        )
        .await;
    assert_eq!(
        out.unwrap().values,
        json!({"question": "why", "answer": "re: why"})
    );
}

#[test]
fn schemas_carry_enums_defaults_and_declared_config() {
    let g = graph(
        r#"
state:
  mood: {type: string, enum: [happy, sad], default: happy}
input: [mood]
output: [mood]
config: {schema: {type: object, properties: {model: {type: string}}}, default: {model: small}}
context: {schema: {type: object, properties: {user: {type: string}}}, default: {user: anon}}
nodes:
  a: {kind: script, code: "()"}
edges:
  - {from: START, to: a}
"#,
    );
    let s = g.schemas();
    assert_eq!(
        s.state_schema["properties"]["mood"],
        json!({"default": "happy", "enum": ["happy", "sad"], "title": "Mood", "type": "string"})
    );
    assert_eq!(s.input_schema["title"], "t_input");
    assert_eq!(s.config_schema["properties"]["model"]["type"], "string");
    assert_eq!(
        g.default_config(),
        json!({"configurable": {"model": "small"}})
    );
    assert_eq!(g.default_context(), json!({"user": "anon"}));
    let _: Value = s.context_schema;
}

#[tokio::test]
async fn bad_tool_arguments_become_error_messages() {
    let g = graph(
        r#"
state: {messages: messages}
models:
  m:
    provider: scripted
    responses:
      - {content: "", tool_calls: [{name: add, args: {a: "two"}, id: t1}]}
      - "sorry"
tools:
  add:
    kind: script
    parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}, required: [a, b]}
    code: "args.a + args.b"
nodes:
  model: {kind: model, model: m, tools: [add]}
  tools: {kind: tools, tools: [add]}
edges:
  - {from: START, to: model}
  - {from: model, route: tools_condition, to: [tools, END]}
  - {from: tools, to: model}
"#,
    );
    let (out, _) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": ["hi"]})),
            &[],
            |_| {},
        )
        .await;
    let v = out.unwrap().values;
    let tool = &v["messages"][2];
    assert_eq!(tool["status"], "error");
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("missing required argument `b`"),
        "{tool}"
    );
    assert_eq!(texts(&v).last().unwrap(), "sorry");
}

#[tokio::test]
async fn custom_events_of_inline_scripts_survive_a_small_sink() {
    // A sink with room for one event, read only after the run: nothing may be dropped.
    let g = graph("nodes:\n  a: {kind: script, code: 'for i in 0..5 { emit(#{ i: i }) }'}\nedges:\n  - {from: START, to: a}\n");
    let (tx, mut rx) = tokio::sync::mpsc::channel::<spindle_graph::StreamEvent>(1);
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(e) = rx.recv().await {
            got.push(e.data);
        }
        got
    });
    let cfg = RunConfig {
        stream_modes: vec![StreamMode::Custom],
        ..Default::default()
    };
    let env = RunEnv {
        sink: Some(tx.into()),
        ..Default::default()
    };
    spindle_graph::pregel::run(&g, RunInput::Values(json!({})), cfg, env)
        .await
        .unwrap();
    let got = reader.await.unwrap();
    assert_eq!(got, (0..5).map(|i| json!({"i": i})).collect::<Vec<_>>());
}

/// The `tools` mode announces a tool as it starts and as it ends: what the tool itself
/// streams comes between the two, and a failing tool ends with `tool-error` and its message.
#[tokio::test]
async fn tools_are_announced_as_they_start_and_end() {
    let g = graph(
        r#"
state: {messages: messages}
models:
  m:
    provider: scripted
    responses:
      - {content: "", tool_calls: [{name: shout, args: {text: hey}, id: t1}]}
      - {content: "", tool_calls: [{name: shout, args: {}, id: t2}]}
      - "done"
tools:
  shout:
    kind: script
    parameters: {type: object, properties: {text: {type: string}}, required: [text]}
    code: |
      emit("inside");
      args.text
nodes:
  model: {kind: model, model: m, tools: [shout]}
  tools: {kind: tools, tools: [shout]}
edges:
  - {from: START, to: model}
  - {from: model, route: tools_condition, to: [tools, END]}
  - {from: tools, to: model}
"#,
    );
    let (out, events) = Harness::new()
        .run(
            &g,
            None,
            RunInput::Values(json!({"messages": ["hi"]})),
            &[StreamMode::Tools, StreamMode::Custom],
            |_| {},
        )
        .await;
    out.unwrap();
    let seen: Vec<(String, Value)> = events
        .iter()
        .map(|e| (e.event_name(), e.data.clone()))
        .collect();
    let names: Vec<&str> = seen
        .iter()
        .map(|(name, data)| data["event"].as_str().unwrap_or(name))
        .collect();
    assert_eq!(
        names,
        [
            "tool-started",
            "custom",
            "tool-finished",
            "tool-started",
            "tool-error"
        ],
        "{seen:?}"
    );
    assert_eq!(
        seen[0].1,
        json!({"event": "tool-started", "tool_call_id": "t1", "tool_name": "shout",
               "input": {"text": "hey"}})
    );
    assert_eq!(seen[2].1["output"]["content"], "hey");
    assert_eq!(seen[2].1["output"]["tool_call_id"], "t1");
    let error = &seen[4].1;
    assert_eq!(error["tool_call_id"], "t2");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("missing required argument `text`"),
        "{error}"
    );
}
