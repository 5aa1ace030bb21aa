//! Graphs made of graphs at run time: a graph called as a tool (a sub-agent), and a graph
//! whose shape the run chooses (`variants:`, LangGraph's graph factories).

mod common;

use std::sync::Arc;

use common::{graph_from_yaml, human_input, texts, Harness};
use serde_json::{json, Value};
use spindle_graph::spec::{load_str, Format};
use spindle_graph::{Graph, RunError, StreamMode};

const SUPERVISOR: &str = r#"
state: {messages: messages}
graphs:
  researcher:
    state: {messages: messages}
    models:
      r: {provider: scripted, responses: ["Paris has 2.1 million people"]}
    nodes:
      research: {kind: model, model: r}
    edges:
      - {from: __start__, to: research}
      - {from: research, to: __end__}
models:
  boss:
    provider: scripted
    responses:
      - {content: "", tool_calls: [{name: research, args: {request: "population of Paris"}}]}
      - "Done."
tools:
  research:
    kind: graph
    graph: researcher
    description: Ask the research agent.
    parameters: {type: object, properties: {request: {type: string}}, required: [request]}
    input: '#{messages: [human(args.request)]}'
nodes:
  boss: {kind: model, model: boss, tools: [research]}
  tools: {kind: tools, tools: [research]}
edges:
  - {from: __start__, to: boss}
  - {from: boss, route: tools_condition}
  - {from: tools, to: boss}
"#;

#[tokio::test]
async fn a_graph_called_as_a_tool_answers_with_its_last_message() {
    let (out, events) = Harness::new()
        .run(
            &graph_from_yaml(SUPERVISOR),
            Some("t1"),
            human_input("how many people live in Paris?"),
            &[StreamMode::Messages],
            |c| c.stream_subgraphs = true,
        )
        .await;
    let values = out.unwrap().values;
    assert_eq!(
        texts(&values),
        [
            "how many people live in Paris?",
            "",
            "Paris has 2.1 million people",
            "Done."
        ]
    );
    // The sub-agent's tokens stream below the tool call, as a subgraph's do.
    let sub: Vec<&Vec<String>> = events
        .iter()
        .filter(|e| e.data[0]["content"] == "Paris")
        .map(|e| &e.namespace)
        .collect();
    assert_eq!(sub.len(), 1, "{events:?}");
    assert!(sub[0][0].starts_with("tools:"), "{:?}", sub[0]);
    assert!(sub[0][1].starts_with("research:call_"), "{:?}", sub[0]);
}

#[tokio::test]
async fn a_graph_tool_can_shape_its_answer() {
    let yaml = SUPERVISOR.replace(
        "    input: '#{messages: [human(args.request)]}'",
        "    input: '#{messages: [human(args.request)]}'\n    output: '\"research: \" + text(result.messages[-1])'",
    );
    let (out, _) = Harness::new()
        .run(&graph_from_yaml(&yaml), None, human_input("q"), &[], |_| {})
        .await;
    let values = out.unwrap().values;
    assert_eq!(texts(&values)[2], "research: Paris has 2.1 million people");
}

#[tokio::test]
async fn a_graph_tool_names_a_declared_graph() {
    let yaml = SUPERVISOR.replace("    graph: researcher", "    graph: researchr");
    let err = load_str(&yaml, "t.yaml", "t", Format::Yaml).unwrap_err();
    assert!(
        err.to_string().contains("unknown graph `researchr`"),
        "{err}"
    );
}

const VARIANTS: &str = r#"
name: helper
variants:
  by: mode
  default: quick
  graphs:
    quick:
      state: {messages: messages}
      nodes:
        answer: {kind: script, code: '#{messages: [ai("quick answer")]}'}
      edges:
        - {from: __start__, to: answer}
        - {from: answer, to: __end__}
    thorough:
      state: {messages: messages}
      nodes:
        draft: {kind: script, code: '#{messages: [ai("draft")]}'}
        review: {kind: script, code: '#{messages: [ai("reviewed answer")]}'}
      edges:
        - {from: __start__, to: draft}
        - {from: draft, to: review}
        - {from: review, to: __end__}
"#;

async fn answer(g: &Arc<Graph>, context: Value, config: Value) -> Result<Vec<String>, RunError> {
    let (out, _) = Harness::new()
        .run(g, None, human_input("q"), &[], |c| {
            c.context = context;
            c.config = config;
        })
        .await;
    out.map(|o| texts(&o.values))
}

#[tokio::test]
async fn each_run_runs_the_variant_it_chooses() {
    let g = graph_from_yaml(VARIANTS);
    assert_eq!(g.name(), "helper");
    // Its shape, as the assistants endpoints draw it, is the default's.
    assert_eq!(g.node_names().collect::<Vec<_>>(), ["answer"]);
    let none = json!({});
    assert_eq!(
        answer(&g, none.clone(), none.clone()).await.unwrap(),
        ["q", "quick answer"]
    );
    assert_eq!(
        answer(&g, json!({"mode": "thorough"}), none.clone())
            .await
            .unwrap(),
        ["q", "draft", "reviewed answer"]
    );
    let configured = json!({"configurable": {"mode": "thorough"}});
    assert_eq!(
        answer(&g, none.clone(), configured).await.unwrap(),
        ["q", "draft", "reviewed answer"]
    );
    let err = answer(&g, json!({"mode": "slow"}), none).await.unwrap_err();
    assert_eq!(err.class(), "ValueError");
    assert!(
        err.to_string()
            .contains("the run chose the variant `slow` (its `mode`), which the graph does not have; it has: quick, thorough"),
        "{err}"
    );
}

#[test]
fn variants_must_share_their_state_keys() {
    let yaml = VARIANTS.replace(
        "    thorough:\n      state: {messages: messages}",
        "    thorough:\n      state: {messages: messages, notes: string}",
    );
    let err = load_str(&yaml, "t.yaml", "t", Format::Yaml).unwrap_err();
    assert!(
        err.to_string()
            .contains("every variant needs the same state keys"),
        "{err}"
    );
}

#[test]
fn the_default_variant_must_exist() {
    let yaml = VARIANTS.replace("default: quick", "default: fast");
    let err = load_str(&yaml, "t.yaml", "t", Format::Yaml).unwrap_err();
    assert!(
        err.to_string()
            .contains("`fast` is not one of the variants (quick, thorough)"),
        "{err}"
    );
}
