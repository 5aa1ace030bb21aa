//! The WebSocket at `/threads/{thread_id}/stream/events`: commands and events on one
//! connection, as the reference serves it. Commands are answered as over HTTP; the
//! subscription commands are this transport's own.
//!
//! One follower per socket reads the thread's log (hub first, log after the earliest
//! `since`, then live) and sends an event once when any subscription selects it, so events
//! reach the client in seq order whatever the subscriptions overlap. A change of
//! subscriptions stops the follower between two events and starts a new one where the
//! socket left off; a new subscription's replay from its own `since` comes first.

use spindle_storage::ResourceId;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::ws::{Message, WebSocket};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use spindle_execution::metrics::StreamKind;
use spindle_storage::Scope;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::commands::{self, Failure};
use super::envelope::{Filter, Framer, Selector};
use crate::auth::AuthUser;
use crate::routes::thread_events::{parse_request, protocol_follow, Refusal, StreamRequest};
use crate::runs::stream::follow_stream;
use crate::state::AppState;

/// How many recently sent seqs a socket remembers, so that a subscription replaying from
/// before what the socket has sent does not send an event twice.
const SENT_WINDOW: usize = 4096;

/// What a socket has sent: recent seqs and the highest one (`applied_through_seq`).
#[derive(Default)]
struct Sent {
    recent: VecDeque<i64>,
    seen: HashSet<i64>,
    highest: i64,
}

impl Sent {
    /// Records a seq; false when it was sent already.
    fn first_time(&mut self, seq: i64) -> bool {
        if !self.seen.insert(seq) {
            return false;
        }
        self.recent.push_back(seq);
        if self.recent.len() > SENT_WINDOW {
            if let Some(old) = self.recent.pop_front() {
                self.seen.remove(&old);
            }
        }
        self.highest = self.highest.max(seq);
        true
    }
}

/// The task sending a socket's events, and how to stop it between two events. The task
/// answers the seq of the last event it handed on: every subscription it served has seen
/// the log through there.
struct Follower {
    stop: oneshot::Sender<()>,
    task: JoinHandle<i64>,
}

struct Socket {
    state: AppState,
    caller: AuthUser,
    scope: Scope,
    thread_id: ResourceId,
    out: mpsc::Sender<String>,
    sent: Arc<Mutex<Sent>>,
    subscriptions: HashMap<String, Selector>,
    follower: Option<Follower>,
}

/// Serves one socket until the client closes it.
pub async fn serve(socket: WebSocket, state: AppState, caller: AuthUser, thread_id: ResourceId) {
    let _open = state.metrics.stream_opened(StreamKind::WebSocket);
    let (mut sink, mut incoming) = socket.split();
    let (out, mut outgoing) = mpsc::channel::<String>(256);
    let writer = tokio::spawn(async move {
        while let Some(text) = outgoing.recv().await {
            if sink.send(Message::Text(text.into())).await.is_err() {
                break;
            }
        }
    });
    let mut this = Socket {
        state,
        scope: caller.scope(),
        caller,
        thread_id,
        out,
        sent: Arc::default(),
        subscriptions: HashMap::new(),
        follower: None,
    };
    while let Some(Ok(message)) = incoming.next().await {
        let text = match message {
            Message::Text(text) => text.to_string(),
            Message::Close(_) => break,
            _ => continue,
        };
        let answer = this.answer(&text).await;
        if this.out.send(answer.to_string()).await.is_err() {
            break;
        }
    }
    if let Some(follower) = this.follower.take() {
        follower.task.abort();
    }
    drop(this);
    let _ = writer.await;
}

impl Socket {
    async fn answer(&mut self, text: &str) -> Value {
        let Ok(command) = serde_json::from_str::<Value>(text) else {
            let failure = Failure {
                code: "invalid_argument",
                message: "Protocol commands must be valid JSON.".into(),
            };
            return commands::error(None, &failure);
        };
        let (id, method, params) = match commands::parse(&command) {
            Ok(parsed) => parsed,
            Err(refusal) => return refusal,
        };
        let result = match method {
            "subscription.subscribe" => self.subscribe(&params).await,
            "subscription.unsubscribe" => self.unsubscribe(&params).await,
            "subscription.reconnect" => self.reconnect(&params).await,
            _ => commands::run(&self.state, &self.caller, self.thread_id, method, &params).await,
        };
        match result {
            Ok(result) => commands::success(id, result, self.highest_sent()),
            Err(failure) => commands::error(Some(json!(id)), &failure),
        }
    }

