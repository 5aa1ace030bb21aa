//! Live fan-out of run events within this process.
//!
//! The event log in the database is the source of truth; the hub only spares streams a
//! round trip. A stream subscribes here first, then replays the log, then forwards live
//! messages whose seq it has not sent yet — so it sees no gap and no duplicate. Channels are
//! bounded: a subscriber that falls behind is told it lagged and goes back to the log, so a
//! slow client never makes the server buffer without limit.

use spindle_storage::ResourceId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use spindle_storage::{JsonObject, LoggedEvent, Run, RunStatus};
use tokio::sync::broadcast;
use uuid::Uuid;

/// How many messages a thread's channel holds for its slowest subscriber.
const CAPACITY: usize = 1024;

#[derive(Debug, Clone)]
pub enum HubMessage {
    /// An event of a run of the thread, already numbered.
    Event(Arc<LoggedEvent>),
    /// A run of the thread ended (its end is committed). `ended` carries what was written,
    /// when someone followed the thread as it ended, so waiters answer without reading it
    /// back.
    RunEnded {
        run_id: Uuid,
        status: RunStatus,
        ended: Option<Arc<EndedRun>>,
    },
    /// The thread's log holds events up to `seq`, committed (by any process; see
    /// [`crate::wakeups`]). A stream behind it reads the log.
    Logged { seq: i64 },
}

/// A run as its end left it, with the thread's state written in the same transaction.
#[derive(Debug)]
pub struct EndedRun {
    pub run: Run,
    pub thread_values: Option<Value>,
    pub thread_interrupts: JsonObject,
}

#[derive(Default)]
pub struct EventHub {
    threads: Mutex<HashMap<ResourceId, broadcast::Sender<HubMessage>>>,
    /// Whether every commit to a thread's log is announced here ([`HubMessage::Logged`]), so
    /// streams need not poll the log for what other processes write.
    announced: std::sync::atomic::AtomicBool,
    /// Cancelled when the process stops: its streams end, so clients reconnect elsewhere.
    closing: tokio_util::sync::CancellationToken,
}

impl EventHub {
    /// Subscribes to a thread's messages. The thread's channel lives while someone holds a
    /// subscription to it: dropping the last one removes it, so a process that has served a
    /// million threads holds channels only for the ones being followed now.
    pub fn subscribe(self: &Arc<Self>, thread_id: ResourceId) -> Subscription {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let receiver = threads
            .entry(thread_id)
            .or_insert_with(|| broadcast::channel(CAPACITY).0)
            .subscribe();
        Subscription {
            hub: self.clone(),
            thread_id,
            receiver,
        }
    }

    /// Ends every stream this process serves (a graceful shutdown): their clients resume them
    /// with `Last-Event-ID` on another process.
    pub fn close_streams(&self) {
        self.closing.cancel();
    }

    /// From now on every commit to a thread's log is announced ([`crate::wakeups`]).
    pub fn set_announced(&self) {
        self.announced
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether commits to the log are announced: if not, streams poll it.
    pub fn announced(&self) -> bool {
        self.announced.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends `message` to every thread followed now (a resync after lost announcements).
    pub fn publish_all(&self, message: HubMessage) {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        for sender in threads.values() {
            let _ = sender.send(message.clone());
        }
    }

    /// Whether someone in this process follows the thread now.
    pub fn is_followed(&self, thread_id: ResourceId) -> bool {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads.contains_key(&thread_id)
    }

    pub fn publish(&self, thread_id: ResourceId, message: HubMessage) {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = threads.get(&thread_id) {
            // An error only means nobody listens: the last subscription is being dropped and
            // removes the channel itself.
            let _ = sender.send(message);
        }
    }

    /// Forgets a thread's channel when the subscription being dropped is its last receiver.
    /// Runs under the map's lock, which `subscribe` also takes, so no subscriber can appear
    /// between the count and the removal.
    fn release(&self, thread_id: ResourceId) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if threads
            .get(&thread_id)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            threads.remove(&thread_id);
        }
    }

    #[cfg(test)]
    fn channels(&self) -> usize {
        self.threads.lock().unwrap().len()
    }
}

/// A live view of one thread's messages; see [`EventHub::subscribe`].
pub struct Subscription {
    hub: Arc<EventHub>,
    thread_id: ResourceId,
    receiver: broadcast::Receiver<HubMessage>,
}

impl Subscription {
    /// Cancelled when the process ends its streams ([`EventHub::close_streams`]).
    pub fn closing(&self) -> tokio_util::sync::CancellationToken {
        self.hub.closing.clone()
    }

    /// Whether commits to the thread's log are announced ([`EventHub::announced`]).
    pub fn announced(&self) -> bool {
        self.hub.announced()
    }

    pub async fn recv(&mut self) -> Result<HubMessage, broadcast::error::RecvError> {
        self.receiver.recv().await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // `receiver` is still alive here (fields drop after this), hence `<= 1` in `release`.
        self.hub.release(self.thread_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(thread_id: ResourceId, seq: i64) -> HubMessage {
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
        let hub = Arc::new(EventHub::default());
        let (a, b) = (ResourceId::generate(), ResourceId::generate());
        let mut rx = hub.subscribe(a);
        hub.publish(b, event(b, 1));
        hub.publish(a, event(a, 1));
        match rx.recv().await.unwrap() {
            HubMessage::Event(e) => assert_eq!((e.thread_id, e.seq), (a, 1)),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_threads_channel_goes_with_its_last_subscription() {
        let hub = Arc::new(EventHub::default());
        let thread = ResourceId::generate();
        let first = hub.subscribe(thread);
        let mut second = hub.subscribe(thread);
        drop(first);
        assert_eq!(hub.channels(), 1, "one subscriber is left");
        hub.publish(thread, event(thread, 1));
        assert!(matches!(second.recv().await, Ok(HubMessage::Event(_))));
        drop(second);
        assert_eq!(hub.channels(), 0);
        // Publishing to a thread nobody follows creates nothing.
        hub.publish(thread, event(thread, 2));
        assert_eq!(hub.channels(), 0);
    }
}
