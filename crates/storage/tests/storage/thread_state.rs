//! State edits saved with their thread (one transaction), thread TTL, pruning and the sweep
//! of expired threads.

use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use spindle_graph::checkpoint::{
    new_checkpoint_id, now_rfc3339, BlobValue, ChannelBlob, Checkpoint, PendingWrite,
};
use spindle_storage::test_util::{for_each_backend, new_run};
use spindle_storage::*;
use uuid::Uuid;

use crate::common::*;

/// A checkpoint of channel `items` at `version`, as the engine saves it.
fn step(version: u64, parent: Option<&str>, blob: BlobValue) -> CheckpointWrite {
    CheckpointWrite {
        checkpoint_ns: String::new(),
        checkpoint: Checkpoint {
            v: 1,
            id: new_checkpoint_id(),
            ts: now_rfc3339(),
            channel_values: Default::default(),
            channel_versions: [("items".to_string(), version)].into_iter().collect(),
            versions_seen: Default::default(),
            updated_channels: vec!["items".into()],
            delta_depths: Default::default(),
        },
        metadata: json!({"source": "update", "step": version}),
        parent_id: parent.map(str::to_owned),
        blobs: vec![ChannelBlob {
            channel: "items".into(),
            version,
            value: blob,
        }],
    }
}

/// `n` checkpoints: a full list, then appends of one item each (delta blobs on the previous).
fn history(n: u64) -> Vec<CheckpointWrite> {
    let mut out: Vec<CheckpointWrite> = Vec::new();
    for version in 1..=n {
        let parent = out.last().map(|c| c.checkpoint.id.clone());
        let blob = if version == 1 {
            BlobValue::Full { value: json!([1]) }
        } else {
            BlobValue::Append {
                base: version - 1,
                depth: version as u32 - 1,
                items: vec![json!(version)],
            }
        };
        out.push(step(version, parent.as_deref(), blob));
    }
    out
}

fn columns(status: ThreadStatus, values: Value) -> ThreadStateColumns {
    ThreadStateColumns {
        status,
        values: Some(values),
        interrupts: obj(json!({"task-1": [{"id": "i", "value": 1}]})),
    }
}

fn state_update() -> ThreadEvent {
    ThreadEvent {
        event: "state_update".into(),
        data: json!({"state": {"values": {"items": [1]}}}),
    }
}

async fn items_at(s: &dyn Storage, thread: ResourceId, id: Option<&str>) -> Option<Value> {
    s.checkpointer()
        .get_tuple(thread.as_str(), "", id)
        .await
        .unwrap()
        .map(|t| t.checkpoint.channel_values["items"].clone())
}

#[tokio::test]
async fn a_state_write_saves_checkpoints_columns_and_event_together() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let id = s
            .create_thread(&user, new_thread(json!({})))
            .await
            .unwrap()
            .thread_id;
        let write = StateWrite {
            checkpoints: history(2),
            columns: columns(ThreadStatus::Interrupted, json!({"items": [1, 2]})),
            expect_latest: None,
        };
        let written = s
            .write_thread_state(&user, id, write, Some(state_update()))
            .await
            .unwrap();
        assert_eq!(written.thread.status, ThreadStatus::Interrupted);
        assert_eq!(written.thread.values, Some(json!({"items": [1, 2]})));
        assert_eq!(written.thread.interrupts.len(), 1);
        assert!(written.thread.state_updated_at > written.thread.created_at);
        assert_eq!(items_at(s, id, None).await, Some(json!([1, 2])));

        // The event continues the thread's log and names no run.
        let event = written.event.unwrap();
        assert_eq!(event.seq, 1);
        assert_eq!(event.run_id, Uuid::nil());
        let logged = s.read_events(id, 0, None, 10).await.unwrap();
        assert_eq!(logged, vec![event.clone()]);
        assert_eq!(s.last_event_seq(id).await.unwrap(), 1);

        // An edit made from a state that is no longer the latest is refused.
        let stale = StateWrite {
            checkpoints: history(1),
            columns: columns(ThreadStatus::Idle, json!({})),
            expect_latest: Some(None),
        };
        assert_conflict(
            s.write_thread_state(&user, id, stale, None).await,
            "an edit of a stale state",
        );
        let latest = s
            .checkpointer()
            .get_tuple(id.as_str(), "", None)
            .await
            .unwrap()
            .unwrap()
            .at
            .checkpoint_id;
        let fresh = StateWrite {
            checkpoints: vec![step(
                3,
                Some(&latest),
                BlobValue::Full { value: json!([9]) },
            )],
            columns: columns(ThreadStatus::Idle, json!({"items": [9]})),
            expect_latest: Some(Some(latest)),
        };
        s.write_thread_state(&user, id, fresh, None).await.unwrap();
        assert_eq!(items_at(s, id, None).await, Some(json!([9])));

        // Another user's thread does not exist.
        let other = StateWrite {
            checkpoints: history(1),
            columns: columns(ThreadStatus::Idle, json!({})),
            expect_latest: None,
        };
        assert_not_found(
            s.write_thread_state(&fresh_user(), id, other, None).await,
            "another user's thread",
        );
    })
    .await;
}

