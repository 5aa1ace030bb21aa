//! The channels of one graph during a run, and their conversion to and from checkpoints.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::channels::{apply_writes, clears_when_unwritten, Change, InvalidUpdate};
use crate::checkpoint::blob::FULL_EVERY;
use crate::checkpoint::{BlobValue, ChannelBlob, Checkpoint};
use crate::graph::Graph;

/// Channel holding the `Send`s waiting for the next step.
pub(crate) const TASKS: &str = "__pregel_tasks";
/// Channel holding the run input until the start step consumes it.
pub(crate) const START_INPUT: &str = "__start__";
/// Prefix of the channels that trigger a node.
pub(crate) const BRANCH_TO: &str = "branch:to:";

/// Live channel state of one graph.
#[derive(Debug, Clone)]
pub(crate) struct LoopState {
    pub values: Vec<Option<Value>>,
    pub versions: Vec<u64>,
    pub depths: Vec<u32>,
    /// Per node: version of its trigger channel and the version it last ran on.
    pub trig: Vec<u64>,
    pub seen: Vec<u64>,
    /// `Send`s for the next step: (node, arg).
    pub sends: Vec<(String, Value)>,
    pub sends_version: u64,
    /// Input waiting for the start step.
    pub start_input: Option<Value>,
    pub start_version: u64,
    /// The start step took the input: the next checkpoint records `__start__` as empty, once
    /// (as LangGraph's ephemeral channel, whose version moves only when it is cleared).
    pub start_taken: bool,
    pub max_version: u64,
}

impl LoopState {
    /// Channels at their defaults.
    pub fn fresh(graph: &Graph) -> Self {
        LoopState {
            values: graph.channels.iter().map(|c| c.default.clone()).collect(),
            versions: vec![0; graph.channels.len()],
            depths: vec![0; graph.channels.len()],
            trig: vec![0; graph.nodes.len()],
            seen: vec![0; graph.nodes.len()],
            sends: Vec::new(),
            sends_version: 0,
            start_input: None,
            start_version: 0,
            start_taken: false,
            max_version: 0,
        }
    }

    /// Restore from a checkpoint, taking its values instead of copying them.
    pub fn take_checkpoint(graph: &Graph, mut cp: Checkpoint) -> Self {
        let mut values: Vec<Option<Value>> = graph
            .channels
            .iter()
            .map(|ch| cp.channel_values.remove(&ch.name))
            .collect();
        let mut s = LoopState::from_checkpoint(graph, &cp);
        for (i, v) in values.iter_mut().enumerate() {
            if s.versions[i] > 0 {
                s.values[i] = v.take();
            }
        }
        s
    }

    /// Restore from a checkpoint (values materialised).
    pub fn from_checkpoint(graph: &Graph, cp: &Checkpoint) -> Self {
        let mut s = LoopState::fresh(graph);
        for (i, ch) in graph.channels.iter().enumerate() {
            if let Some(&v) = cp.channel_versions.get(&ch.name) {
                s.versions[i] = v;
                s.values[i] = cp.channel_values.get(&ch.name).cloned();
                s.depths[i] = cp.delta_depths.get(&ch.name).copied().unwrap_or(FULL_EVERY);
            }
        }
        for (i, n) in graph.nodes.iter().enumerate() {
            let key = &graph.trigger_names[i];
            s.trig[i] = cp.channel_versions.get(key).copied().unwrap_or(0);
            s.seen[i] = cp
                .versions_seen
                .get(&n.name)
                .and_then(|m| m.get(key))
                .copied()
                .unwrap_or(0);
        }
        if let Some(Value::Array(items)) = cp.channel_values.get(TASKS) {
            s.sends = items
                .iter()
                .filter_map(|i| Some((i.get("node")?.as_str()?.to_string(), i.get("arg")?.clone())))
                .collect();
        }
        s.sends_version = cp.channel_versions.get(TASKS).copied().unwrap_or(0);
        s.start_input = cp.channel_values.get(START_INPUT).cloned();
        s.start_version = cp.channel_versions.get(START_INPUT).copied().unwrap_or(0);
        s.max_version = cp.channel_versions.values().copied().max().unwrap_or(0);
        s
    }

    /// The state as an object of the keys that have values.
    pub fn state_object(&self, graph: &Graph) -> Value {
        let mut m = Map::new();
        for (i, ch) in graph.channels().iter().enumerate() {
            if let Some(v) = &self.values[i] {
                m.insert(ch.name.clone(), v.clone());
            }
        }
        Value::Object(m)
    }

    /// The given keys only.
    pub fn project(&self, graph: &Graph, keys: &[String]) -> Value {
        let mut m = Map::new();
        for k in keys {
            if let Some(&i) = graph.channel_index.get(k) {
                if let Some(v) = &self.values[i] {
                    m.insert(k.clone(), v.clone());
                }
            }
        }
        Value::Object(m)
    }

