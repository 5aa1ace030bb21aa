//! The read side of protocol v2: a logged event to the protocol's event envelope, and the
//! subscription filter (channels, namespace prefixes, depth, `since`).
//!
//! A logged event becomes at most one envelope, and the envelope's `seq` is the event's log
//! seq, so resuming with `since` is a read of the log after that seq. The one piece of
//! state is a one-event look-back: a v2 run's worker logs its terminal lifecycle event
//! right before the run's `end` marker, which then stands for nothing; a run that ended
//! without its worker (cancelled while pending, lost worker) gets its lifecycle end from the
//! marker instead.

use std::collections::HashSet;

use bytes::Bytes;
use serde_json::{json, Value};
use spindle_storage::{LoggedEvent, RUN_END_EVENT};
use uuid::Uuid;

use super::{input_requested, split_name};
use crate::sse;

/// What a subscription selects.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub channels: HashSet<String>,
    /// Namespace prefixes; empty selects every namespace.
    pub namespaces: Vec<Vec<String>>,
    /// How far below a prefix an event may be.
    pub depth: Option<usize>,
}

impl Filter {
    /// Whether an envelope belongs to this subscription.
    pub fn matches(&self, envelope: &Value) -> bool {
        let method = envelope["method"].as_str().unwrap_or_default();
        let channel = if method == "input.requested" {
            "input"
        } else {
            method
        };
        let selected = if channel == "custom" {
            let name = envelope["params"]["data"]["name"].as_str();
            self.channels.contains("custom")
                || name.is_some_and(|n| self.channels.contains(&format!("custom:{n}")))
        } else {
            self.channels.contains(channel)
        };
        if !selected {
            return false;
        }
        let ns: Vec<&str> = envelope["params"]["namespace"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        self.namespaces.is_empty()
            || self.namespaces.iter().any(|prefix| {
                is_prefix(&ns, prefix) && self.depth.is_none_or(|d| ns.len() - prefix.len() <= d)
            })
    }
}

/// Whether `ns` starts with `prefix`; a prefix segment without `:` also matches a segment
/// that adds a task id (`child` matches `child:3f2a`), as the reference compares them.
pub fn is_prefix(ns: &[&str], prefix: &[String]) -> bool {
    prefix.len() <= ns.len()
        && prefix.iter().zip(ns).all(|(want, have)| {
            want == have || (!want.contains(':') && have.split(':').next() == Some(want))
        })
}

/// What one subscription selects, and how far it has seen the log.
#[derive(Debug, Clone)]
pub struct Selector {
    pub filter: Filter,
    /// Events with seq at or below this were seen by the client.
    pub since: i64,
}

/// Turns a thread's logged events into filtered frames, in log order. It selects for one
/// subscription (an SSE stream) or several (a WebSocket, which sends an event once when
/// several of its subscriptions select it).
#[derive(Debug)]
pub struct Framer {
    selectors: Vec<Selector>,
    /// The run whose last logged event was its terminal lifecycle event.
    just_ended: Option<Uuid>,
    /// Frames are the bare JSON envelope (a WebSocket message), not SSE.
    bare: bool,
}

impl Framer {
    pub fn new(filter: Filter, since: i64) -> Self {
        Self {
            selectors: vec![Selector { filter, since }],
            just_ended: None,
            bare: false,
        }
    }

    /// A framer for several subscriptions whose frames are the bare JSON envelopes, for the
    /// WebSocket.
    pub fn bare(selectors: Vec<Selector>) -> Self {
        Self {
            selectors,
            just_ended: None,
            bare: true,
        }
    }

    /// The seq after which this framer must read the log: one before the earliest `since`,
    /// so that the look-back sees the event just before the first one it may send.
    pub fn read_after(&self) -> i64 {
        let since = self.selectors.iter().map(|s| s.since).min().unwrap_or(0);
        (since - 1).max(0)
    }

    /// The envelope of a logged event, if it has one and a subscription selects it.
    /// Every event must pass through here in order (the look-back), sent or not.
    pub fn envelope(&mut self, event: &LoggedEvent) -> Option<Value> {
        let ended_before = self.just_ended.take();
        let envelope = envelope(event, ended_before == Some(event.run_id))?;
        if is_root_terminal(&envelope) {
            self.just_ended = Some(event.run_id);
        }
        self.selectors
            .iter()
            .any(|s| event.seq > s.since && s.filter.matches(&envelope))
            .then_some(envelope)
    }