/// `history(n)` in a subgraph's namespace.
fn in_namespace(ns: &str, mut steps: Vec<CheckpointWrite>) -> Vec<CheckpointWrite> {
    for step in steps.iter_mut() {
        step.checkpoint_ns = ns.to_string();
    }
    steps
}

#[tokio::test]
async fn an_edit_of_a_subgraph_expects_the_latest_of_its_namespace() {
    // A subgraph's state edited while it waits: the root's latest checkpoint does not move,
    // so the edit must be checked against the latest of the subgraph's own namespace.
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let id = s
            .create_thread(&user, new_thread(json!({})))
            .await
            .unwrap()
            .thread_id;
        let ns = "child:task-1";
        let mut setup = history(1);
        setup.extend(in_namespace(ns, history(2)));
        let write = StateWrite {
            checkpoints: setup,
            columns: columns(ThreadStatus::Interrupted, json!({"items": [1]})),
            expect_latest: None,
        };
        s.write_thread_state(&user, id, write, None).await.unwrap();
        let saver = s.checkpointer();
        let tid = id.to_string();
        let sub_latest = saver.get_tuple(&tid, ns, None).await.unwrap().unwrap();
        let root_latest = saver.get_tuple(&tid, "", None).await.unwrap().unwrap();

        // Made from the root's latest, not the subgraph's: refused, nothing written.
        let edit = |expect: &str| StateWrite {
            checkpoints: in_namespace(
                ns,
                vec![step(
                    3,
                    Some(&sub_latest.at.checkpoint_id),
                    BlobValue::Full { value: json!([7]) },
                )],
            ),
            columns: columns(ThreadStatus::Interrupted, json!({"items": [1]})),
            expect_latest: Some(Some(expect.to_string())),
        };
        assert_conflict(
            s.write_thread_state(&user, id, edit(&root_latest.at.checkpoint_id), None)
                .await,
            "an edit checked against another namespace",
        );
        let unchanged = saver.get_tuple(&tid, ns, None).await.unwrap().unwrap();
        assert_eq!(unchanged.at, sub_latest.at);

        s.write_thread_state(&user, id, edit(&sub_latest.at.checkpoint_id), None)
            .await
            .unwrap();
        let edited = saver.get_tuple(&tid, ns, None).await.unwrap().unwrap();
        assert_eq!(edited.checkpoint.channel_values["items"], json!([7]));
        assert_eq!(
            saver.get_tuple(&tid, "", None).await.unwrap().unwrap().at,
            root_latest.at
        );
    })
    .await;
}

#[tokio::test]
async fn a_state_write_is_refused_while_a_run_is_active_and_changes_nothing() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let id = s
            .create_thread(&user, new_thread(json!({})))
            .await
            .unwrap()
            .thread_id;
        s.create_run(&user, new_run(id)).await.unwrap();
        let before = s.get_thread(&user, id).await.unwrap();
        let write = StateWrite {
            checkpoints: history(1),
            columns: columns(ThreadStatus::Idle, json!({"items": [1]})),
            expect_latest: None,
        };
        assert_conflict(
            s.write_thread_state(&user, id, write, Some(state_update()))
                .await,
            "state write during a pending run",
        );
        assert_eq!(s.get_thread(&user, id).await.unwrap(), before);
        assert_eq!(items_at(s, id, None).await, None, "no checkpoint was saved");
        // The run's events, numbered from the thread's counter, still start at 1.
        assert_eq!(s.last_event_seq(id).await.unwrap(), 0);
    })
    .await;
}

