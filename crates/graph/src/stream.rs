//! Stream events as typed values. The server crate turns them into SSE frames; the payloads
//! (`data`) already have LangGraph's shapes so the server only adds framing.

use serde_json::Value;

/// LangGraph's stream modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamMode {
    /// The whole state after each step.
    Values,
    /// `{node: update}` after each task.
    Updates,
    /// `[message_chunk, metadata]` for each model token (and each message a node returned).
    Messages,
    /// Whatever nodes wrote with the custom stream writer.
    Custom,
    /// Task start and task result payloads.
    Tasks,
    /// Each checkpoint as `get_state` would show it.
    Checkpoints,
    /// `{step, timestamp, type, payload}` wrappers of checkpoints and tasks.
    Debug,
}

impl StreamMode {
    /// Every mode.
    pub const ALL: [StreamMode; 7] = [
        StreamMode::Values,
        StreamMode::Updates,
        StreamMode::Messages,
        StreamMode::Custom,
        StreamMode::Tasks,
        StreamMode::Checkpoints,
        StreamMode::Debug,
    ];

    /// The mode's name as LangGraph spells it (`messages` is the tuple form).
    pub fn as_str(self) -> &'static str {
        match self {
            StreamMode::Values => "values",
            StreamMode::Updates => "updates",
            StreamMode::Messages => "messages",
            StreamMode::Custom => "custom",
            StreamMode::Tasks => "tasks",
            StreamMode::Checkpoints => "checkpoints",
            StreamMode::Debug => "debug",
        }
    }

    /// Parse a mode name; `messages-tuple` is accepted for `messages`.
    pub fn parse(s: &str) -> Option<StreamMode> {
        Some(match s {
            "values" => StreamMode::Values,
            "updates" => StreamMode::Updates,
            "messages" | "messages-tuple" => StreamMode::Messages,
            "custom" => StreamMode::Custom,
            "tasks" => StreamMode::Tasks,
            "checkpoints" => StreamMode::Checkpoints,
            "debug" => StreamMode::Debug,
            _ => return None,
        })
    }
}

/// One event of a run's stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    /// Subgraph path, empty for the root graph: `["child:<task_id>", ...]`.
    pub namespace: Vec<String>,
    /// The mode this event belongs to.
    pub mode: StreamMode,
    /// The payload, in LangGraph's shape for the mode.
    pub data: Value,
}

impl StreamEvent {
    /// The SSE event name LangGraph uses: `mode` or `mode|ns1|ns2`.
    pub fn event_name(&self) -> String {
        let mut name = self.mode.as_str().to_string();
        for part in &self.namespace {
            name.push('|');
            name.push_str(part);
        }
        name
    }
}

/// Which modes a run streams, as a bit set so the hot path checks them for free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamModes(u8);

impl StreamModes {
    /// No streaming.
    pub const NONE: StreamModes = StreamModes(0);

    /// Every mode.
    pub fn all() -> Self {
        StreamModes(0x7f)
    }

    /// From a list of modes.
    pub fn of(modes: &[StreamMode]) -> Self {
        let mut s = StreamModes(0);
        for m in modes {
            s.insert(*m);
        }
        s
    }

    /// Add a mode.
    pub fn insert(&mut self, mode: StreamMode) {
        self.0 |= 1 << (mode as u8);
    }

    /// Whether a mode is on.
    pub fn contains(self, mode: StreamMode) -> bool {
        self.0 & (1 << (mode as u8)) != 0
    }

    /// Whether any mode is on.
    pub fn any(self) -> bool {
        self.0 != 0
    }
}
