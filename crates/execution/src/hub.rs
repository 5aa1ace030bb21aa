//! Live fan-out of run events within this process.
//!
//! The event log in the database is the source of truth; the hub only spares streams a
//! round trip. A stream subscribes here first, then replays the log, then forwards live
//! messages whose seq it has not sent yet — so it sees no gap and no duplicate. Buffers are
//! bounded: a subscriber that falls behind is told it lagged and goes back to the log, so a
//! slow client never makes the server buffer without limit.
//!
//! A thread's buffer holds only the messages some subscriber has yet to read, and grows and
//! shrinks with them. Most followed threads are idle (a client keeps a stream open on each of
//! thousands of threads while few runs execute), so an idle thread's buffer must cost nothing;
//! a fixed-size channel (tokio's `broadcast`, preallocated) cost 60 KB per followed thread.

use spindle_storage::ResourceId;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use spindle_storage::{JsonObject, LoggedEvent, Run, RunStatus};
use tokio::sync::Notify;
use uuid::Uuid;

/// How many messages a thread's buffer holds at most, for its slowest subscriber: past that
/// the oldest is dropped and whoever had not read it lags.
const CAPACITY: usize = 1024;
/// The room a drained buffer keeps (a few hundred bytes), so that a run's events, which
/// subscribers read as they come, do not allocate and free the buffer at each event.
const KEEP: usize = 8;

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
    threads: Mutex<HashMap<ResourceId, Arc<Channel>>>,
    /// Whether every commit to a thread's log is announced here ([`HubMessage::Logged`]), so
    /// streams need not poll the log for what other processes write.
    announced: std::sync::atomic::AtomicBool,
    /// Cancelled when the process stops: its streams end, so clients reconnect elsewhere.
    closing: tokio_util::sync::CancellationToken,
}

/// One followed thread: its buffer, and who waits on it.
struct Channel {
    thread_id: ResourceId,
    buffer: Mutex<Buffer>,
    /// Woken at each message. A waiter registers before it looks at the buffer (see
    /// [`Subscription::recv`]), so a message pushed between its look and its sleep wakes it.
    ready: Notify,
}

/// The messages of a thread that some subscriber has not read yet, oldest first.
///
/// Each message is numbered by its position in the thread's sequence; a subscriber knows the
/// position of the next one it reads. A message counts the subscribers still to read it and
/// leaves the buffer once none is left (or when the buffer is full: then those who had not read
/// it lag), so the buffer is empty whenever every subscriber has caught up.
#[derive(Default)]
struct Buffer {
    /// Each message with the count of subscribers that have yet to read it.
    messages: VecDeque<(HubMessage, usize)>,
    /// The position of `messages[0]`.
    head: u64,
    /// Subscriptions now; changed under the hub's lock as well (see [`EventHub::release`]).
    subscribers: usize,
}

impl Buffer {
    /// The position the next message will have.
    fn tail(&self) -> u64 {
        self.head + self.messages.len() as u64
    }

    fn push(&mut self, message: HubMessage) {
        if self.subscribers == 0 {
            return;
        }
        if self.messages.len() == CAPACITY {
            self.messages.pop_front();
            self.head += 1;
        }
        self.messages.push_back((message, self.subscribers));
    }

    /// The message at `position` for one subscriber, which no longer has to read it.
    fn take(&mut self, position: u64) -> HubMessage {
        let (message, unread) = &mut self.messages[(position - self.head) as usize];
        *unread -= 1;
        let message = message.clone();
        self.drop_read();
        message
    }

    /// One subscriber leaves at `position`: the messages from there on no longer wait for it.
    fn leave(&mut self, position: u64) {
        let from = position.saturating_sub(self.head) as usize;
        for (_, unread) in self.messages.range_mut(from..) {
            *unread -= 1;
        }
        self.subscribers -= 1;
        self.drop_read();
    }

    /// Drops the messages every subscriber has read, and gives back the room a burst left
    /// unused (at a quarter full, so that a buffer hovering at a size does not reallocate).
    fn drop_read(&mut self) {
        while self
            .messages
            .front()
            .is_some_and(|(_, unread)| *unread == 0)
        {
            self.messages.pop_front();
            self.head += 1;
        }
        let capacity = self.messages.capacity();
        if capacity > KEEP && self.messages.len() <= capacity / 4 {
            self.messages.shrink_to(KEEP.max(self.messages.len() * 2));
        }
    }
}

/// A subscriber fell behind: the thread's buffer was full and dropped this many messages it
/// had not read. The log has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagged(pub u64);