    /// The SSE frame of a logged event, if it belongs on the stream.
    pub fn frame(&mut self, event: &LoggedEvent) -> Option<Bytes> {
        let envelope = self.envelope(event)?;
        if self.bare {
            return Some(Bytes::from(envelope.to_string()));
        }
        let method = envelope["method"].as_str().unwrap_or("event").to_owned();
        Some(sse::json_frame(&method, &envelope, Some(event.seq)))
    }
}

fn is_root_terminal(envelope: &Value) -> bool {
    envelope["method"] == "lifecycle"
        && envelope["params"]["namespace"]
            .as_array()
            .is_some_and(Vec::is_empty)
        && matches!(
            envelope["params"]["data"]["event"].as_str(),
            Some("completed" | "failed" | "interrupted")
        )
}

/// The protocol envelope of a logged event. `ended` says the run's terminal lifecycle event
/// came just before (so its `end` marker adds nothing).
pub fn envelope(event: &LoggedEvent, ended: bool) -> Option<Value> {
    let (method, namespace) = split_name(&event.event);
    let data = &event.data;
    let (method, data) = match method {
        "lifecycle" | "input.requested" | "tools" | "tasks" => (method, data.clone()),
        "messages" if data.get("event").is_some_and(Value::is_string) => ("messages", data.clone()),
        "values" => ("values", strip_interrupt(data)?),
        "updates" => return update(event, namespace),
        // The written value itself, as the reference's v2 runs send it: a dict's `name` is
        // what `custom:NAME` selects and what the clients' extension streams read.
        "custom" => ("custom", data.clone()),
        "checkpoints" => ("checkpoints", checkpoint(data)?),
        RUN_END_EVENT if !ended => ("lifecycle", run_end(data)?),
        _ => return None,
    };
    Some(wrap(event, method, namespace, data, None))
}

fn wrap(
    event: &LoggedEvent,
    method: &str,
    namespace: Vec<String>,
    data: Value,
    node: Option<Value>,
) -> Value {
    let mut params = json!({
        "namespace": namespace,
        "timestamp": event.created_at.timestamp_millis(),
        "data": data,
    });
    if let Some(node) = node {
        params["node"] = node;
    }
    json!({
        "type": "event",
        "event_id": event.seq.to_string(),
        "seq": event.seq,
        "method": method,
        "params": params,
    })
}

/// `{node: update}` as the engine made it, which is what the reference's v2 runs send, with
/// the node in `params.node` as well; an interrupt reported by a plain run as
/// `input.requested` (v2 runs log that event themselves).
fn update(event: &LoggedEvent, namespace: Vec<String>) -> Option<Value> {
    let object = event.data.as_object()?;
    let node = match object.len() {
        1 => object.keys().next().cloned(),
        _ => None,
    };
    if node.as_deref() == Some("__interrupt__") {
        let first = object.get("__interrupt__")?.as_array()?.first()?;
        let data = input_requested(first.get("id")?, first.get("value"));
        return Some(wrap(event, "input.requested", namespace, data, None));
    }
    Some(wrap(
        event,
        "updates",
        namespace,
        event.data.clone(),
        node.map(Value::String),
    ))
}

fn strip_interrupt(values: &Value) -> Option<Value> {
    let mut values = values.clone();
    if let Some(object) = values.as_object_mut() {
        object.remove("__interrupt__");
    }
    Some(values)
}

/// A checkpoint as the engine streams it (`get_state`'s shape) to the protocol's
/// `{id, parent_id?, step, source}`.
fn checkpoint(data: &Value) -> Option<Value> {
    if data.get("id").is_some_and(Value::is_string) {
        return Some(data.clone());
    }
    let id = data["config"]["configurable"]["checkpoint_id"].as_str()?;
    let mut out = json!({
        "id": id,
        "step": data["metadata"]["step"].as_i64().unwrap_or(0),
        "source": data["metadata"]["source"].as_str().unwrap_or("loop"),
    });
    if let Some(parent) = data["parent_config"]["configurable"]["checkpoint_id"].as_str() {
        out["parent_id"] = json!(parent);
    }
    Some(out)
}

/// The lifecycle end of a run from its `end` marker `{run_id, status}`.
fn run_end(data: &Value) -> Option<Value> {
    let status = match data.get("status")?.as_str()? {
        "success" => "completed",
        "interrupted" => "interrupted",
        "pending" | "running" => return None,
        _ => "failed",
    };
    Some(json!({"event": status}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_storage::ResourceId;

    fn logged(seq: i64, run: Uuid, name: &str, data: Value) -> LoggedEvent {
        LoggedEvent {
            thread_id: ResourceId::from(Uuid::nil()),
            seq,
            run_id: run,
            event: name.into(),
            data,
            created_at: chrono::Utc::now(),
        }
    }

    fn filter(channels: &[&str]) -> Filter {
        Filter {
            channels: channels.iter().map(|c| c.to_string()).collect(),
            ..Filter::default()
        }
    }

    #[test]
    fn the_envelope_carries_the_log_seq_and_namespace() {
        let run = Uuid::new_v4();
        let e = envelope(
            &logged(
                7,
                run,
                "values|child:1",
                json!({"a": 1, "__interrupt__": []}),
            ),
            false,
        )
        .unwrap();
        assert_eq!(e["type"], "event");
        assert_eq!(e["seq"], 7);
        assert_eq!(e["event_id"], "7");
        assert_eq!(e["method"], "values");
        assert_eq!(e["params"]["namespace"], json!(["child:1"]));
        assert_eq!(e["params"]["data"], json!({"a": 1}));
        assert!(e["params"]["timestamp"].is_i64());
    }

    #[test]
    fn updates_are_keyed_by_their_node() {
        let e = envelope(
            &logged(1, Uuid::nil(), "updates", json!({"ask": {"x": 1}})),
            false,
        )
        .unwrap();
        assert_eq!(e["params"]["data"], json!({"ask": {"x": 1}}));
        assert_eq!(e["params"]["node"], "ask");
    }

    #[test]
    fn custom_data_is_the_written_value_and_its_name_selects_it() {
        let run = Uuid::nil();
        let at = |seq, data: Value| envelope(&logged(seq, run, "custom", data), false).unwrap();
        let named = at(1, json!({"name": "progress", "pct": 50}));
        assert_eq!(
            named["params"]["data"],
            json!({"name": "progress", "pct": 50})
        );
        let plain = at(2, json!("plain"));
        assert_eq!(plain["params"]["data"], json!("plain"));
        let progress = filter(&["custom:progress"]);
        assert!(progress.matches(&named));
        assert!(!progress.matches(&plain));
        assert!(!progress.matches(&at(3, json!({"tick": "a"}))));
        assert!(!progress.matches(&at(4, json!({"name": "other"}))));
        assert!(filter(&["custom"]).matches(&plain));
    }

    #[test]
    fn a_plain_runs_interrupt_is_input_requested_with_payload_and_value() {
        let update = json!({"__interrupt__": [{"id": "i1", "value": {"q": 1}}]});
        let e = envelope(&logged(1, Uuid::nil(), "updates", update), false).unwrap();
        assert_eq!(e["method"], "input.requested");
        assert_eq!(
            e["params"]["data"],
            json!({"interrupt_id": "i1", "payload": {"q": 1}, "value": {"q": 1}})
        );
    }

    #[test]
    fn an_end_marker_after_the_terminal_lifecycle_stands_for_nothing() {
        let run = Uuid::new_v4();
        let mut framer = Framer::new(filter(&["lifecycle"]), 0);
        let terminal = logged(
            1,
            run,
            "lifecycle",
            json!({"event": "completed", "graph_name": "g"}),
        );
        assert!(framer.envelope(&terminal).is_some());
        let end = logged(2, run, "end", json!({"run_id": run, "status": "success"}));
        assert!(framer.envelope(&end).is_none());
        // A run that ended without its worker: the marker is its end.
        let other = Uuid::new_v4();
        let end = logged(
            3,
            other,
            "end",
            json!({"run_id": other, "status": "interrupted"}),
        );
        assert_eq!(
            framer.envelope(&end).unwrap()["params"]["data"]["event"],
            "interrupted"
        );
    }

    #[test]
    fn since_and_channels_filter() {
        let run = Uuid::new_v4();
        let mut framer = Framer::new(filter(&["values", "custom:progress"]), 1);
        assert!(framer
            .envelope(&logged(1, run, "values", json!({})))
            .is_none());
        assert!(framer
            .envelope(&logged(2, run, "values", json!({})))
            .is_some());
        assert!(framer
            .envelope(&logged(3, run, "updates", json!({"a": {}})))
            .is_none());
        assert!(framer
            .envelope(&logged(4, run, "custom", json!(1)))
            .is_none());
    }

    #[test]
    fn several_subscriptions_select_an_event_once_each_from_its_own_since() {
        let run = Uuid::new_v4();
        let values = Selector {
            filter: filter(&["values"]),
            since: 3,
        };
        let updates = Selector {
            filter: filter(&["updates"]),
            since: 0,
        };
        let mut framer = Framer::bare(vec![values, updates]);
        assert_eq!(framer.read_after(), 0);
        let at = |framer: &mut Framer, seq, name: &str, data| {
            framer.frame(&logged(seq, run, name, data)).is_some()
        };
        assert!(at(&mut framer, 1, "updates", json!({"a": {}})));
        assert!(!at(&mut framer, 2, "values", json!({})), "before its since");
        assert!(at(&mut framer, 4, "values", json!({})));
        assert!(!at(&mut framer, 5, "custom", json!(1)), "nobody selects it");
        let frame = framer
            .frame(&logged(6, run, "values", json!({"x": 1})))
            .unwrap();
        let bare: Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(bare["seq"], 6, "a bare envelope, not an SSE frame");
    }

    #[test]
    fn namespaces_match_by_prefix_and_depth() {
        let f = Filter {
            channels: ["values".to_string()].into(),
            namespaces: vec![vec!["child".into()]],
            depth: Some(0),
        };
        let at = |ns: &str| {
            envelope(
                &logged(1, Uuid::nil(), &format!("values{ns}"), json!({})),
                false,
            )
            .unwrap()
        };
        assert!(f.matches(&at("|child:1")));
        assert!(!f.matches(&at("|child:1|grand:2")));
        assert!(!f.matches(&at("")));
        assert!(!f.matches(&at("|other:1")));
    }
}