#[tokio::test]
async fn a_thread_is_created_with_its_ttl_and_supersteps() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let ttl = ThreadTtl {
            strategy: TtlStrategy::KeepLatest,
            minutes: 90.5,
        };
        let new = NewThread {
            ttl: Some(ttl),
            state: Some(StateWrite {
                checkpoints: history(3),
                columns: columns(ThreadStatus::Idle, json!({"items": [1, 2, 3]})),
                expect_latest: None,
            }),
            ..new_thread(json!({"graph_id": "g"}))
        };
        let before = Utc::now();
        let created = s.create_thread(&user, new.clone()).await.unwrap();
        assert_eq!(created.ttl, Some(ttl));
        let expires = created.expires_at.unwrap();
        assert!(expires >= before + chrono::Duration::seconds(90 * 60 + 29));
        assert_eq!(created.values, Some(json!({"items": [1, 2, 3]})));
        assert_eq!(
            items_at(s, created.thread_id, None).await,
            Some(json!([1, 2, 3]))
        );

        // do_nothing on an existing id applies neither.
        let again = NewThread {
            if_exists: IfExists::DoNothing,
            ttl: None,
            ..new
        };
        assert_eq!(s.create_thread(&user, again).await.unwrap(), created);

        // PATCH sets a new TTL, counted from now.
        let patched = s
            .patch_thread(
                &user,
                created.thread_id,
                ThreadPatch {
                    metadata: obj(json!({"k": 1})),
                    ttl: Some(ThreadTtl {
                        strategy: TtlStrategy::Delete,
                        minutes: 1.0,
                    }),
                },
            )
            .await
            .unwrap();
        assert_eq!(patched.ttl.unwrap().strategy, TtlStrategy::Delete);
        assert!(patched.expires_at.unwrap() < expires);
        assert_eq!(patched.metadata, obj(json!({"graph_id": "g", "k": 1})));
    })
    .await;
}

#[tokio::test]
async fn prune_deletes_or_keeps_only_the_latest_checkpoint() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let new = NewThread {
                state: Some(StateWrite {
                    checkpoints: history(5),
                    columns: columns(ThreadStatus::Idle, json!({"items": [1, 2, 3, 4, 5]})),
                    expect_latest: None,
                }),
                ..new_thread(json!({}))
            };
            ids.push(s.create_thread(&user, new).await.unwrap().thread_id);
        }
        let kept_id = s
            .checkpointer()
            .get_tuple(ids[1].as_str(), "", None)
            .await
            .unwrap()
            .unwrap()
            .at
            .checkpoint_id;
        // Pending writes of the latest checkpoint (an interrupt) survive a trim.
        s.checkpointer()
            .put_writes(
                ids[1].as_str(),
                "",
                &kept_id,
                &[PendingWrite {
                    task_id: "t".into(),
                    channel: "__interrupt__".into(),
                    value: json!([{"id": "i", "value": 1}]),
                }],
            )
            .await
            .unwrap();
        let before = db.checkpoint_footprint(ids[1].as_str()).await;
        assert_eq!((before.checkpoints, before.blobs), (5, 5));

        // Another user's thread and an unknown id are skipped.
        let stranger = s
            .create_thread(&fresh_user(), new_thread(json!({})))
            .await
            .unwrap();
        let asked = [ids[0], stranger.thread_id, ResourceId::generate()];
        assert_eq!(
            s.prune_threads(&user, &asked, TtlStrategy::Delete)
                .await
                .unwrap(),
            1
        );
        assert_not_found(s.get_thread(&user, ids[0]).await, "pruned thread");
        assert_eq!(
            db.checkpoint_footprint(ids[0].as_str()).await.checkpoints,
            0
        );
        assert_eq!(db.checkpoint_footprint(ids[0].as_str()).await.blobs, 0);

        let trimmed = s
            .prune_threads(&user, &[ids[1]], TtlStrategy::KeepLatest)
            .await
            .unwrap();
        assert_eq!(trimmed, 1);
        let after = db.checkpoint_footprint(ids[1].as_str()).await;
        assert_eq!(after.checkpoints, 1);
        assert_eq!(after.writes, 1);
        // The kept checkpoint's delta chain reaches every version: nothing else existed.
        assert_eq!(after.blobs, 5);
        let tuple = s
            .checkpointer()
            .get_tuple(ids[1].as_str(), "", None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(tuple.at.checkpoint_id, kept_id);
        assert_eq!(tuple.parent_id, None);
        assert_eq!(
            tuple.checkpoint.channel_values["items"],
            json!([1, 2, 3, 4, 5])
        );
        assert_eq!(tuple.pending_writes.len(), 1);
        assert!(s.get_thread(&user, ids[1]).await.is_ok());

        // keep_latest leaves a thread with an active run alone.
        s.create_run(&user, new_run(ids[2])).await.unwrap();
        assert_eq!(
            s.prune_threads(&user, &[ids[2]], TtlStrategy::KeepLatest)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            db.checkpoint_footprint(ids[2].as_str()).await.checkpoints,
            5
        );
    })
    .await;
}