impl EventHub {
    /// Subscribes to a thread's messages. The thread's channel lives while someone holds a
    /// subscription to it: dropping the last one removes it, so a process that has served a
    /// million threads holds channels only for the ones being followed now.
    pub fn subscribe(self: &Arc<Self>, thread_id: ResourceId) -> Subscription {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let channel = threads
            .entry(thread_id)
            .or_insert_with(|| {
                Arc::new(Channel {
                    thread_id,
                    buffer: Mutex::default(),
                    ready: Notify::new(),
                })
            })
            .clone();
        let next = {
            let mut buffer = channel.buffer.lock().unwrap_or_else(|e| e.into_inner());
            buffer.subscribers += 1;
            buffer.tail()
        };
        Subscription {
            hub: self.clone(),
            channel,
            next,
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
        let channels: Vec<Arc<Channel>> = {
            let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
            threads.values().cloned().collect()
        };
        for channel in channels {
            channel.send(message.clone());
        }
    }

    /// Whether someone in this process follows the thread now.
    pub fn is_followed(&self, thread_id: ResourceId) -> bool {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads.contains_key(&thread_id)
    }

    pub fn publish(&self, thread_id: ResourceId, message: HubMessage) {
        // Sent outside the map's lock, which every stream's start and end takes. A channel
        // whose last subscription is being dropped meanwhile takes nothing (no subscribers).
        let channel = {
            let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
            threads.get(&thread_id).cloned()
        };
        if let Some(channel) = channel {
            channel.send(message);
        }
    }

    /// Un-counts a subscription being dropped, and forgets the thread's channel when it was
    /// the last. Runs under the map's lock, which `subscribe` also takes, so no subscriber can
    /// appear between the count and the removal.
    fn release(&self, channel: &Channel, next: u64) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let mut buffer = channel.buffer.lock().unwrap_or_else(|e| e.into_inner());
        buffer.leave(next);
        if buffer.subscribers == 0 {
            threads.remove(&channel.thread_id);
        }
    }

    #[cfg(test)]
    fn channels(&self) -> usize {
        self.threads.lock().unwrap().len()
    }

    /// A followed thread's buffer: the messages it holds and its room.
    #[cfg(test)]
    fn buffered(&self, thread_id: ResourceId) -> (usize, usize) {
        let threads = self.threads.lock().unwrap();
        let buffer = threads[&thread_id].buffer.lock().unwrap();
        (buffer.messages.len(), buffer.messages.capacity())
    }
}

impl Channel {
    fn send(&self, message: HubMessage) {
        self.buffer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(message);
        self.ready.notify_waiters();
    }

    /// The message at `next` (then `next` moves on), a lag, or nothing yet.
    fn try_recv(&self, next: &mut u64) -> Option<Result<HubMessage, Lagged>> {
        let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        if *next < buffer.head {
            let missed = buffer.head - *next;
            *next = buffer.head;
            return Some(Err(Lagged(missed)));
        }
        if *next == buffer.tail() {
            return None;
        }
        let message = buffer.take(*next);
        *next += 1;
        Some(Ok(message))
    }
}

/// A live view of one thread's messages; see [`EventHub::subscribe`].
pub struct Subscription {
    hub: Arc<EventHub>,
    /// The thread's channel, which keeps the thread's id once for all its subscribers (an
    /// id takes 132 bytes).
    channel: Arc<Channel>,
    /// The position of the next message this subscriber reads.
    next: u64,
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

