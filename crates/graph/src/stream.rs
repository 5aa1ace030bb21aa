//! Stream events as typed values. The server crate turns them into SSE frames; the payloads
//! (`data`) already have LangGraph's shapes so the server only adds framing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

/// The stream modes of LangGraph Platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamMode {
    /// The whole state after each step.
    Values,
    /// `{node: update}` after each task.
    Updates,
    /// `[message_chunk, metadata]` for each model token (and each message a node returned):
    /// LangGraph's own `messages` mode, which the Platform calls `messages-tuple`.
    Messages,
    /// Whatever nodes wrote with the custom stream writer.
    Custom,
    /// Task start and task result payloads.
    Tasks,
    /// Each checkpoint as `get_state` would show it.
    Checkpoints,
    /// `{step, timestamp, type, payload}` wrappers of checkpoints and tasks.
    Debug,
    /// The Platform's `messages` mode: `messages/metadata` the first time a message id is
    /// seen, then the message accumulated so far as `messages/partial` (token chunks) or
    /// `messages/complete` (whole messages).
    AccumulatedMessages,
    /// LangChain's `astream_events` v2 dicts (`on_chain_start`, `on_chat_model_stream`, ...).
    Events,
    /// Tool calls as they run, in the agent protocol's shapes: `tool-started` when a tool
    /// starts, then `tool-finished` with its tool message or `tool-error`.
    Tools,
}

impl StreamMode {
    /// Every mode.
    pub const ALL: [StreamMode; 10] = [
        StreamMode::Values,
        StreamMode::Updates,
        StreamMode::Messages,
        StreamMode::Custom,
        StreamMode::Tasks,
        StreamMode::Checkpoints,
        StreamMode::Debug,
        StreamMode::AccumulatedMessages,
        StreamMode::Events,
        StreamMode::Tools,
    ];

    /// The mode's name in a request's `stream_mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamMode::Values => "values",
            StreamMode::Updates => "updates",
            StreamMode::Messages => "messages-tuple",
            StreamMode::Custom => "custom",
            StreamMode::Tasks => "tasks",
            StreamMode::Checkpoints => "checkpoints",
            StreamMode::Debug => "debug",
            StreamMode::AccumulatedMessages => "messages",
            StreamMode::Events => "events",
            StreamMode::Tools => "tools",
        }
    }

    /// The SSE event name of the mode's events, before any `/part` or `|namespace`. Both
    /// message modes are sent as `messages...`, as the Platform does.
    pub fn event_base(self) -> &'static str {
        match self {
            StreamMode::Messages | StreamMode::AccumulatedMessages => "messages",
            other => other.as_str(),
        }
    }

    /// Parse a mode name as a request spells it.
    pub fn parse(s: &str) -> Option<StreamMode> {
        StreamMode::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// One event of a run's stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    /// Subgraph path, empty for the root graph: `["child:<task_id>", ...]`.
    pub namespace: Vec<String>,
    /// The mode this event belongs to.
    pub mode: StreamMode,
    /// Which of the mode's events this is, for a mode that has several (`metadata`,
    /// `partial`, `complete` of accumulated messages).
    pub part: Option<&'static str>,
    /// The payload, in LangGraph's shape for the mode.
    pub data: Value,
}

impl StreamEvent {
    /// The event an SSE name stands for (`mode[/part]` then `|ns1|ns2`, as
    /// [`StreamEvent::event_name`] writes it), with its payload; `None` for a name no mode
    /// makes. A Python worker names its events so; `messages` alone is the tuple form.
    pub fn from_name(name: &str, data: Value) -> Option<StreamEvent> {
        let mut parts = name.split('|');
        let head = parts.next()?;
        let namespace = parts.map(str::to_owned).collect();
        let (base, part) = match head.split_once('/') {
            Some((base, part)) => (base, Some(part)),
            None => (head, None),
        };
        let (mode, part) = match (base, part) {
            ("messages", None) => (StreamMode::Messages, None),
            ("messages", Some(part)) => {
                let part = ["metadata", "partial", "complete"]
                    .into_iter()
                    .find(|known| *known == part)?;
                (StreamMode::AccumulatedMessages, Some(part))
            }
            (base, None) => (StreamMode::parse(base)?, None),
            _ => return None,
        };
        Some(StreamEvent {
            namespace,
            mode,
            part,
            data,
        })
    }

    /// The SSE event name LangGraph uses: `mode[/part]` then `|ns1|ns2`.
    pub fn event_name(&self) -> String {
        let mut name = self.mode.event_base().to_string();
        if let Some(part) = self.part {
            name.push('/');
            name.push_str(part);
        }
        for part in &self.namespace {
            name.push('|');
            name.push_str(part);
        }
        name
    }
}

/// Where a run's stream events go: a bounded channel (a slow consumer slows the run instead of
/// growing memory), and a count of the events sent into it.
///
/// The count lets a consumer that also sees the run's saves (the server logs each save with
/// the events emitted before it) tell those events from the ones the run sent after the save
/// but before the consumer got to it. An event is counted once it is in the channel, so every
/// counted event can be received.
#[derive(Clone, Debug)]
pub struct EventSink {
    channel: mpsc::Sender<StreamEvent>,
    sent: Arc<AtomicU64>,
}

impl EventSink {
    /// Sends an event, waiting for room. False when nobody receives any more.
    pub async fn send(&self, event: StreamEvent) -> bool {
        let sent = self.channel.send(event).await.is_ok();
        self.count(sent)
    }

