//! State channels and their reducers.
//!
//! A channel holds one key of the graph state. Its kind decides how the writes of one
//! super-step combine: LangGraph users rely on the exact rules (a plain key written twice in one
//! step is an error; `add_messages` merges by id), so each kind below mirrors one LangGraph
//! channel class.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::messages::{add_messages, MergeDelta};

/// A user reducer (e.g. a script): folds one write into the current value.
pub trait CustomReducer: Send + Sync + std::fmt::Debug {
    /// Combine the current value (`Null` when empty) with one write.
    fn reduce(&self, current: Value, update: Value) -> Result<Value, String>;
}

/// How the writes of one step combine into a channel's value.
#[derive(Clone, Debug)]
pub enum ChannelKind {
    /// `LastValue`: at most one write per step; the write replaces the value.
    LastValue,
    /// `operator.add` over lists: a list write is concatenated, a single item is pushed.
    Append,
    /// `add_messages`: merge by message id, with coercion and `RemoveMessage`.
    Messages,
    /// `operator.add` over numbers.
    Add,
    /// `EphemeralValue`: visible for the step after it was written, then cleared.
    Ephemeral,
    /// `Topic`: collects every write of a step into a list; `accumulate` keeps earlier steps.
    Topic {
        /// Keep values across steps instead of clearing them.
        accumulate: bool,
    },
    /// A reducer written by the graph's author.
    Custom(Arc<dyn CustomReducer>),
}

impl ChannelKind {
    /// The name used in graph files and error messages.
    pub fn label(&self) -> &'static str {
        match self {
            ChannelKind::LastValue => "last_value",
            ChannelKind::Append => "append",
            ChannelKind::Messages => "messages",
            ChannelKind::Add => "add",
            ChannelKind::Ephemeral => "ephemeral",
            ChannelKind::Topic { .. } => "topic",
            ChannelKind::Custom(_) => "custom",
        }
    }

    /// The value a reducer channel starts with when no default is given (LangGraph builds it
    /// from the annotated type: `list()` -> `[]`, `int()` -> `0`).
    pub fn implicit_default(&self) -> Option<Value> {
        match self {
            ChannelKind::Append | ChannelKind::Messages => Some(json!([])),
            ChannelKind::Add => Some(json!(0)),
            _ => None,
        }
    }
}

/// One state key.
#[derive(Clone, Debug)]
pub struct ChannelSpec {
    /// The key in the state object.
    pub name: String,
    /// How writes combine.
    pub kind: ChannelKind,
    /// The starting value; `None` leaves the key absent until written.
    pub default: Option<Value>,
    /// JSON Schema of the value, for `/schemas`.
    pub schema: Value,
}

impl ChannelSpec {
    /// A channel with the kind's implicit default and a schema derived from the kind.
    pub fn new(name: impl Into<String>, kind: ChannelKind) -> Self {
        let default = kind.implicit_default();
        let schema = match &kind {
            ChannelKind::Append | ChannelKind::Messages | ChannelKind::Topic { .. } => {
                json!({"type": "array", "items": {}})
            }
            ChannelKind::Add => json!({"type": "number"}),
            _ => json!({}),
        };
        ChannelSpec {
            name: name.into(),
            kind,
            default,
            schema,
        }
    }

    /// Set the starting value.
    pub fn with_default(mut self, default: Value) -> Self {
        self.default = Some(default);
        self
    }

    /// Set the JSON Schema of the value.
    pub fn with_schema(mut self, schema: Value) -> Self {
        self.schema = schema;
        self
    }
}

/// LangGraph's `InvalidUpdateError` and reducer failures, with the key they concern.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidUpdate {
    /// The state key.
    pub channel: String,
    /// LangGraph's wording where it has one.
    pub message: String,
}

/// What a step's writes did to a channel; lets checkpoints store a delta instead of the value.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The value was replaced wholesale.
    Replaced,
    /// Items were appended to a list.
    Appended(Vec<Value>),
    /// Messages were merged by id.
    Merged(MergeDelta),
}

