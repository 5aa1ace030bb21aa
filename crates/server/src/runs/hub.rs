//! Live fan-out of run events within this process.
//!
//! The event log in the database is the source of truth; the hub only spares streams a
//! round trip. A stream subscribes here first, then replays the log, then forwards live
//! messages whose seq it has not sent yet — so it sees no gap and no duplicate. Channels are
//! bounded: a subscriber that falls behind is told it lagged and goes back to the log, so a
//! slow client never makes the server buffer without limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use spindle_storage::{LoggedEvent, RunStatus};
use tokio::sync::broadcast;
use uuid::Uuid;

/// How many messages a thread's channel holds for its slowest subscriber.
const CAPACITY: usize = 1024;

#[derive(Debug, Clone)]
pub enum HubMessage {
    /// An event of a run of the thread, already numbered.
    Event(Arc<LoggedEvent>),
    /// A run of the thread ended (its end is committed).
    RunEnded { run_id: Uuid, status: RunStatus },
}

#[derive(Default)]
pub struct EventHub {
    threads: Mutex<HashMap<Uuid, broadcast::Sender<HubMessage>>>,
}

impl EventHub {
    pub fn subscribe(&self, thread_id: Uuid) -> broadcast::Receiver<HubMessage> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads
            .entry(thread_id)
            .or_insert_with(|| broadcast::channel(CAPACITY).0)
            .subscribe()
    }

    pub fn publish(&self, thread_id: Uuid, message: HubMessage) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = threads.get(&thread_id) {
            if sender.send(message).is_err() {
                // Nobody listens any more: forget the channel so idle threads cost nothing.
                threads.remove(&thread_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(thread_id: Uuid, seq: i64) -> HubMessage {
        HubMessage::Event(Arc::new(LoggedEvent {
            thread_id,
            seq,
            run_id: Uuid::nil(),
            event: "values".into(),
            data: json!({}),
            created_at: chrono::Utc::now(),
        }))
    }

    #[tokio::test]
    async fn subscribers_get_their_threads_messages_only() {
        let hub = EventHub::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut rx = hub.subscribe(a);
        hub.publish(b, event(b, 1));
        hub.publish(a, event(a, 1));
        match rx.recv().await.unwrap() {
            HubMessage::Event(e) => assert_eq!((e.thread_id, e.seq), (a, 1)),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn channels_without_subscribers_are_dropped() {
        let hub = EventHub::default();
        let thread = Uuid::new_v4();
        drop(hub.subscribe(thread));
        hub.publish(thread, event(thread, 1));
        assert!(hub.threads.lock().unwrap().is_empty());
    }
}
