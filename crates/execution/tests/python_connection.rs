//! The worker connection against an in-process peer that speaks raw frames, as the worker
//! does: ids, replies, errors, concurrency, arrival order, and closing.
#![cfg(unix)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use rmpv::Value;
use spindle_execution::python::{
    CallError, Connection, ErrorCode, Frame, FrameCodec, RemoteError, Reply, WorkerCalls,
};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::Notify;
use tokio_util::codec::Framed;

const WAIT: Duration = Duration::from_secs(5);

/// Records what reaches it in arrival order; `slow` requests wait for `release`.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
    release: Arc<Notify>,
}

impl WorkerCalls for Recorder {
    fn request(&self, op: &str, body: Value) -> Reply {
        self.seen.lock().unwrap().push(format!("req {op}"));
        let release = self.release.clone();
        let op = op.to_owned();
        Box::pin(async move {
            match op.as_str() {
                "slow" => {
                    release.notified().await;
                    Ok("slow done".into())
                }
                "echo" => Ok(body),
                "fenced" => Err(RemoteError::fenced("attempt is not live")),
                "panic" => panic!("handler bug"),
                _ => Err(RemoteError::bad_request(format!("unknown operation {op}"))),
            }
        })
    }

    fn event(&self, op: &str, _body: Value) -> Option<BoxFuture<'static, ()>> {
        self.seen.lock().unwrap().push(format!("ev {op}"));
        None
    }
}

type Peer = Framed<UnixStream, FrameCodec>;

fn pair() -> (Connection, Peer, Arc<Recorder>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let recorder = Arc::new(Recorder::default());
    let conn = Connection::new("test-worker", ours, recorder.clone());
    (conn, Framed::new(theirs, FrameCodec), recorder)
}

async fn next(peer: &mut Peer) -> Frame {
    tokio::time::timeout(WAIT, peer.next())
        .await
        .expect("a frame in time")
        .expect("the stream is open")
        .expect("a well-formed frame")
}

fn req(id: u64, op: &str, body: Value) -> Frame {
    Frame::Request {
        id,
        op: op.into(),
        body,
    }
}

fn ev(op: &str) -> Frame {
    Frame::Event {
        op: op.into(),
        body: Value::Nil,
    }
}

#[tokio::test]
async fn requests_are_numbered_from_one_and_answered_by_re() {
    let (conn, mut peer, _) = pair();
    let first = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request("ping", Value::Nil).await }
    });
    let Frame::Request { id, op, body } = next(&mut peer).await else {
        panic!("a request")
    };
    assert_eq!((id, op.as_str(), body), (1, "ping", Value::Nil));
    let second = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request("init", Value::Binary(vec![1, 2])).await }
    });
    let Frame::Request { id: id2, body, .. } = next(&mut peer).await else {
        panic!("a request")
    };
    assert_eq!((id2, body), (2, Value::Binary(vec![1, 2])));
    // Answered in the other order: each reply finds its own request.
    peer.send(Frame::Ok {
        re: 2,
        body: "two".into(),
    })
    .await
    .unwrap();
    peer.send(Frame::Ok {
        re: 1,
        body: "one".into(),
    })
    .await
    .unwrap();
    assert_eq!(second.await.unwrap().unwrap(), Value::from("two"));
    assert_eq!(first.await.unwrap().unwrap(), Value::from("one"));
}

#[tokio::test]
async fn an_err_reply_is_a_typed_error() {
    let (conn, mut peer, _) = pair();
    let call = tokio::spawn(async move { conn.request("run.start", Value::Nil).await });
    let Frame::Request { id, .. } = next(&mut peer).await else {
        panic!("a request")
    };
    let body = RemoteError::new(ErrorCode::Conflict, "the worker is full")
        .retryable()
        .to_body();
    peer.send(Frame::Err { re: id, body }).await.unwrap();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        CallError::Remote(RemoteError {
            code: ErrorCode::Conflict,
            message: "the worker is full".into(),
            retryable: true,
        })
    );
}

#[tokio::test]
async fn a_malformed_err_body_is_still_an_error() {
    let (conn, mut peer, _) = pair();
    let call = tokio::spawn(async move { conn.request("x", Value::Nil).await });
    let Frame::Request { id, .. } = next(&mut peer).await else {
        panic!("a request")
    };
    peer.send(Frame::Err {
        re: id,
        body: 5.into(),
    })
    .await
    .unwrap();
    let Err(CallError::Remote(err)) = call.await.unwrap() else {
        panic!("a remote error")
    };
    assert_eq!(err.code, ErrorCode::Internal);
}

#[tokio::test]
async fn incoming_requests_are_answered_and_a_slow_one_holds_up_nothing() {
    let (_conn, mut peer, recorder) = pair();
    peer.send(req(1, "slow", Value::Nil)).await.unwrap();
    peer.send(req(2, "echo", Value::Binary(b"abc".to_vec())))
        .await
        .unwrap();
    peer.send(req(3, "fenced", Value::Nil)).await.unwrap();
    peer.send(req(4, "nope", Value::Nil)).await.unwrap();
    let mut replies = [
        next(&mut peer).await,
        next(&mut peer).await,
        next(&mut peer).await,
    ];
    replies.sort_by_key(|f| match f {
        Frame::Ok { re, .. } | Frame::Err { re, .. } => *re,
        _ => 0,
    });
    assert_eq!(
        replies[0],
        Frame::Ok {
            re: 2,
            body: Value::Binary(b"abc".to_vec())
        }
    );
    let Frame::Err { re: 3, body } = &replies[1] else {
        panic!("{:?}", replies[1])
    };
    assert_eq!(RemoteError::from_body(body).code, ErrorCode::Fenced);
    let Frame::Err { re: 4, body } = &replies[2] else {
        panic!("{:?}", replies[2])
    };
    assert_eq!(RemoteError::from_body(body).code, ErrorCode::BadRequest);
    recorder.release.notify_one();
    assert_eq!(
        next(&mut peer).await,
        Frame::Ok {
            re: 1,
            body: "slow done".into()
        }
    );
}