    fn highest_sent(&self) -> i64 {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).highest
    }

    async fn subscribe(&mut self, params: &Map<String, Value>) -> Result<Value, Failure> {
        let StreamRequest { filter, since } = request(&Value::Object(params.clone()))?;
        let id = subscription_id(params);
        self.change(|subscriptions| {
            subscriptions.insert(id.clone(), Selector { filter, since });
        })
        .await;
        // `replayed_events` (optional) is left out: the replay from the log runs after this
        // answer, in the follower, and a count made here would read the log twice.
        Ok(json!({"subscription_id": id}))
    }

    async fn unsubscribe(&mut self, params: &Map<String, Value>) -> Result<Value, Failure> {
        let id = params
            .get("subscription_id")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("subscription.unsubscribe requires a subscription_id."))?;
        if !self.subscriptions.contains_key(id) {
            return Err(Failure {
                code: "no_such_subscription",
                message: format!("Unknown subscription: {id}"),
            });
        }
        self.change(|subscriptions| {
            subscriptions.remove(id);
        })
        .await;
        Ok(json!({}))
    }

    /// Replays the named subscriptions (all of this socket's when none are named) from after
    /// `last_event_id`, a seq: the client gets what it missed, from the log. A subscription
    /// of an earlier socket is restored from its id.
    async fn reconnect(&mut self, params: &Map<String, Value>) -> Result<Value, Failure> {
        let since = match params.get("last_event_id") {
            None | Some(Value::Null) => 0,
            Some(Value::String(s)) => s
                .parse::<i64>()
                .map_err(|_| invalid("last_event_id must be an event id (a seq)"))?,
            Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
            Some(_) => return Err(invalid("last_event_id must be an event id (a seq)")),
        };
        let ids: Vec<String> = match params.get("subscriptions") {
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => self.subscriptions.keys().cloned().collect(),
        };
        // This socket's own subscriptions, and those of an earlier socket, named by their ids.
        let mut restorable = Vec::new();
        for id in &ids {
            if self.subscriptions.contains_key(id) {
                restorable.push((id.clone(), None));
            } else if let Some(filter) = filter_of(id) {
                restorable.push((id.clone(), Some(filter)));
            }
        }
        let restored = !ids.is_empty() && restorable.len() == ids.len();
        let since = since.max(0);
        self.change(|subscriptions| {
            for (id, filter) in restorable {
                match filter {
                    Some(filter) => {
                        subscriptions.insert(id, Selector { filter, since });
                    }
                    None => {
                        if let Some(selector) = subscriptions.get_mut(&id) {
                            selector.since = since;
                        }
                    }
                }
            }
        })
        .await;
        let last = self
            .state
            .storage
            .last_event_seq(self.thread_id)
            .await
            .map_err(Failure::from)?;
        Ok(json!({"restored": restored, "missed_events": (last - since).max(0)}))
    }

    /// Changes the subscriptions: stops the follower between two events, lets `edit` change
    /// them, and starts a follower again. Subscriptions already there continue after what the
    /// last follower handed on; a new or replayed one starts from its own `since`.
    async fn change(&mut self, edit: impl FnOnce(&mut HashMap<String, Selector>)) {
        if let Some(follower) = self.follower.take() {
            let _ = follower.stop.send(());
            let through = follower.task.await.unwrap_or(0);
            for selector in self.subscriptions.values_mut() {
                selector.since = selector.since.max(through);
            }
        }
        edit(&mut self.subscriptions);
        if !self.subscriptions.is_empty() {
            self.follower = Some(self.follow());
        }
    }

    /// Sends the events the subscriptions select, in seq order, until stopped.
    fn follow(&self) -> Follower {
        let framer = Framer::bare(self.subscriptions.values().cloned().collect());
        let mut events = Box::pin(follow_stream(
            self.state.storage.clone(),
            self.state.hub.clone(),
            self.scope.clone(),
            protocol_follow(self.thread_id, framer),
            self.state.keepalive,
            |_| {},
        ));
        let out = self.out.clone();
        let sent = self.sent.clone();
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut through = 0;
            loop {
                // The stop is looked at only between events: an event taken from the stream
                // is sent, so the next follower can start after the highest seq sent.
                let bytes = tokio::select! {
                    biased;
                    _ = &mut stopped => return through,
                    next = events.next() => match next {
                        Some(Ok(bytes)) => bytes,
                        _ => return through,
                    },
                };
                let Some(text) = envelope_text(&bytes) else {
                    continue;
                };
                let seq = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|e| e["seq"].as_i64());
                let first = seq.is_none_or(|seq| {
                    sent.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .first_time(seq)
                });
                if first && out.send(text).await.is_err() {
                    return through;
                }
                through = seq.unwrap_or(through);
            }
        });
        Follower { stop, task }
    }
}