#[tokio::test]
async fn keep_latest_drops_blobs_the_latest_checkpoint_no_longer_reaches() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        // Version 3 is a full copy: versions 1 and 2 are unreachable from it.
        let mut checkpoints = history(2);
        let parent = checkpoints[1].checkpoint.id.clone();
        checkpoints.push(step(
            3,
            Some(&parent),
            BlobValue::Full {
                value: json!(["x"]),
            },
        ));
        let new = NewThread {
            state: Some(StateWrite {
                checkpoints,
                columns: columns(ThreadStatus::Idle, json!({"items": ["x"]})),
                expect_latest: None,
            }),
            ..new_thread(json!({}))
        };
        let id = s.create_thread(&user, new).await.unwrap().thread_id;
        s.prune_threads(&user, &[id], TtlStrategy::KeepLatest)
            .await
            .unwrap();
        let after = db.checkpoint_footprint(id.as_str()).await;
        assert_eq!((after.checkpoints, after.blobs), (1, 1));
        assert_eq!(items_at(s, id, None).await, Some(json!(["x"])));
    })
    .await;
}

#[tokio::test]
async fn the_sweep_applies_each_threads_ttl_and_the_default() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let with = |strategy, minutes| NewThread {
            ttl: Some(ThreadTtl { strategy, minutes }),
            state: Some(StateWrite {
                checkpoints: history(3),
                columns: columns(ThreadStatus::Idle, json!({"items": [1, 2, 3]})),
                expect_latest: None,
            }),
            ..new_thread(json!({}))
        };
        // 0.0005 minutes: 30 ms.
        let doomed = s
            .create_thread(&user, with(TtlStrategy::Delete, 0.0005))
            .await
            .unwrap();
        let trimmed = s
            .create_thread(&user, with(TtlStrategy::KeepLatest, 0.0005))
            .await
            .unwrap();
        let busy = s
            .create_thread(&user, with(TtlStrategy::Delete, 0.0005))
            .await
            .unwrap();
        s.create_run(&user, new_run(busy.thread_id)).await.unwrap();
        let lasting = s
            .create_thread(&user, with(TtlStrategy::Delete, 60.0))
            .await
            .unwrap();
        let plain = s.create_thread(&user, new_thread(json!({}))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(80)).await;

        let outcome = s
            .sweep_expired_threads(Utc::now(), None, 1000)
            .await
            .unwrap();
        assert_eq!(
            outcome,
            SweepOutcome {
                deleted: 1,
                trimmed: 1
            }
        );
        assert_not_found(
            s.get_thread(&user, doomed.thread_id).await,
            "expired thread",
        );
        assert_eq!(
            db.checkpoint_footprint(doomed.thread_id.as_str())
                .await
                .checkpoints,
            0
        );
        let kept = s.get_thread(&user, trimmed.thread_id).await.unwrap();
        assert!(
            kept.expires_at.unwrap() > trimmed.expires_at.unwrap(),
            "next trim later"
        );
        assert_eq!(
            db.checkpoint_footprint(trimmed.thread_id.as_str())
                .await
                .checkpoints,
            1
        );
        for alive in [&busy, &lasting, &plain] {
            assert!(s.get_thread(&user, alive.thread_id).await.is_ok());
        }

        // The server's default reaches threads without a TTL of their own, once idle that long.
        let default = ThreadTtl {
            strategy: TtlStrategy::Delete,
            minutes: 0.0005,
        };
        let outcome = s
            .sweep_expired_threads(Utc::now(), Some(default), 1000)
            .await
            .unwrap();
        assert!(outcome.deleted >= 1);
        assert_not_found(
            s.get_thread(&user, plain.thread_id).await,
            "idle past the default",
        );
        for alive in [&busy, &lasting] {
            assert!(s.get_thread(&user, alive.thread_id).await.is_ok());
        }
    })
    .await;
}
