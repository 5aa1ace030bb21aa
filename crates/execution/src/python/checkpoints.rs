//! `cp.*` calls of a worker's saver, in Spindle's checkpoint tables
//! (`docs/python-worker-protocol.md`, "Values" and "Shapes").
//!
//! A LangGraph checkpoint fits the engine's model as it is: a skeleton of channel versions,
//! one blob per `(channel, version)`, pending writes per task. Only the values differ: the
//! worker's are LangGraph's own serialization, `[type, bytes]`, which Spindle keeps as they
//! came and never decodes. In the engine's JSON model such a value is an object
//! `{"lg": type, "b64": bytes}` ([`PyValue`]), so both backends store, copy, roll back and
//! delete Python threads with the code they use for every thread.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rmpv::Value as Msg;
use serde::Deserialize;
use serde_json::{json, Value};
use spindle_graph::checkpoint::{
    BlobValue, ChannelBlob, ChannelVersion, Checkpoint, CheckpointTuple, ListFilter, PendingWrite,
    QueuedWrite,
};

use super::connection::RemoteError;
use super::frame::from_body;

/// The value type a cleared channel travels as (stored as the engine's empty blob).
const EMPTY: &str = "empty";

/// A LangGraph value as the engine's model holds it: its serializer's type and bytes.
pub struct PyValue {
    pub type_name: String,
    pub bytes: Vec<u8>,
}

impl PyValue {
    fn to_json(&self) -> Value {
        json!({"lg": self.type_name, "b64": BASE64.encode(&self.bytes)})
    }

    fn from_json(value: &Value) -> Result<PyValue, RemoteError> {
        let type_name = value.get("lg").and_then(Value::as_str);
        let bytes = value.get("b64").and_then(Value::as_str);
        match (type_name, bytes) {
            (Some(type_name), Some(bytes)) => Ok(PyValue {
                type_name: type_name.to_owned(),
                bytes: BASE64.decode(bytes).map_err(|e| {
                    RemoteError::internal(format!("a stored Python value is corrupt: {e}"))
                })?,
            }),
            // A value Spindle's engine wrote: this thread's checkpoints are not a Python graph's.
            _ => Err(RemoteError::bad_request(
                "this thread's checkpoints were written by a graph file, not by a Python graph",
            )),
        }
    }

    fn to_msg(&self) -> Vec<Msg> {
        vec![
            Msg::from(self.type_name.as_str()),
            Msg::Binary(self.bytes.clone()),
        ]
    }
}

/// The protocol's `config`: where a checkpoint is.
#[derive(Debug, Clone, Deserialize)]
pub struct WireConfig {
    pub thread_id: String,
    /// Absent in a `cp.list`: every namespace.
    #[serde(default)]
    pub checkpoint_ns: Option<String>,
    #[serde(default)]
    pub checkpoint_id: Option<String>,
}

impl WireConfig {
    pub fn namespace(&self) -> &str {
        self.checkpoint_ns.as_deref().unwrap_or("")
    }
}

/// The skeleton a worker sends: LangGraph's `Checkpoint` without `channel_values`.
#[derive(Deserialize)]
struct Skeleton {
    v: u32,
    id: String,
    ts: String,
    #[serde(default)]
    channel_versions: std::collections::BTreeMap<String, ChannelVersion>,
    #[serde(default)]
    versions_seen:
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, ChannelVersion>>,
    /// `None` and `[]` mean the same to LangGraph (every node is looked at).
    #[serde(default)]
    updated_channels: Option<Vec<String>>,
}

/// `[channel, version, type, bytes]`; an `empty` one may come without bytes.
#[derive(Deserialize)]
struct WireBlob(
    String,
    ChannelVersion,
    String,
    #[serde(default)] Option<serde_bytes::ByteBuf>,
);

/// `[channel, type, bytes]` of a `cp.writes`.
#[derive(Deserialize)]
struct WireWrite(String, String, serde_bytes::ByteBuf);

#[derive(Deserialize)]
struct PutBody {
    config: WireConfig,
    checkpoint: Skeleton,
    #[serde(default)]
    metadata: Value,
    #[serde(default)]
    blobs: Vec<WireBlob>,
}

#[derive(Deserialize)]
struct WritesBody {
    config: WireConfig,
    task_id: String,
    writes: Vec<WireWrite>,
}

#[derive(Deserialize)]
pub struct GetBody {
    pub config: WireConfig,
}

#[derive(Deserialize)]
pub struct ListBody {
    pub config: Option<WireConfig>,
    #[serde(default)]
    pub filter: Option<Value>,
    #[serde(default)]
    pub before: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
}

impl ListBody {
    pub fn filter(&self) -> ListFilter {
        ListFilter {
            before: self.before.clone(),
            limit: self.limit,
            metadata: self.filter.clone().filter(Value::is_object),
        }
    }
}

fn bad(what: &str, error: impl std::fmt::Display) -> RemoteError {
    RemoteError::bad_request(format!("bad {what}: {error}"))
}

