//! The types of a run: what starts it, its settings, what it reaches, how it ends.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{CheckpointError, CheckpointRef, Checkpointer};
use crate::graph::NodeSet;
use crate::node::{Goto, Interrupt, NodeError};
use crate::store::Store;
use crate::stream::{EventSink, StreamMode};

/// When checkpoints are written (LangGraph's `durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Each checkpoint is saved before the next step starts.
    Sync,
    /// Checkpoints are saved in order, in the background, while the next steps run; the run
    /// waits for them at its end.
    #[default]
    Async,
    /// Only the last checkpoint of the run is saved.
    Exit,
}

impl Durability {
    /// Parse `sync|async|exit`.
    pub fn parse(s: &str) -> Option<Durability> {
        match s {
            "sync" => Some(Durability::Sync),
            "async" => Some(Durability::Async),
            "exit" => Some(Durability::Exit),
            _ => None,
        }
    }
}

/// What starts a run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunInput {
    /// New input values.
    Values(Value),
    /// LangGraph's `Command`: resume interrupts (a value for every pending interrupt, or
    /// `{interrupt_id: value}`), update the state, and/or go to nodes.
    Command {
        /// Resume value(s).
        resume: Option<Value>,
        /// State update applied before continuing.
        update: Option<Value>,
        /// Nodes to run next.
        goto: Vec<Goto>,
    },
    /// No input: continue from the checkpoint (e.g. after `interrupt_before`, or a run
    /// resumed after a crash). Under `Durability::Async` a run's steps run while its
    /// checkpoints, its input's first, are still being saved, so whoever resumes a run that
    /// had new input continues only if the thread's latest checkpoint is that run's (its
    /// metadata's `run_id`), and otherwise starts it again with its input.
    Continue,
}

/// LangGraph's default `recursion_limit`.
pub const DEFAULT_RECURSION_LIMIT: usize = 25;

/// Per-run settings.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Thread to checkpoint into; `None` runs without checkpoints.
    pub thread_id: Option<String>,
    /// Start from this checkpoint instead of the latest (time travel / fork).
    pub checkpoint_id: Option<String>,
    /// The config nodes see: `{configurable: {...}, metadata: {...}}`. `metadata` is merged
    /// into checkpoint metadata and task/message stream metadata.
    pub config: Value,
    /// The run context.
    pub context: Value,
    /// Streamed modes.
    pub stream_modes: Vec<StreamMode>,
    /// Stream subgraph events too.
    pub stream_subgraphs: bool,
    /// Maximum number of steps (default [`DEFAULT_RECURSION_LIMIT`]).
    pub recursion_limit: usize,
    /// Overrides the graph's `interrupt_before`.
    pub interrupt_before: Option<NodeSet>,
    /// Overrides the graph's `interrupt_after`.
    pub interrupt_after: Option<NodeSet>,
    /// When checkpoints are written.
    pub durability: Durability,
    /// The caller knows the thread has no checkpoint yet (its storage said so when the run
    /// was created): the run starts fresh without looking for one. Ignored with
    /// `checkpoint_id`.
    pub new_thread: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            thread_id: None,
            checkpoint_id: None,
            config: json!({}),
            context: json!({}),
            stream_modes: Vec::new(),
            stream_subgraphs: false,
            recursion_limit: DEFAULT_RECURSION_LIMIT,
            interrupt_before: None,
            interrupt_after: None,
            durability: Durability::Async,
            new_thread: false,
        }
    }
}

/// What a run reaches besides its graph.
#[derive(Clone, Default)]
pub struct RunEnv {
    /// Checkpointer (needed with a thread id).
    pub checkpointer: Option<Arc<dyn Checkpointer>>,
    /// Long-term store.
    pub store: Option<Arc<dyn Store>>,
    /// Where stream events go.
    pub sink: Option<EventSink>,
    /// Cancels the run.
    pub cancel: CancellationToken,
}

/// How a run ended without error.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// Output values.
    pub values: Value,
    /// Pending interrupts (empty when the run finished).
    pub interrupts: Vec<Interrupt>,
    /// Nodes that would run next (non-empty when interrupted).
    pub next: Vec<String>,
    /// The last checkpoint, when checkpointing.
    pub checkpoint: Option<CheckpointRef>,
}

impl RunOutcome {
    /// The values as `/wait` returns them: with `__interrupt__` when interrupted.
    pub fn wait_values(&self) -> Value {
        let mut v = self.values.clone();
        if !self.interrupts.is_empty() {
            if let Value::Object(m) = &mut v {
                m.insert(
                    "__interrupt__".into(),
                    Value::Array(
                        self.interrupts
                            .iter()
                            .map(Interrupt::to_state_json)
                            .collect(),
                    ),
                );
            }
        }
        v
    }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// A node failed (after its retries).
    #[error("{class}: {message}")]
    Node {
        /// Error class, e.g. `ValueError`.
        class: String,
        /// Message.
        message: String,
        /// The node whose task failed, when a task did.
        node: Option<String>,
        /// Where it failed ([`NodeError::Failed`]'s `location`), when known.
        location: Option<String>,
    },
    /// The step limit was reached.
    #[error("Recursion limit of {0} reached without hitting a stop condition. You can increase the limit by setting the `recursion_limit` config key.")]
    Recursion(usize),
    /// The run was cancelled.
    #[error("run cancelled")]
    Cancelled,
    /// The input was not usable.
    #[error("{0}")]
    InvalidInput(String),
    /// The checkpointer failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl RunError {
    /// The error class clients see (`{"error": class, "message": ...}`).
    pub fn class(&self) -> &str {
        match self {
            RunError::Node { class, .. } => class,
            RunError::Recursion(_) => "GraphRecursionError",
            RunError::Cancelled => "CancelledError",
            RunError::InvalidInput(_) => "InvalidUpdateError",
            RunError::Checkpoint(_) => "CheckpointError",
        }
    }

    /// The node whose task failed, when one did.
    pub fn node(&self) -> Option<&str> {
        match self {
            RunError::Node { node, .. } => node.as_deref(),
            _ => None,
        }
    }

    /// The message clients see.
    pub fn message(&self) -> String {
        match self {
            RunError::Node { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// Where the run failed (graph, node, a graph file's line), when known: a field of its
    /// own beside the message, in the run's error and its log line.
    pub fn location(&self) -> Option<&str> {
        match self {
            RunError::Node { location, .. } => location.as_deref(),
            _ => None,
        }
    }

    pub(crate) fn from_node(e: NodeError) -> RunError {
        match e {
            NodeError::Failed {
                class,
                message,
                location,
            } => RunError::Node {
                class,
                message,
                node: None,
                location,
            },
            NodeError::Cancelled => RunError::Cancelled,
            NodeError::Interrupted(_) => RunError::Node {
                class: "GraphInterrupt".into(),
                message: "interrupt outside a task".into(),
                node: None,
                location: None,
            },
            NodeError::ParentCommand(_) => RunError::Node {
                class: "InvalidUpdateError".into(),
                message: "Command(graph=PARENT) used in the root graph".into(),
                node: None,
                location: None,
            },
        }
    }
}

/// Convert stream mode names; unknown names are reported.
pub fn parse_stream_modes(names: &[String]) -> Result<Vec<StreamMode>, String> {
    names
        .iter()
        .map(|n| StreamMode::parse(n).ok_or_else(|| format!("unknown stream mode `{n}`")))
        .collect()
}