/// Apply one step's writes (in their deterministic order) to a channel value.
/// Returns `None` when nothing changed.
pub fn apply_writes(
    spec: &ChannelSpec,
    current: &mut Option<Value>,
    writes: &[Value],
) -> Result<Option<Change>, InvalidUpdate> {
    let err = |message: String| InvalidUpdate {
        channel: spec.name.clone(),
        message,
    };
    if writes.is_empty() {
        return Ok(None);
    }
    match &spec.kind {
        ChannelKind::LastValue | ChannelKind::Ephemeral => {
            if writes.len() > 1 {
                return Err(err(format!(
                    "At key '{}': Can receive only one value per step. Use an Annotated key to handle multiple values.",
                    spec.name
                )));
            }
            *current = Some(writes[0].clone());
            Ok(Some(Change::Replaced))
        }
        ChannelKind::Append => {
            let mut list = match current.take() {
                Some(Value::Array(items)) => items,
                Some(Value::Null) | None => Vec::new(),
                Some(other) => vec![other],
            };
            let mut added = Vec::new();
            for w in writes {
                match w {
                    Value::Array(items) => added.extend(items.iter().cloned()),
                    other => added.push(other.clone()),
                }
            }
            list.extend(added.iter().cloned());
            *current = Some(Value::Array(list));
            Ok(Some(Change::Appended(added)))
        }
        ChannelKind::Messages => {
            let mut list = match current.take() {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            };
            let mut total = MergeDelta::default();
            let mut result = Ok(());
            for w in writes {
                match add_messages(&mut list, w) {
                    Ok(d) => {
                        if d.cleared {
                            total = MergeDelta {
                                cleared: true,
                                ..Default::default()
                            };
                        }
                        total.upserted.extend(d.upserted);
                        total.removed.extend(d.removed);
                    }
                    Err(e) => {
                        result = Err(err(format!("At key '{}': {}", spec.name, e.0)));
                        break;
                    }
                }
            }
            *current = Some(Value::Array(list));
            result.map(|()| Some(Change::Merged(total)))
        }
        ChannelKind::Add => {
            let mut acc = current.take().unwrap_or(json!(0));
            for w in writes {
                acc = add_numbers(&acc, w).ok_or_else(|| {
                    err(format!(
                        "At key '{}': cannot add {w} to {acc}; an `add` channel takes numbers",
                        spec.name
                    ))
                })?;
            }
            *current = Some(acc);
            Ok(Some(Change::Replaced))
        }
        ChannelKind::Topic { accumulate } => {
            let mut list = match (accumulate, current.take()) {
                (true, Some(Value::Array(items))) => items,
                _ => Vec::new(),
            };
            for w in writes {
                match w {
                    Value::Array(items) => list.extend(items.iter().cloned()),
                    other => list.push(other.clone()),
                }
            }
            *current = Some(Value::Array(list));
            Ok(Some(Change::Replaced))
        }
        ChannelKind::Custom(reducer) => {
            let mut acc = current.take().unwrap_or(Value::Null);
            for w in writes {
                acc = reducer
                    .reduce(acc, w.clone())
                    .map_err(|e| err(format!("At key '{}': reducer failed: {e}", spec.name)))?;
            }
            *current = Some(acc);
            Ok(Some(Change::Replaced))
        }
    }
}

/// Whether a channel forgets its value at the end of a step in which it was not written.
pub fn clears_when_unwritten(kind: &ChannelKind) -> bool {
    matches!(
        kind,
        ChannelKind::Ephemeral | ChannelKind::Topic { accumulate: false }
    )
}

fn add_numbers(a: &Value, b: &Value) -> Option<Value> {
    match (a, b) {
        (Value::Null, b) if b.is_number() => Some(b.clone()),
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                x.checked_add(y).map(Value::from)
            } else {
                let sum = x.as_f64()? + y.as_f64()?;
                serde_json::Number::from_f64(sum).map(Value::Number)
            }
        }
        _ => None,
    }
}
