//! What a node is to the engine: an async function from its input to a state update or a
//! [`Command`], plus the routing values (`Goto`, `Send`) nodes and branches return.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::context::TaskContext;

/// A node's body. Implemented by the node kinds of graph files and by Rust closures
/// (see [`crate::builder::node_fn`]).
#[async_trait]
pub trait Node: Send + Sync {
    /// Run once. `input` is the state (or the `Send` argument for pushed tasks).
    async fn run(&self, input: Value, ctx: &TaskContext) -> Result<Command, NodeError>;
}

/// A conditional edge's function: reads the state after the source node ran and names where
/// to go next.
#[async_trait]
pub trait Router: Send + Sync {
    /// Return the targets: node names, `END`, or `Send`s. Names are mapped through the
    /// branch's path map before use.
    async fn route(&self, state: &Value, ctx: &TaskContext) -> Result<Vec<Goto>, NodeError>;

    /// The router's name in the `events` stream mode, where LangGraph shows the routing
    /// function's name.
    fn name(&self) -> &str {
        "route"
    }
}

/// A routing target.
#[derive(Debug, Clone, PartialEq)]
pub enum Goto {
    /// Run this node in the next step with the graph state (or end, for `__end__`).
    Node(String),
    /// Run `node` in the next step with `arg` as its input (map-reduce fan-out).
    Send {
        /// Target node.
        node: String,
        /// The input it receives instead of the state.
        arg: Value,
    },
}

impl Goto {
    /// Read LangGraph's loose forms: a node name, `{"node", "arg"}` (a `Send`), or
    /// `{"__send__": {...}}`.
    pub fn from_value(v: &Value) -> Result<Goto, String> {
        match v {
            Value::String(s) => Ok(Goto::Node(s.clone())),
            Value::Object(o) => {
                let o = o.get("__send__").and_then(Value::as_object).unwrap_or(o);
                let node = o
                    .get("node")
                    .and_then(Value::as_str)
                    .ok_or_else(|| "a Send needs a `node` name".to_string())?;
                Ok(Goto::Send {
                    node: node.to_string(),
                    arg: o.get("arg").cloned().unwrap_or(Value::Null),
                })
            }
            other => Err(format!("cannot route to {other}")),
        }
    }

    /// The target node.
    pub fn node(&self) -> &str {
        match self {
            Goto::Node(n) | Goto::Send { node: n, .. } => n,
        }
    }
}

/// Which graph a [`Command`] addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommandGraph {
    /// The graph the node belongs to.
    #[default]
    Current,
    /// The parent of the subgraph the node belongs to (`Command.PARENT`).
    Parent,
}

/// A node's result: an update of the state, optionally with where to go next (LangGraph's
/// `Command`). A plain update is a `Command` without `goto`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Command {
    /// State update: an object of key -> write, or a list of `[key, write]` pairs.
    pub update: Option<Value>,
    /// Where to go after this node, in addition to its static edges.
    pub goto: Vec<Goto>,
    /// Which graph receives the update and goto.
    pub graph: CommandGraph,
}

impl Command {
    /// A plain state update.
    pub fn update(update: Value) -> Self {
        Command {
            update: Some(update),
            ..Default::default()
        }
    }

    /// No update.
    pub fn none() -> Self {
        Command::default()
    }

    /// Add a goto.
    pub fn goto(mut self, goto: Goto) -> Self {
        self.goto.push(goto);
        self
    }

    /// The update as `(key, value)` pairs in write order.
    pub fn update_pairs(&self) -> Result<Vec<(String, Value)>, NodeError> {
        match &self.update {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Object(o)) => Ok(o.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            Some(Value::Array(pairs)) => pairs
                .iter()
                .map(|p| match p.as_array().map(Vec::as_slice) {
                    Some([Value::String(k), v]) => Ok((k.clone(), v.clone())),
                    _ => Err(NodeError::invalid_update(format!(
                        "Expected a [key, value] pair in the update, got {p}"
                    ))),
                })
                .collect(),
            Some(other) => Err(NodeError::invalid_update(format!(
                "Expected dict, got {other}"
            ))),
        }
    }
}

