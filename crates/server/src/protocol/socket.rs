//! The WebSocket at `/threads/{thread_id}/stream/events`: commands and events on one
//! connection, as the reference serves it. Commands are answered as over HTTP; the
//! subscription commands are this transport's own: each subscription follows the thread's
//! log like an SSE stream (hub first, log after `since`, then live), and an event several
//! subscriptions select is sent once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use spindle_storage::Scope;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::commands::{self, Failure};
use super::envelope::Framer;
use crate::routes::thread_events::{parse_request, Refusal, StreamRequest};
use crate::runs::stream::{follow_stream, Follow, Target};
use crate::state::AppState;

/// How many recently sent seqs a socket remembers to send an event once across
/// subscriptions (they replay from different places, so a set, not a high-water mark).
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

struct Socket {
    state: AppState,
    scope: Scope,
    thread_id: Uuid,
    out: mpsc::Sender<String>,
    sent: Arc<Mutex<Sent>>,
    subscriptions: HashMap<String, (StreamRequestCopy, JoinHandle<()>)>,
}

/// What a subscription asked for, kept to restart it on `subscription.reconnect`.
#[derive(Clone)]
struct StreamRequestCopy(Value);

/// Serves one socket until the client closes it.
pub async fn serve(socket: WebSocket, state: AppState, scope: Scope, thread_id: Uuid) {
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
        scope,
        thread_id,
        out,
        sent: Arc::default(),
        subscriptions: HashMap::new(),
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
    for (_, (_, task)) in this.subscriptions.drain() {
        task.abort();
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
            "subscription.subscribe" => self.subscribe(&params),
            "subscription.unsubscribe" => self.unsubscribe(&params),
            "subscription.reconnect" => self.reconnect(&params).await,
            _ => commands::run(&self.state, &self.scope, self.thread_id, method, &params).await,
        };
        match result {
            Ok(result) => {
                let highest = self.sent.lock().unwrap_or_else(|e| e.into_inner()).highest;
                commands::success(id, result, highest)
            }
            Err(failure) => commands::error(Some(json!(id)), &failure),
        }
    }

    fn subscribe(&mut self, params: &Map<String, Value>) -> Result<Value, Failure> {
        let body = Value::Object(params.clone());
        let request = request(&body)?;
        let id = Uuid::new_v4().to_string();
        let task = self.follow(request);
        self.subscriptions
            .insert(id.clone(), (StreamRequestCopy(body), task));
        Ok(json!({"subscription_id": id, "replayed_events": 0}))
    }

    fn unsubscribe(&mut self, params: &Map<String, Value>) -> Result<Value, Failure> {
        let id = params
            .get("subscription_id")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("subscription.unsubscribe requires a subscription_id."))?;
        let (_, task) = self.subscriptions.remove(id).ok_or_else(|| Failure {
            code: "no_such_subscription",
            message: format!("Unknown subscription: {id}"),
        })?;
        task.abort();
        Ok(json!({}))
    }

    /// Restarts the named subscriptions (all when none are named) after `last_event_id`, a
    /// seq: the client gets what it missed, from the log.
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
        let mut restored = !ids.is_empty();
        for id in ids {
            let Some((body, task)) = self.subscriptions.remove(&id) else {
                restored = false;
                continue;
            };
            task.abort();
            let mut body = body.0;
            body["since"] = json!(since.max(0));
            let task = self.follow(request(&body)?);
            self.subscriptions
                .insert(id, (StreamRequestCopy(body), task));
        }
        let last = self
            .state
            .storage
            .last_event_seq(self.thread_id)
            .await
            .map_err(Failure::from)?;
        Ok(json!({"restored": restored, "missed_events": (last - since).max(0)}))
    }

    /// Forwards a subscription's events to the socket until aborted.
    fn follow(&self, request: StreamRequest) -> JoinHandle<()> {
        let framer = Framer::bare(request.filter, request.since);
        let follow = Follow {
            thread_id: self.thread_id,
            target: Target::Protocol(Arc::new(Mutex::new(framer))),
            after: Some((request.since - 1).max(0)),
            with_ids: true,
        };
        let mut events = Box::pin(follow_stream(
            self.state.storage.clone(),
            self.state.hub.clone(),
            self.scope.clone(),
            follow,
            self.state.keepalive,
            |_| {},
        ));
        let out = self.out.clone();
        let sent = self.sent.clone();
        tokio::spawn(async move {
            while let Some(Ok(bytes)) = events.next().await {
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
                    return;
                }
            }
        })
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
    fn an_event_is_sent_once_across_subscriptions() {
        let mut sent = Sent::default();
        assert!(sent.first_time(3));
        assert!(!sent.first_time(3));
        assert!(sent.first_time(2));
        assert_eq!(sent.highest, 3);
    }
}
