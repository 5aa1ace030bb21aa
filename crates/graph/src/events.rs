//! The `events` stream mode: LangChain's `astream_events` v2 dicts for the runs inside a
//! graph run, as LangGraph Platform sends them. The runs form a tree: the graph, its nodes,
//! and below a node its routers, chat model calls, tools and subgraphs. Each event names its
//! run (`run_id`) and the runs above it (`parent_ids`, outermost first).
//!
//! Like the Platform, Spindle leaves out the graph's own `on_chain_stream` events (the other
//! stream modes carry them) and sends events of subgraphs under the root namespace.
//! Nothing here is built unless the run streams `events`.

use serde_json::{json, Value};

use crate::context::RunShared;
use crate::node::Goto;
use crate::pregel::RunInput;
use crate::stream::StreamMode;

/// A run's place in the tree of runs.
#[derive(Debug, Clone, PartialEq)]
pub struct EventScope {
    run_id: String,
    /// Run ids of the enclosing runs, outermost first.
    parent_ids: Vec<String>,
}

impl EventScope {
    /// The root: the graph run itself, whose run id is the server's run id when there is one.
    pub(crate) fn root(run_id: Option<&str>) -> Self {
        EventScope {
            run_id: run_id.map_or_else(new_run_id, str::to_string),
            parent_ids: Vec::new(),
        }
    }

    /// A run below this one.
    pub(crate) fn child(&self) -> Self {
        let mut parent_ids = self.parent_ids.clone();
        parent_ids.push(self.run_id.clone());
        EventScope {
            run_id: new_run_id(),
            parent_ids,
        }
    }

    /// This run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
}

fn new_run_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A run that shows in `events`: what its start, stream and end events share.
#[derive(Debug, Clone)]
pub(crate) struct Traced {
    pub name: String,
    pub scope: EventScope,
    pub tags: Vec<String>,
    pub metadata: Value,
}

impl Traced {
    /// The event dict LangChain sends.
    pub fn payload(&self, kind: &str, data: Value) -> Value {
        json!({
            "event": kind,
            "data": data,
            "name": self.name,
            "tags": self.tags,
            "run_id": self.scope.run_id,
            "metadata": self.metadata,
            "parent_ids": self.scope.parent_ids,
        })
    }

    /// Send one event of this run.
    pub async fn emit(&self, run: &RunShared, kind: &str, data: Value) {
        run.emit(&[], StreamMode::Events, self.payload(kind, data))
            .await;
    }

    /// `on_chain_end` (or `on_tool_end`, ...) with the run's output and input.
    pub async fn end(&self, run: &RunShared, kind: &str, output: Value, input: Value) {
        self.emit(run, kind, json!({"output": output, "input": input}))
            .await;
    }
}

/// The graph's input as LangGraph shows it in `on_chain_start`: the values, the `Command`
/// as a dict, or `null` when the run continues.
pub(crate) fn run_input_json(input: &RunInput) -> Value {
    match input {
        RunInput::Values(v) => v.clone(),
        RunInput::Command {
            resume,
            update,
            goto,
        } => json!({
            "graph": null,
            "update": update,
            "resume": resume,
            "goto": if goto.is_empty() { Value::Null } else { Value::Array(goto.iter().map(goto_json).collect()) },
        }),
        RunInput::Continue => Value::Null,
    }
}

/// A router's answer as its function returned it: one target, or a list of them.
pub(crate) fn answers_json(answers: &[Goto]) -> Value {
    match answers {
        [one] => goto_json(one),
        many => Value::Array(many.iter().map(goto_json).collect()),
    }
}

fn goto_json(g: &Goto) -> Value {
    match g {
        Goto::Node(n) => json!(n),
        Goto::Send { node, arg } => json!({"node": node, "arg": arg}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_know_their_ancestors() {
        let root = EventScope::root(Some("r"));
        let node = root.child();
        let tool = node.child();
        assert_eq!(root.run_id(), "r");
        assert_eq!(node.parent_ids, ["r"]);
        assert_eq!(tool.parent_ids, vec!["r".to_string(), node.run_id.clone()]);
    }

    #[test]
    fn inputs_and_answers() {
        let cmd = RunInput::Command {
            resume: Some(json!("yes")),
            update: None,
            goto: vec![],
        };
        assert_eq!(
            run_input_json(&cmd),
            json!({"graph": null, "update": null, "resume": "yes", "goto": null})
        );
        assert_eq!(run_input_json(&RunInput::Continue), Value::Null);
        assert_eq!(answers_json(&[Goto::Node("tools".into())]), json!("tools"));
        assert_eq!(
            answers_json(&[Goto::Node("a".into()), Goto::Node("b".into())]),
            json!(["a", "b"])
        );
    }
}