    /// Apply one step's writes in order; returns the blobs to save and the channel names
    /// updated. `version` is the new version for every channel written in this step.
    pub fn apply(
        &mut self,
        graph: &Graph,
        writes: &[(usize, Value)],
        version: u64,
    ) -> Result<(Vec<ChannelBlob>, Vec<String>), InvalidUpdate> {
        let n = graph.channels.len();
        let mut grouped: Vec<Vec<Value>> = vec![Vec::new(); n];
        for (ch, v) in writes {
            grouped[*ch].push(v.clone());
        }
        let mut blobs = Vec::new();
        let mut updated = Vec::new();
        for (i, ws) in grouped.iter().enumerate() {
            let spec = &graph.channels[i];
            if ws.is_empty() {
                if clears_when_unwritten(&spec.kind)
                    && self.values[i].is_some()
                    && self.versions[i] > 0
                {
                    self.values[i] = None;
                    self.versions[i] = version;
                    self.depths[i] = 0;
                    blobs.push(ChannelBlob {
                        channel: spec.name.clone(),
                        version,
                        value: BlobValue::Empty,
                    });
                }
                continue;
            }
            let prev_version = self.versions[i];
            let Some(change) = apply_writes(spec, &mut self.values[i], ws)? else {
                continue;
            };
            let depth = self.depths[i] + 1;
            let delta_ok = prev_version > 0 && depth < FULL_EVERY;
            let value = match change {
                Change::Appended(items) if delta_ok => BlobValue::Append {
                    base: prev_version,
                    depth,
                    items,
                },
                Change::Merged(d) if delta_ok && !d.cleared => BlobValue::Upsert {
                    base: prev_version,
                    depth,
                    items: d.upserted,
                    removed: d.removed,
                },
                _ => BlobValue::Full {
                    value: self.values[i].clone().unwrap_or(Value::Null),
                },
            };
            self.depths[i] = value.depth();
            self.versions[i] = version;
            blobs.push(ChannelBlob {
                channel: spec.name.clone(),
                version,
                value,
            });
            updated.push(spec.name.clone());
        }
        Ok((blobs, updated))
    }

    /// The next version number.
    ///
    /// Versions are also at least the current time in microseconds: a fork from an older
    /// checkpoint then never reuses a version (and so a blob key) of a later checkpoint on
    /// another branch of the same thread.
    pub fn next_version(&mut self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.max_version = (self.max_version + 1).max(now);
        self.max_version
    }

    /// A checkpoint of this state. Values are not copied in: they travel as blobs, and
    /// copying a long history at every step is what this design avoids.
    pub fn to_checkpoint(&self, graph: &Graph, id: String, updated: Vec<String>) -> Checkpoint {
        let channel_values = BTreeMap::new();
        let mut channel_versions = BTreeMap::new();
        let mut delta_depths = BTreeMap::new();
        for (i, ch) in graph.channels.iter().enumerate() {
            if self.versions[i] > 0 {
                channel_versions.insert(ch.name.clone(), self.versions[i]);
                if self.depths[i] > 0 {
                    delta_depths.insert(ch.name.clone(), self.depths[i]);
                }
            }
        }
        let mut versions_seen = BTreeMap::new();
        for (i, n) in graph.nodes.iter().enumerate() {
            let key = graph.trigger_names[i].clone();
            if self.trig[i] > 0 {
                channel_versions.insert(key.clone(), self.trig[i]);
            }
            if self.seen[i] > 0 {
                let mut m = BTreeMap::new();
                m.insert(key, self.seen[i]);
                versions_seen.insert(n.name.clone(), m);
            }
        }
        if self.sends_version > 0 {
            channel_versions.insert(TASKS.to_string(), self.sends_version);
        }
        if self.start_version > 0 {
            channel_versions.insert(START_INPUT.to_string(), self.start_version);
        }
        Checkpoint {
            v: 1,
            id,
            ts: crate::checkpoint::now_rfc3339(),
            channel_values,
            channel_versions,
            versions_seen,
            updated_channels: updated,
            delta_depths,
        }
    }

    /// The channel values a load of this state's checkpoint would materialise (the channels
    /// that have a value, and the pending `Send`s).
    pub fn materialised_values(&self, graph: &Graph) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for (i, ch) in graph.channels.iter().enumerate() {
            if let (true, Some(v)) = (self.versions[i] > 0, &self.values[i]) {
                out.insert(ch.name.clone(), v.clone());
            }
        }
        if !self.sends.is_empty() {
            let sends = self
                .sends
                .iter()
                .map(|(n, a)| serde_json::json!({"node": n, "arg": a}))
                .collect();
            out.insert(TASKS.to_string(), Value::Array(sends));
        }
        if let Some(input) = &self.start_input {
            out.insert(START_INPUT.to_string(), input.clone());
        }
        out
    }

    /// Blobs of the bookkeeping channels (sends, start input) at their current versions.
    pub fn bookkeeping_blob(&self, channel: &str) -> ChannelBlob {
        let (version, value) = if channel == TASKS {
            let v = if self.sends.is_empty() {
                BlobValue::Empty
            } else {
                BlobValue::Full {
                    value: Value::Array(
                        self.sends
                            .iter()
                            .map(|(n, a)| serde_json::json!({"node": n, "arg": a}))
                            .collect(),
                    ),
                }
            };
            (self.sends_version, v)
        } else {
            let v = match &self.start_input {
                Some(v) => BlobValue::Full { value: v.clone() },
                None => BlobValue::Empty,
            };
            (self.start_version, v)
        };
        ChannelBlob {
            channel: channel.to_string(),
            version,
            value,
        }
    }
}
