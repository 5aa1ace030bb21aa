//! Channel values as stored: a full value, or a delta on top of an earlier version.

use std::collections::{HashMap, HashSet};

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
    // Only the ids the deltas touch are looked up, in one pass over the list without
    // allocating: loading a long thread must not cost a hash-map entry per message.
    let touched: HashSet<&str> = chain
        .iter()
        .flat_map(|d| match d {
            BlobValue::Upsert { items, removed, .. } => items
                .iter()
                .filter_map(message_id)
                .chain(removed.iter().map(String::as_str))
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect();
    let mut index: HashMap<String, usize> = HashMap::new();
    if !touched.is_empty() {
        for (i, m) in list.iter().enumerate() {
            if let Some(id) = message_id(m).filter(|id| touched.contains(id)) {
                index.insert(id.to_string(), i);
            }
        }
    }
    let mut removed_any = false;
    for delta in chain.iter().rev() {
        match delta {
            BlobValue::Append { items, .. } => {
                for m in items {
                    if let Some(id) = message_id(m).filter(|id| touched.contains(id)) {
                        index.insert(id.to_string(), list.len());
                    }
                    list.push(m.clone());
                }
            }
            BlobValue::Upsert { items, removed, .. } => {
                for m in items {
                    match message_id(m).and_then(|id| index.get(id).copied()) {
                        Some(i) => list[i] = m.clone(),
                        None => {
                            if let Some(id) = message_id(m) {
                                index.insert(id.to_string(), list.len());
                            }
                            list.push(m.clone());
                        }
                    }
                }
                for r in removed {
                    if let Some(i) = index.remove(r.as_str()) {
                        // Marked now, dropped at the end, so later indexes stay valid.
                        list[i] = Value::Null;
                        removed_any = true;
                    }
                }
            }
            _ => {}
        }
    }
    if removed_any {
        list.retain(|m| !m.is_null());
    }
    Ok(Some(Value::Array(list)))
}