/// A pending `interrupt(value)` raised by a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Interrupt {
    /// Interrupt id, stable for the same task and position, used to resume it.
    pub id: String,
    /// The payload shown to the client.
    pub value: Value,
}

impl Interrupt {
    /// `{value, id}` as in `updates`/`values` stream payloads.
    pub fn to_stream_json(&self) -> Value {
        json!({"value": self.value, "id": self.id, "response_schema": null})
    }

    /// `{id, value}` as in thread state.
    pub fn to_state_json(&self) -> Value {
        json!({"id": self.id, "value": self.value})
    }
}

/// Why a node did not return an update.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NodeError {
    /// A failure shown to clients as `{"error": class, "message": message}` (and `location`
    /// when known).
    #[error("{class}: {message}")]
    Failed {
        /// The error class, e.g. `ValueError`.
        class: String,
        /// The message, as the node made it (a script's `raise` chooses it): clients compare
        /// it, so it says nothing of where the failure happened.
        message: String,
        /// Where it happened (`graph 'g', node 'n': line L, column C of FILE`), for the log and
        /// the run error's own `location` field.
        location: Option<String>,
    },
    /// The node called `interrupt()` with no resume value available.
    #[error("interrupted")]
    Interrupted(Vec<Interrupt>),
    /// The run was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// A `Command(graph=PARENT)` bubbling out of a subgraph.
    #[error("command for the parent graph")]
    ParentCommand(Box<Command>),
}

impl NodeError {
    /// A failure with a class name and message.
    pub fn new(class: impl Into<String>, message: impl Into<String>) -> Self {
        NodeError::Failed {
            class: class.into(),
            message: message.into(),
            location: None,
        }
    }

    /// This failure, said to have happened at `place` (e.g. `graph 'g', node 'n'`), which goes
    /// before the location it already has (a script's line); its class and message stay as
    /// they are. Other errors pass through.
    pub fn at(self, place: &str) -> NodeError {
        match self {
            NodeError::Failed {
                class,
                message,
                location,
            } => NodeError::Failed {
                class,
                message,
                location: Some(match location {
                    Some(inner) => format!("{place}: {inner}"),
                    None => place.to_string(),
                }),
            },
            other => other,
        }
    }

    /// LangGraph's `InvalidUpdateError`.
    pub fn invalid_update(message: impl Into<String>) -> Self {
        NodeError::new("InvalidUpdateError", message)
    }
}

/// When and how often a failed node is tried again (LangGraph's `RetryPolicy`).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Total attempts, the first included.
    pub max_attempts: u32,
    /// Wait before the second attempt.
    pub initial_interval: Duration,
    /// Multiplier of the wait per attempt.
    pub backoff_factor: f64,
    /// Upper bound of the wait.
    pub max_interval: Duration,
    /// Error classes that are retried; empty means every failure.
    pub retry_on: Vec<String>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_interval: Duration::from_millis(500),
            backoff_factor: 2.0,
            max_interval: Duration::from_secs(128),
            retry_on: Vec::new(),
        }
    }
}

impl RetryPolicy {
    /// Whether an error of this class is retried.
    pub fn retries(&self, class: &str) -> bool {
        self.retry_on.is_empty() || self.retry_on.iter().any(|c| c == class)
    }

    /// The wait before attempt `attempt` (2 for the first retry).
    pub fn wait_before(&self, attempt: u32) -> Duration {
        let exp = self.backoff_factor.powi(attempt.saturating_sub(2) as i32);
        let secs = (self.initial_interval.as_secs_f64() * exp).min(self.max_interval.as_secs_f64());
        Duration::from_secs_f64(secs.max(0.0))
    }
}
