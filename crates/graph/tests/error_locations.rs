//! A run's error says where it happened: the graph, the node (or route, reducer, tool) and,
//! for scripts, the line and column in the graph file.

use std::sync::Arc;

use serde_json::json;
use spindle_graph::spec::{load_str, Format};
use spindle_graph::{RunConfig, RunEnv, RunError, RunInput};

fn graph(yaml: &str) -> Arc<spindle_graph::Graph> {
    Arc::new(load_str(yaml, "chain.yaml", "chain", Format::Yaml).unwrap_or_else(|e| panic!("{e}")))
}

async fn run_err(g: &Arc<spindle_graph::Graph>) -> RunError {
    spindle_graph::pregel::run(
        g,
        RunInput::Values(json!({})),
        RunConfig::default(),
        RunEnv::default(),
    )
    .await
    .unwrap_err()
}

const UNIT_HINT: &str = "Hint: a state key that was never written reads as Rhai's unit `()`; \
                         give it a default under `state:` or check `state.key != ()` first";

#[tokio::test]
async fn a_script_node_error_names_graph_node_and_file_line() {
    let g = graph(
        r##"state:
  n: {type: integer, default: 0}
  items: any
nodes:
  step:
    kind: script
    code: |
      let n = state.n;
      #{ n: n + state.items.len() }
edges:
  - {from: START, to: step}
"##,
    );
    let e = run_err(&g).await;
    assert_eq!(e.class(), "ScriptError");
    assert_eq!(e.node(), Some("step"));
    assert_eq!(
        e.message(),
        format!("Function not found: len (()). {UNIT_HINT}")
    );
    assert_eq!(
        e.location(),
        Some("graph 'chain', node 'step': line 9, column 29 of chain.yaml")
    );
}

#[tokio::test]
async fn a_one_line_script_counts_columns_from_its_quote() {
    let g = graph(
        "nodes:\n  step: {kind: script, code: \"let x = 1; x.no_such_method()\"}\nedges:\n  - {from: START, to: step}\n",
    );
    let e = run_err(&g).await;
    // The script starts at column 31 (after the quote); `no_such_method` at its column 14.
    // Not a unit value, so no hint.
    assert_eq!(e.message(), "Function not found: no_such_method (i64)");
    assert_eq!(
        e.location(),
        Some("graph 'chain', node 'step': line 2, column 44 of chain.yaml")
    );
}

#[tokio::test]
async fn a_route_script_error_names_the_route() {
    let g = graph(
        r##"state:
  n: {type: integer, default: 0}
nodes:
  model: {kind: script, code: "#{ n: 1 }"}
edges:
  - {from: START, to: model}
  - from: model
    route: |
      if state.limit.len() > state.n { END } else { "model" }
    to: [model, __end__]
"##,
    );
    let e = run_err(&g).await;
    assert_eq!(e.class(), "ScriptError");
    assert_eq!(
        e.message(),
        format!("Function not found: len (()). {UNIT_HINT}")
    );
    assert_eq!(
        e.location(),
        Some("graph 'chain', route from 'model': line 9, column 22 of chain.yaml")
    );
}

#[tokio::test]
async fn raised_errors_keep_their_class_and_message_and_say_where_beside() {
    let g = graph(
        "nodes:\n  a:\n    kind: script\n    code: |\n      raise(\"PermissionError\", \"nope\")\nedges:\n  - {from: START, to: a}\n",
    );
    let e = run_err(&g).await;
    assert_eq!(e.class(), "PermissionError");
    assert_eq!(e.message(), "nope", "the script's own message, exactly");
    assert_eq!(
        e.location(),
        Some("graph 'chain', node 'a': line 5, column 7 of chain.yaml")
    );
}

#[tokio::test]
async fn a_folded_script_gives_its_own_lines() {
    // A folded scalar joins lines, so the file's lines are not the script's.
    let g = graph(
        "nodes:\n  a:\n    kind: script\n    code: >\n      let x = state.missing;\n      x.len()\nedges:\n  - {from: START, to: a}\n",
    );
    let e = run_err(&g).await;
    let location = e.location().unwrap_or_default();
    assert!(
        location.starts_with("graph 'chain', node 'a': script line 1, column "),
        "{location}"
    );
    assert!(e.message().ends_with(UNIT_HINT), "{}", e.message());
}

#[tokio::test]
async fn a_reducer_error_names_its_key() {
    let g = graph(
        r##"state:
  best: {reducer: script, code: "current.len() + update"}
nodes:
  a: {kind: script, code: "#{ best: 1 }"}
edges:
  - {from: START, to: a}
"##,
    );
    let e = run_err(&g).await;
    assert!(
        e.message().starts_with(
            "graph 'chain': At key 'best': reducer failed: line 2, column 42 of chain.yaml: \
             Function not found: len (())"
        ),
        "{}",
        e.message()
    );
}

#[test]
fn a_syntax_error_at_load_gives_the_file_line_and_column() {
    let e = load_str(
        "nodes:\n  a:\n    kind: script\n    code: |\n      let x = 1;\n      #{ n: x +  }\nedges:\n  - {from: __start__, to: a}\n",
        "g.yaml",
        "g",
        Format::Yaml,
    )
    .unwrap_err();
    assert_eq!(e.line, Some(6));
    assert_eq!(
        e.to_string(),
        "g.yaml:6: at `nodes.a.code`: script does not compile: \
         Unexpected '}' (line 6, column 18 of g.yaml)"
    );
}

#[tokio::test]
async fn a_route_failing_on_an_edited_state_names_itself() {
    let g = graph(
        r##"state:
  items: any
nodes:
  step: {kind: script, code: '#{}'}
edges:
  - {from: __start__, to: step}
  - from: step
    route: 'if state.items.len() > 0 { "step" } else { "__end__" }'
"##,
    );
    let edit = spindle_graph::pregel::NodeUpdate {
        values: json!({}),
        as_node: Some("step".into()),
        goto: Vec::new(),
    };
    let err = spindle_graph::pregel::prepare_update_at(&g, "t", "", None, &[edit])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("graph 'chain', route from 'step': line 8, column 28 of chain.yaml:"),
        "{err}"
    );
    assert!(err.contains(UNIT_HINT), "{err}");
}