pub fn parse<T: serde::de::DeserializeOwned>(op: &str, body: Msg) -> Result<T, RemoteError> {
    from_body(body).map_err(|e| bad(op, e))
}

/// A `cp.put` as the save the engine's checkpointer takes, and the config it answers with.
pub fn put_write(body: Msg) -> Result<(QueuedWrite, Msg), RemoteError> {
    let put: PutBody = parse("cp.put", body)?;
    let skeleton = put.checkpoint;
    let mut blobs = Vec::with_capacity(put.blobs.len());
    for WireBlob(channel, version, type_name, bytes) in put.blobs {
        let value = if type_name == EMPTY {
            BlobValue::Empty
        } else {
            let bytes = bytes
                .map(serde_bytes::ByteBuf::into_vec)
                .unwrap_or_default();
            BlobValue::Full {
                value: PyValue { type_name, bytes }.to_json(),
            }
        };
        blobs.push(ChannelBlob {
            channel,
            version,
            value,
        });
    }
    let thread_id = put.config.thread_id.clone();
    let checkpoint_ns = put.config.namespace().to_owned();
    let stored = config_msg(&thread_id, &checkpoint_ns, &skeleton.id);
    let write = QueuedWrite::Checkpoint {
        thread_id,
        checkpoint_ns,
        checkpoint: Box::new(Checkpoint {
            v: skeleton.v,
            id: skeleton.id,
            ts: skeleton.ts,
            channel_values: Default::default(),
            channel_versions: skeleton.channel_versions,
            versions_seen: skeleton.versions_seen,
            updated_channels: skeleton.updated_channels.unwrap_or_default(),
            delta_depths: Default::default(),
        }),
        metadata: put.metadata,
        parent_id: put.config.checkpoint_id,
        blobs,
    };
    Ok((write, Msg::Map(vec![(Msg::from("config"), stored)])))
}

/// A `cp.writes` as the save the engine's checkpointer takes.
pub fn writes_write(body: Msg) -> Result<QueuedWrite, RemoteError> {
    let body: WritesBody = parse("cp.writes", body)?;
    let Some(checkpoint_id) = body.config.checkpoint_id.clone() else {
        return Err(RemoteError::bad_request(
            "cp.writes: config.checkpoint_id (the checkpoint the task ran on) is missing",
        ));
    };
    let writes = body
        .writes
        .into_iter()
        .map(|WireWrite(channel, type_name, bytes)| PendingWrite {
            task_id: body.task_id.clone(),
            channel,
            value: PyValue {
                type_name,
                bytes: bytes.into_vec(),
            }
            .to_json(),
        })
        .collect();
    Ok(QueuedWrite::Writes {
        thread_id: body.config.thread_id.clone(),
        checkpoint_ns: body.config.namespace().to_owned(),
        checkpoint_id,
        writes,
    })
}

fn config_msg(thread_id: &str, checkpoint_ns: &str, checkpoint_id: &str) -> Msg {
    Msg::Map(vec![
        (Msg::from("thread_id"), Msg::from(thread_id)),
        (Msg::from("checkpoint_ns"), Msg::from(checkpoint_ns)),
        (Msg::from("checkpoint_id"), Msg::from(checkpoint_id)),
    ])
}

fn json_msg(value: &Value) -> Result<Msg, RemoteError> {
    rmpv::ext::to_value(value).map_err(|e| RemoteError::internal(e.to_string()))
}