    /// The next message, or how many this subscriber missed by falling behind (it then
    /// goes on with the oldest message still buffered). Cancel-safe: a message is taken only
    /// when it is returned.
    pub async fn recv(&mut self) -> Result<HubMessage, Lagged> {
        let (channel, next) = (&*self.channel, &mut self.next);
        loop {
            let ready = channel.ready.notified();
            let mut ready = std::pin::pin!(ready);
            ready.as_mut().enable();
            if let Some(received) = channel.try_recv(next) {
                return received;
            }
            ready.await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.release(&self.channel, self.next);
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

    fn seq(message: HubMessage) -> i64 {
        match message {
            HubMessage::Event(e) => e.seq,
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

    #[tokio::test]
    async fn an_idle_threads_buffer_holds_nothing() {
        let hub = Arc::new(EventHub::default());
        let thread = ResourceId::generate();
        let _subscribers: Vec<_> = (0..3).map(|_| hub.subscribe(thread)).collect();
        assert_eq!(hub.buffered(thread), (0, 0));
    }

    /// The buffer grows with what its slowest subscriber has not read, keeps each message
    /// until every subscriber has it, and gives the room back once they all caught up.
    #[tokio::test]
    async fn the_buffer_grows_with_unread_messages_and_shrinks_when_they_are_read() {
        let hub = Arc::new(EventHub::default());
        let thread = ResourceId::generate();
        let mut fast = hub.subscribe(thread);
        let mut slow = hub.subscribe(thread);
        for n in 1..=300 {
            hub.publish(thread, event(thread, n));
        }
        assert_eq!(hub.buffered(thread).0, 300);
        for n in 1..=300 {
            assert_eq!(seq(fast.recv().await.unwrap()), n);
        }
        assert_eq!(
            hub.buffered(thread).0,
            300,
            "the slow subscriber has read none"
        );
        for n in 1..=290 {
            assert_eq!(seq(slow.recv().await.unwrap()), n);
        }
        let (held, room) = hub.buffered(thread);
        assert_eq!(held, 10);
        assert!(room < 64, "room {room} for 10 messages");
        for n in 291..=300 {
            assert_eq!(seq(slow.recv().await.unwrap()), n);
        }
        let (held, room) = hub.buffered(thread);
        assert_eq!(held, 0);
        assert!(room <= KEEP, "room {room} once drained");
        // A later subscriber starts with what comes next.
        let mut late = hub.subscribe(thread);
        hub.publish(thread, event(thread, 301));
        assert_eq!(seq(late.recv().await.unwrap()), 301);
        assert_eq!(
            hub.buffered(thread).0,
            1,
            "fast and slow have yet to read it"
        );
    }

    /// A subscriber that falls more than the buffer behind is told how many messages it
    /// missed, then goes on with the oldest one kept; the others lose nothing.
    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_it_lagged() {
        let hub = Arc::new(EventHub::default());
        let thread = ResourceId::generate();
        let mut slow = hub.subscribe(thread);
        let mut keeping_up = hub.subscribe(thread);
        let total = CAPACITY as i64 + 5;
        for n in 1..=total {
            hub.publish(thread, event(thread, n));
            assert_eq!(seq(keeping_up.recv().await.unwrap()), n);
        }
        assert_eq!(hub.buffered(thread).0, CAPACITY);
        assert_eq!(slow.recv().await.unwrap_err(), Lagged(5));
        for n in 6..=total {
            assert_eq!(seq(slow.recv().await.unwrap()), n);
        }
        assert_eq!(hub.buffered(thread).0, 0);
    }

    /// Leaving with messages unread releases them: they no longer wait for the one gone.
    #[tokio::test]
    async fn a_subscription_dropped_behind_releases_what_it_had_not_read() {
        let hub = Arc::new(EventHub::default());
        let thread = ResourceId::generate();
        let mut staying = hub.subscribe(thread);
        let leaving = hub.subscribe(thread);
        for n in 1..=3 {
            hub.publish(thread, event(thread, n));
        }
        assert_eq!(seq(staying.recv().await.unwrap()), 1);
        drop(leaving);
        assert_eq!(
            hub.buffered(thread).0,
            2,
            "only what `staying` has not read"
        );
        assert_eq!(seq(staying.recv().await.unwrap()), 2);
        assert_eq!(seq(staying.recv().await.unwrap()), 3);
        assert_eq!(hub.buffered(thread).0, 0);
        // Also when it had fallen behind.
        let lagging = hub.subscribe(thread);
        for n in 4..=(CAPACITY as i64 + 10) {
            hub.publish(thread, event(thread, n));
        }
        drop(lagging);
        assert_eq!(
            hub.buffered(thread).0,
            CAPACITY,
            "`staying` has read none of them"
        );
        drop(staying);
        assert_eq!(hub.channels(), 0);
    }

    /// A waiting subscriber wakes when a message comes; a receive given up (a `select!`
    /// taking another branch) loses nothing.
    #[tokio::test]
    async fn a_waiting_subscriber_wakes_and_a_cancelled_receive_takes_nothing() {
        let hub = Arc::new(EventHub::default());
        let thread = ResourceId::generate();
        let mut sub = hub.subscribe(thread);
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(10), sub.recv());
        assert!(gave_up.await.is_err());
        let waiting = tokio::spawn(async move { seq(sub.recv().await.unwrap()) });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        hub.publish(thread, event(thread, 1));
        assert_eq!(waiting.await.unwrap(), 1);
    }

    /// A resync reaches every followed thread.
    #[tokio::test]
    async fn publish_all_reaches_every_followed_thread() {
        let hub = Arc::new(EventHub::default());
        let (a, b) = (ResourceId::generate(), ResourceId::generate());
        let (mut on_a, mut on_b) = (hub.subscribe(a), hub.subscribe(b));
        hub.publish_all(HubMessage::Logged { seq: i64::MAX });
        for sub in [&mut on_a, &mut on_b] {
            assert!(matches!(
                sub.recv().await,
                Ok(HubMessage::Logged { seq: i64::MAX })
            ));
        }
    }
}
