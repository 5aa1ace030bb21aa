//! Channel values as stored: a full value, or a delta on top of an earlier version.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ChannelVersion, CheckpointError};
use crate::messages::message_id;

/// Store a full copy after this many deltas in a row, so loading replays a bounded chain.
pub const FULL_EVERY: u32 = 64;

/// A stored channel value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum BlobValue {
    /// The whole value.
    Full {
        /// The value.
        value: Value,
    },
    /// The value of `base` with `items` appended.
    Append {
        /// The version this delta applies to.
        base: ChannelVersion,
        /// Length of the delta chain including this one.
        depth: u32,
        /// Appended items.
        items: Vec<Value>,
    },
    /// The list of `base` with messages upserted by id and ids removed (`add_messages`).
    Upsert {
        /// The version this delta applies to.
        base: ChannelVersion,
        /// Length of the delta chain including this one.
        depth: u32,
        /// Messages replacing the one with the same id, or appended.
        items: Vec<Value>,
        /// Removed message ids.
        removed: Vec<String>,
    },
    /// The channel has no value at this version.
    Empty,
}

impl BlobValue {
    /// Length of the delta chain ending here (0 for a full value).
    pub fn depth(&self) -> u32 {
        match self {
            BlobValue::Append { depth, .. } | BlobValue::Upsert { depth, .. } => *depth,
            _ => 0,
        }
    }
}

/// A blob to save: a channel's value at a version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelBlob {
    /// The channel.
    pub channel: String,
    /// Its version.
    pub version: ChannelVersion,
    /// The value or delta.
    pub value: BlobValue,
}

/// Rebuild a channel's value at `version`, fetching earlier blobs of the delta chain with
/// `fetch`. Savers call this when loading a checkpoint.
pub fn materialize(
    channel: &str,
    version: ChannelVersion,
    mut fetch: impl FnMut(ChannelVersion) -> Option<BlobValue>,
) -> Result<Option<Value>, CheckpointError> {
    let mut chain = Vec::new();
    let mut v = version;
    let base = loop {
        let blob = fetch(v)
            .ok_or_else(|| CheckpointError::Missing(format!("channel `{channel}` version {v}")))?;
        match blob {
            BlobValue::Full { value } => break Some(value),
            BlobValue::Empty => break None,
            BlobValue::Append { base, .. } | BlobValue::Upsert { base, .. } => {
                if base >= v {
                    return Err(CheckpointError::Missing(format!(
                        "channel `{channel}` has a delta chain that does not go back in time"
                    )));
                }
                v = base;
                chain.push(blob);
            }
        }
    };
    if chain.is_empty() {
        return Ok(base);
    }
    let mut list = match base {
        Some(Value::Array(items)) => items,
        Some(other) => vec![other],
        None => Vec::new(),
    };
    for delta in chain.into_iter().rev() {
        match delta {
            BlobValue::Append { items, .. } => list.extend(items),
            BlobValue::Upsert { items, removed, .. } => apply_upsert(&mut list, items, &removed),
            _ => {}
        }
    }
    Ok(Some(Value::Array(list)))
}

fn apply_upsert(list: &mut Vec<Value>, items: Vec<Value>, removed: &[String]) {
    let mut index: HashMap<String, usize> = list
        .iter()
        .enumerate()
        .filter_map(|(i, m)| message_id(m).map(|id| (id.to_string(), i)))
        .collect();
    for m in items {
        match message_id(&m).and_then(|id| index.get(id).copied()) {
            Some(i) => list[i] = m,
            None => {
                if let Some(id) = message_id(&m) {
                    index.insert(id.to_string(), list.len());
                }
                list.push(m);
            }
        }
    }
    if !removed.is_empty() {
        list.retain(|m| !message_id(m).is_some_and(|id| removed.iter().any(|r| r == id)));
    }
}