/// A stored checkpoint as the protocol's `tuple`.
pub fn tuple_msg(tuple: &CheckpointTuple) -> Result<Msg, RemoteError> {
    let at = &tuple.at;
    let checkpoint = &tuple.checkpoint;
    let mut blobs = Vec::with_capacity(checkpoint.channel_values.len());
    for (channel, value) in &checkpoint.channel_values {
        let version = checkpoint.channel_versions.get(channel).copied();
        let mut blob = vec![Msg::from(channel.as_str()), Msg::from(version.unwrap_or(0))];
        blob.extend(PyValue::from_json(value)?.to_msg());
        blobs.push(Msg::Array(blob));
    }
    let mut writes = Vec::with_capacity(tuple.pending_writes.len());
    for write in &tuple.pending_writes {
        let mut entry = vec![
            Msg::from(write.task_id.as_str()),
            Msg::from(write.channel.as_str()),
        ];
        entry.extend(PyValue::from_json(&write.value)?.to_msg());
        writes.push(Msg::Array(entry));
    }
    let skeleton = json!({
        "v": checkpoint.v,
        "id": checkpoint.id,
        "ts": checkpoint.ts,
        "channel_versions": checkpoint.channel_versions,
        "versions_seen": checkpoint.versions_seen,
        "updated_channels": checkpoint.updated_channels,
    });
    let parent = match &tuple.parent_id {
        Some(parent) => config_msg(&at.thread_id, &at.checkpoint_ns, parent),
        None => Msg::Nil,
    };
    Ok(Msg::Map(vec![
        (
            Msg::from("config"),
            config_msg(&at.thread_id, &at.checkpoint_ns, &at.checkpoint_id),
        ),
        (Msg::from("checkpoint"), json_msg(&skeleton)?),
        (Msg::from("metadata"), json_msg(&tuple.metadata)?),
        (Msg::from("parent_config"), parent),
        (Msg::from("channel_values"), Msg::Array(blobs)),
        (Msg::from("pending_writes"), Msg::Array(writes)),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_body() -> Msg {
        rmpv::ext::to_value(json!({
            "run": ["r", 1],
            "config": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "p"},
            "checkpoint": {"v": 4, "id": "c", "ts": "2026-01-01T00:00:00+00:00",
                           "channel_versions": {"a": 2, "branch:to:n": 1, "gone": 3},
                           "versions_seen": {"n": {"a": 1}}, "updated_channels": null},
            "metadata": {"step": 1, "source": "loop"},
            "blobs": [],
        }))
        .unwrap()
    }

    /// A saved checkpoint comes back as it went: the same skeleton, and each value's type
    /// and bytes untouched (the engine's model only wraps them).
    #[test]
    fn a_checkpoint_comes_back_as_the_worker_sent_it() {
        let Msg::Map(mut entries) = put_body() else {
            unreachable!()
        };
        let blobs_sent = Msg::Array(vec![
            Msg::Array(vec![
                "a".into(),
                2.into(),
                "msgpack".into(),
                Msg::Binary(vec![0x93, 1, 2, 0xff]),
            ]),
            Msg::Array(vec![
                "branch:to:n".into(),
                1.into(),
                "null".into(),
                Msg::Binary(vec![]),
            ]),
            Msg::Array(vec!["gone".into(), 3.into(), "empty".into(), Msg::Nil]),
        ]);
        for (key, value) in entries.iter_mut() {
            if key.as_str() == Some("blobs") {
                *value = blobs_sent.clone();
            }
        }
        let (write, reply) = put_write(Msg::Map(entries)).unwrap();
        assert_eq!(reply["config"]["checkpoint_id"].as_str(), Some("c"));
        let QueuedWrite::Checkpoint {
            checkpoint,
            metadata,
            parent_id,
            blobs,
            ..
        } = write
        else {
            panic!("a checkpoint")
        };
        assert_eq!(parent_id.as_deref(), Some("p"));
        assert_eq!(blobs[2].value, BlobValue::Empty);
        // What a load makes of it: empty blobs give no value.
        let mut loaded = (*checkpoint).clone();
        for blob in &blobs {
            if let BlobValue::Full { value } = &blob.value {
                loaded
                    .channel_values
                    .insert(blob.channel.clone(), value.clone());
            }
        }
        let tuple = CheckpointTuple {
            at: spindle_graph::checkpoint::CheckpointRef {
                thread_id: "t".into(),
                checkpoint_ns: String::new(),
                checkpoint_id: "c".into(),
            },
            checkpoint: loaded,
            metadata,
            parent_id,
            pending_writes: vec![],
        };
        let msg = tuple_msg(&tuple).unwrap();
        let values = msg["channel_values"].as_array().unwrap();
        let sent = blobs_sent.as_array().unwrap();
        assert_eq!(values, &sent[..2], "the empty one is not given back");
        assert_eq!(msg["checkpoint"]["v"].as_u64(), Some(4));
        assert_eq!(msg["metadata"]["source"].as_str(), Some("loop"));
        assert_eq!(msg["parent_config"]["checkpoint_id"].as_str(), Some("p"));
    }

    #[test]
    fn a_write_keeps_its_type_and_bytes() {
        let body = rmpv::ext::to_value(json!({
            "config": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c"},
            "task_id": "task", "task_path": "~", "writes": [],
        }))
        .unwrap();
        let Msg::Map(mut entries) = body else {
            unreachable!()
        };
        for (key, value) in entries.iter_mut() {
            if key.as_str() == Some("writes") {
                *value = Msg::Array(vec![Msg::Array(vec![
                    "__interrupt__".into(),
                    "msgpack".into(),
                    Msg::Binary(vec![1, 2, 3]),
                ])]);
            }
        }
        let QueuedWrite::Writes { writes, .. } = writes_write(Msg::Map(entries)).unwrap() else {
            panic!("writes")
        };
        let value = PyValue::from_json(&writes[0].value).unwrap();
        assert_eq!(
            (value.type_name.as_str(), value.bytes),
            ("msgpack", vec![1, 2, 3])
        );
    }

    /// A thread a graph file wrote cannot be read by a Python graph: said, not garbled.
    #[test]
    fn a_graph_files_value_is_refused_with_a_reason() {
        let err = PyValue::from_json(&json!({"n": 1})).err().unwrap();
        assert!(err.message.contains("graph file"), "{}", err.message);
    }
}