    /// Sends an event if there is room now. `Err` gives it back when the channel is full;
    /// when nobody receives any more it is dropped (`Ok(false)`).
    pub fn try_send(&self, event: StreamEvent) -> Result<bool, StreamEvent> {
        match self.channel.try_send(event) {
            Ok(()) => Ok(self.count(true)),
            Err(mpsc::error::TrySendError::Full(event)) => Err(event),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(false),
        }
    }

    /// The same as [`EventSink::send`], from a thread outside the runtime (scripts run on
    /// blocking threads).
    pub fn blocking_send(&self, event: StreamEvent) -> bool {
        let sent = self.channel.blocking_send(event).is_ok();
        self.count(sent)
    }

    fn count(&self, sent: bool) -> bool {
        if sent {
            self.sent.fetch_add(1, Ordering::Release);
        }
        sent
    }

    /// How many events were sent so far, readable after the sink is gone.
    pub fn sent(&self) -> SentCount {
        SentCount(self.sent.clone())
    }
}

impl From<mpsc::Sender<StreamEvent>> for EventSink {
    fn from(channel: mpsc::Sender<StreamEvent>) -> Self {
        Self {
            channel,
            sent: Arc::default(),
        }
    }
}

/// The number of events an [`EventSink`] sent; holding it does not keep the channel open.
#[derive(Clone, Debug, Default)]
pub struct SentCount(Arc<AtomicU64>);

impl SentCount {
    /// Events sent so far: each of them is in the channel or was received.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// Which modes a run streams, as a bit set so the hot path checks them for free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamModes(u16);

impl StreamModes {
    /// No streaming.
    pub const NONE: StreamModes = StreamModes(0);

    /// Every mode.
    pub fn all() -> Self {
        Self::of(&StreamMode::ALL)
    }

    /// From a list of modes.
    pub fn of(modes: &[StreamMode]) -> Self {
        let mut s = StreamModes(0);
        for m in modes {
            s.insert(*m);
        }
        s
    }

    /// The modes a run streams when it asked for `modes`. Asked for both message forms,
    /// LangGraph Platform sends the tuple form only; so does Spindle.
    pub fn requested(modes: &[StreamMode]) -> Self {
        let mut s = Self::of(modes);
        if s.contains(StreamMode::Messages) {
            s.0 &= !Self::bit(StreamMode::AccumulatedMessages);
        }
        s
    }

    fn bit(mode: StreamMode) -> u16 {
        1 << (mode as u16)
    }

    /// Add a mode.
    pub fn insert(&mut self, mode: StreamMode) {
        self.0 |= Self::bit(mode);
    }

    /// Whether a mode is on.
    pub fn contains(self, mode: StreamMode) -> bool {
        self.0 & Self::bit(mode) != 0
    }

    /// Whether any mode is on.
    pub fn any(self) -> bool {
        self.0 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count is of events in the channel: one nobody can receive is not counted, and the
    /// count outlives the sink (the server reads it for saves asked for at the run's end).
    #[tokio::test]
    async fn a_sink_counts_the_events_it_put_in_its_channel() {
        let (channel, mut events) = mpsc::channel(4);
        let sink = EventSink::from(channel);
        let sent = sink.sent();
        let event = |n: i64| StreamEvent {
            namespace: Vec::new(),
            mode: StreamMode::Custom,
            part: None,
            data: Value::from(n),
        };
        assert!(sink.send(event(1)).await);
        assert!(sink.clone().send(event(2)).await);
        assert_eq!(sent.get(), 2);
        assert_eq!(events.recv().await.unwrap().data, Value::from(1));
        events.close();
        assert!(!sink.send(event(3)).await);
        drop(sink);
        assert_eq!(sent.get(), 2);
    }

    /// A worker's event names read back as the events the engine would have named so.
    #[test]
    fn event_names_read_back() {
        for name in [
            "values",
            "updates|child:1",
            "messages",
            "messages/partial",
            "messages/metadata|a:1|b:2",
            "custom",
            "debug|sub:x",
            "events",
            "tasks",
            "checkpoints",
        ] {
            let event = StreamEvent::from_name(name, Value::Null).unwrap();
            assert_eq!(event.event_name(), name);
        }
        assert_eq!(
            StreamEvent::from_name("messages", Value::Null)
                .unwrap()
                .mode,
            StreamMode::Messages
        );
        assert!(StreamEvent::from_name("messages/bogus", Value::Null).is_none());
        assert!(StreamEvent::from_name("nonsense", Value::Null).is_none());
    }

    #[test]
    fn names_round_trip() {
        for m in StreamMode::ALL {
            assert_eq!(StreamMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(StreamMode::parse("message"), None);
    }

    #[test]
    fn event_names() {
        let e = |mode, part, ns: &[&str]| StreamEvent {
            namespace: ns.iter().map(|s| s.to_string()).collect(),
            mode,
            part,
            data: Value::Null,
        };
        assert_eq!(e(StreamMode::Messages, None, &[]).event_name(), "messages");
        assert_eq!(
            e(StreamMode::AccumulatedMessages, Some("partial"), &[]).event_name(),
            "messages/partial"
        );
        assert_eq!(
            e(StreamMode::Updates, None, &["child:1"]).event_name(),
            "updates|child:1"
        );
    }

    #[test]
    fn the_tuple_form_wins_when_both_message_modes_are_asked_for() {
        let both = StreamModes::requested(&[StreamMode::AccumulatedMessages, StreamMode::Messages]);
        assert!(both.contains(StreamMode::Messages));
        assert!(!both.contains(StreamMode::AccumulatedMessages));
        let one = StreamModes::requested(&[StreamMode::AccumulatedMessages]);
        assert!(one.contains(StreamMode::AccumulatedMessages));
        assert!(StreamModes::all().contains(StreamMode::Events));
    }
}