/// An envelope frame as text; keepalive comments are the socket's pings' business.
fn envelope_text(bytes: &Bytes) -> Option<String> {
    (!bytes.starts_with(b":")).then(|| String::from_utf8_lossy(bytes).into_owned())
}

fn invalid(message: &str) -> Failure {
    Failure {
        code: "invalid_argument",
        message: message.into(),
    }
}

/// A subscription's id: what it selects (its channels, namespaces and depth, as base64 of
/// their JSON) and a random part. A later socket, in any process, restores the subscription
/// from its id alone (`subscription.reconnect` after a dropped connection).
fn subscription_id(params: &Map<String, Value>) -> String {
    let selects: Map<String, Value> = params
        .iter()
        .filter(|(name, _)| matches!(name.as_str(), "channels" | "namespaces" | "depth"))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let selects = URL_SAFE_NO_PAD.encode(Value::Object(selects).to_string());
    format!("{selects}.{}", Uuid::new_v4().simple())
}

/// What the subscription of a [`subscription_id`] selects; `None` for any other text.
fn filter_of(id: &str) -> Option<Filter> {
    let (selects, _) = id.split_once('.')?;
    let selects: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(selects).ok()?).ok()?;
    if !selects.is_object() {
        return None;
    }
    request(&selects).ok().map(|request| request.filter)
}

fn request(body: &Value) -> Result<StreamRequest, Failure> {
    parse_request(body).map_err(|refusal| match refusal {
        Refusal::BadRequest(message) => invalid(&message),
        Refusal::Field(err) => invalid(err.message()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_id_names_what_it_selects() {
        let params = json!({"channels": ["values", "custom:x"], "namespaces": [["a"]], "depth": 1,
                            "since": 9});
        let id = subscription_id(params.as_object().unwrap());
        let filter = filter_of(&id).expect("an id of ours");
        assert_eq!(
            filter.channels,
            HashSet::from(["values".into(), "custom:x".into()])
        );
        assert_eq!(filter.namespaces, vec![vec!["a".to_string()]]);
        assert_eq!(filter.depth, Some(1));
        assert_ne!(
            id,
            subscription_id(params.as_object().unwrap()),
            "ids are unique"
        );
        assert!(filter_of("nope").is_none());
        assert!(filter_of(&format!("{}.x", URL_SAFE_NO_PAD.encode("[1]"))).is_none());
        let bad = URL_SAFE_NO_PAD.encode(r#"{"channels": ["bogus"]}"#);
        assert!(filter_of(&format!("{bad}.x")).is_none());
    }

    #[test]
    fn an_event_is_sent_once_across_subscriptions() {
        let mut sent = Sent::default();
        assert!(sent.first_time(3));
        assert!(!sent.first_time(3));
        assert!(sent.first_time(2));
        assert_eq!(sent.highest, 3);
    }
}