#[tokio::test]
async fn the_handler_sees_frames_in_arrival_order() {
    let (_conn, mut peer, recorder) = pair();
    // Events and the start of requests interleave as the worker sent them, even while the
    // first request is still waiting.
    let frames = vec![
        req(1, "slow", Value::Nil),
        ev("run.events"),
        req(2, "echo", Value::Nil),
        ev("run.events"),
        req(3, "echo", Value::Nil),
        ev("run.done"),
    ];
    for frame in frames {
        peer.feed(frame).await.unwrap();
    }
    peer.flush().await.unwrap();
    next(&mut peer).await;
    next(&mut peer).await;
    let seen = recorder.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "req slow",
            "ev run.events",
            "req echo",
            "ev run.events",
            "req echo",
            "ev run.done"
        ]
    );
    recorder.release.notify_one();
}

#[tokio::test]
async fn a_panicking_handler_answers_internal() {
    let (_conn, mut peer, _) = pair();
    peer.send(req(9, "panic", Value::Nil)).await.unwrap();
    let Frame::Err { re: 9, body } = next(&mut peer).await else {
        panic!("an err")
    };
    assert_eq!(RemoteError::from_body(&body).code, ErrorCode::Internal);
}

#[tokio::test]
async fn events_and_requests_leave_in_call_order() {
    let (conn, mut peer, _) = pair();
    let sender = tokio::spawn(async move {
        conn.send_event("a", Value::Nil).await.unwrap();
        let answer = conn.request("b", Value::Nil);
        // keep the connection alive while the peer answers
        answer.await
    });
    assert_eq!(next(&mut peer).await, ev("a"));
    let Frame::Request { id, op, .. } = next(&mut peer).await else {
        panic!("a request")
    };
    assert_eq!(op, "b");
    peer.send(Frame::Ok {
        re: id,
        body: Value::Nil,
    })
    .await
    .unwrap();
    sender.await.unwrap().unwrap();
}

#[tokio::test]
async fn pending_requests_fail_when_the_peer_goes_away() {
    let (conn, mut peer, _) = pair();
    let call = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request("ping", Value::Nil).await }
    });
    next(&mut peer).await;
    drop(peer);
    let err = tokio::time::timeout(WAIT, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, CallError::Closed(ref why) if why.contains("closed its end")),
        "{err}"
    );
    let reason = tokio::time::timeout(WAIT, conn.closed()).await.unwrap();
    assert!(reason.contains("closed its end"), "{reason}");
    // Later requests fail at once.
    let err = conn.request("ping", Value::Nil).await.unwrap_err();
    assert!(matches!(err, CallError::Closed(_)), "{err}");
}

#[tokio::test]
async fn a_malformed_frame_closes_the_connection_with_its_reason() {
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    let conn = Connection::new("test-worker", ours, Arc::new(Recorder::default()));
    let call = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request("ping", Value::Nil).await }
    });
    // a frame holding an array, not a map
    theirs.write_all(&[0, 0, 0, 1, 0x90]).await.unwrap();
    let err = tokio::time::timeout(WAIT, call)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, CallError::Closed(ref why) if why.contains("bad frame")),
        "{err}"
    );
    // and the worker sees EOF (after the request that was already queued)
    let mut peer = Framed::new(theirs, FrameCodec);
    let mut rest = vec![];
    while let Ok(Some(Ok(frame))) = tokio::time::timeout(WAIT, peer.next()).await {
        rest.push(frame);
    }
    assert!(rest.len() <= 1, "{rest:?}");
}

#[tokio::test]
async fn a_reply_to_no_request_is_ignored() {
    let (conn, mut peer, _) = pair();
    peer.send(Frame::Ok {
        re: 42,
        body: Value::Nil,
    })
    .await
    .unwrap();
    let call = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request("ping", Value::Nil).await }
    });
    let Frame::Request { id, .. } = next(&mut peer).await else {
        panic!("a request")
    };
    peer.send(Frame::Ok {
        re: id,
        body: 1.into(),
    })
    .await
    .unwrap();
    assert_eq!(call.await.unwrap().unwrap(), Value::from(1));
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn dropping_the_last_handle_closes_the_socket() {
    let (conn, mut peer, _) = pair();
    let clone = conn.clone();
    drop(conn);
    peer.send(req(1, "echo", 1.into())).await.unwrap();
    assert_eq!(
        next(&mut peer).await,
        Frame::Ok {
            re: 1,
            body: 1.into()
        }
    );
    drop(clone);
    let end = tokio::time::timeout(WAIT, peer.next()).await.unwrap();
    assert!(end.is_none(), "{end:?}");
}

#[tokio::test]
async fn two_connections_call_each_other_at_once() {
    let (a, b) = UnixStream::pair().unwrap();
    let left = Connection::new("left", a, Arc::new(Recorder::default()));
    let right = Connection::new("right", b, Arc::new(Recorder::default()));
    let calls = (0..50).map(|i| {
        let (left, right) = (left.clone(), right.clone());
        async move {
            let (x, y) = tokio::join!(
                left.request("echo", i.into()),
                right.request("echo", (i + 100).into())
            );
            assert_eq!(
                (x.unwrap(), y.unwrap()),
                (Value::from(i), Value::from(i + 100))
            );
        }
    });
    tokio::time::timeout(WAIT, futures::future::join_all(calls))
        .await
        .unwrap();
}
