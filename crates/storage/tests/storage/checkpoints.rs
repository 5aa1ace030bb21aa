//! The database checkpointer: the engine's conformance suite on each backend, plus what the
//! suite does not cover (cost per step on a long thread, paging, filters, copies, concurrent
//! writes, query plans).

use std::sync::Arc;

use serde_json::{json, Value};
use spindle_graph::checkpoint::blob::FULL_EVERY;
use spindle_graph::checkpoint::{
    conformance, new_checkpoint_id, now_rfc3339, BlobValue, ChannelBlob, Checkpoint,
    CheckpointError, CheckpointTuple, Checkpointer, InMemoryCheckpointer, ListFilter, PendingWrite,
    QueuedWrite,
};
use spindle_graph::{Durability, RunConfig, RunEnv, RunInput};
use spindle_storage::test_util::{for_each_backend, CheckpointFootprint};
use spindle_storage::Backend;
use uuid::Uuid;

fn thread() -> String {
    Uuid::new_v4().to_string()
}

fn checkpoint(versions: &[(&str, u64)]) -> Checkpoint {
    Checkpoint {
        v: 1,
        id: new_checkpoint_id(),
        ts: now_rfc3339(),
        channel_values: Default::default(),
        channel_versions: versions.iter().map(|(c, v)| (c.to_string(), *v)).collect(),
        versions_seen: Default::default(),
        updated_channels: Vec::new(),
        delta_depths: Default::default(),
    }
}

fn full(channel: &str, version: u64, value: Value) -> ChannelBlob {
    ChannelBlob {
        channel: channel.into(),
        version,
        value: BlobValue::Full { value },
    }
}

fn ids(tuples: &[CheckpointTuple]) -> Vec<String> {
    tuples.iter().map(|t| t.checkpoint.id.clone()).collect()
}

fn write(task: &str, channel: &str, value: Value) -> PendingWrite {
    PendingWrite {
        task_id: task.into(),
        channel: channel.into(),
        value,
    }
}

/// Saves `n` checkpoints of one `n` channel in namespace `ns`, each the child of the one
/// before, with metadata `{step, parity}`; returns their ids, oldest first.
async fn chain(saver: &dyn Checkpointer, t: &str, ns: &str, n: u64) -> Vec<String> {
    let mut ids = Vec::new();
    let mut parent: Option<String> = None;
    for step in 1..=n {
        let c = checkpoint(&[("n", step)]);
        let parity = ["even", "odd"][(step % 2) as usize];
        saver
            .put(
                t,
                ns,
                &c,
                &json!({"source": "loop", "step": step, "parity": parity, "tags": [parity]}),
                parent.as_deref(),
                &[full("n", step, json!(step))],
            )
            .await
            .unwrap();
        parent = Some(c.id.clone());
        ids.push(c.id);
    }
    ids
}

#[tokio::test]
async fn the_database_checkpointers_pass_the_conformance_suite() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        conformance::check(saver.as_ref())
            .await
            .unwrap_or_else(|e| panic!("conformance: {e}"));
    })
    .await;
}

/// A message with some body, as a chat turn would add.
fn message(i: usize) -> Value {
    json!({
        "id": format!("msg-{i:04}"),
        "type": (["human", "ai"][i % 2]),
        "content": format!("message number {i}: the quick brown fox jumps over the lazy dog"),
    })
}

#[tokio::test]
async fn each_step_of_a_long_thread_writes_only_its_delta() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        const STEPS: usize = 1000;
        let mut parent: Option<String> = None;
        let mut depth = 0u32;
        // Bytes written by steps that saved a delta, early and late in the thread.
        let (mut early, mut late) = (Vec::new(), Vec::new());
        let mut full_copies = Vec::new();
        for i in 0..STEPS {
            let version = i as u64 + 1;
            // The engine's policy: a full copy at the start and every FULL_EVERY deltas.
            let value = if i == 0 || depth == FULL_EVERY {
                depth = 0;
                BlobValue::Full {
                    value: Value::Array((0..=i).map(message).collect()),
                }
            } else {
                depth += 1;
                BlobValue::Upsert {
                    base: version - 1,
                    depth,
                    items: vec![message(i)],
                    removed: vec![],
                }
            };
            let is_delta = depth > 0;
            let c = checkpoint(&[("messages", version), ("step", version)]);
            let blobs = [
                ChannelBlob {
                    channel: "messages".into(),
                    version,
                    value,
                },
                full("step", version, json!(i)),
            ];
            let measure = !(10..STEPS - 10).contains(&i) || !is_delta;
            let before = if measure {
                Some(db.checkpoint_footprint(&t).await)
            } else {
                None
            };
            saver
                .put(
                    &t,
                    "",
                    &c,
                    &json!({"source": "loop", "step": i, "writes": {"agent": {"messages": [message(i)]}}}),
                    parent.as_deref(),
                    &blobs,
                )
                .await
                .unwrap();
            parent = Some(c.id);
            if let Some(before) = before {
                let step = db.checkpoint_footprint(&t).await.since(&before);
                assert_eq!(
                    (step.checkpoints, step.blobs),
                    (1, 2),
                    "step {i} writes one checkpoint and two blobs"
                );
                match (is_delta, i < 10) {
                    (false, _) => full_copies.push((i, step.bytes())),
                    (true, true) => early.push(step.bytes()),
                    (true, false) => late.push(step.bytes()),
                }
            }
        }
        let max_early = *early.iter().max().unwrap();
        let max_late = *late.iter().max().unwrap();
        eprintln!(
            "[{}] bytes per delta step: first steps {early:?}, last steps {late:?}; \
             full copies (after {FULL_EVERY} deltas) at (step, bytes): {:?}",
            db.name(),
            &full_copies[..3.min(full_copies.len())]
        );
        assert!(
            max_late < 1_500,
            "a delta step on a 1,000-message thread wrote {max_late} bytes"
        );
        // Independent of history: the last steps write what the first ones did (give or
        // take the digits of larger step numbers).
        assert!(
            max_late <= max_early + 32,
            "late steps wrote {late:?} bytes, early ones {early:?}"
        );

        // The thread loads whole, from the last full copy plus its deltas.
        let latest = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        let messages = latest.checkpoint.channel_values["messages"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(messages.len(), STEPS);
        assert_eq!(messages[STEPS - 1], message(STEPS - 1));
        assert_eq!(messages[0], message(0));
        assert_eq!(latest.checkpoint.channel_values["step"], json!(STEPS - 1));

        // A history page of ten checkpoints, each with its own messages.
        let page = saver
            .list(
                &t,
                Some(""),
                &ListFilter {
                    limit: Some(10),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(page.len(), 10);
        for (k, tuple) in page.iter().enumerate() {
            let n = tuple.checkpoint.channel_values["messages"]
                .as_array()
                .unwrap()
                .len();
            assert_eq!(n, STEPS - k, "history entry {k}");
        }
    })
    .await;
}

#[tokio::test]
async fn engine_turns_on_a_long_thread_write_only_what_changed() {
    for_each_backend(|db| async move {
        let graph = Arc::new(
            spindle_graph::examples::get("echo")
                .expect("the echo example exists")
                .expect("the echo example compiles"),
        );
        let saver = db.storage().checkpointer();
        let t = thread();
        let run = |input: Value| {
            let graph = graph.clone();
            let saver = saver.clone();
            let t = t.clone();
            async move {
                spindle_graph::pregel::run(
                    &graph,
                    RunInput::Values(input),
                    RunConfig {
                        thread_id: Some(t),
                        durability: Durability::Sync,
                        ..Default::default()
                    },
                    RunEnv {
                        checkpointer: Some(saver),
                        ..Default::default()
                    },
                )
                .await
                .expect("run")
            }
        };
        let history: Vec<Value> = (0..1000)
            .map(|i| json!({"role": (["user", "assistant"][i % 2]), "content": format!("message number {i}")}))
            .collect();
        run(json!({"messages": history})).await;
        let mut turns = Vec::new();
        for k in 0..3 {
            let before = db.checkpoint_footprint(&t).await;
            let out = run(json!({"messages": [{"role": "user", "content": format!("one more {k}")}]})).await;
            let turn = db.checkpoint_footprint(&t).await.since(&before);
            assert_eq!(
                out.values["messages"].as_array().unwrap().len(),
                1003 + 2 * k
            );
            turns.push(turn);
        }
        eprintln!("[{}] engine turns on a 1,000-message thread: {turns:?}", db.name());
        for turn in &turns {
            assert!(
                turn.bytes() < 8_000,
                "a turn on a 1,000-message thread wrote {turn:?}"
            );
        }
        let state = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        assert_eq!(
            state.checkpoint.channel_values["messages"]
                .as_array()
                .unwrap()
                .len(),
            1007
        );
    })
    .await;
}

#[tokio::test]
async fn history_pages_with_before_and_limit() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let saved = chain(saver.as_ref(), &t, "", 25).await;
        let newest_first: Vec<String> = saved.iter().rev().cloned().collect();

        let mut pages = Vec::new();
        let mut before = None;
        loop {
            let page = saver
                .list(
                    &t,
                    Some(""),
                    &ListFilter {
                        before: before.clone(),
                        limit: Some(10),
                        metadata: None,
                    },
                )
                .await
                .unwrap();
            if page.is_empty() {
                break;
            }
            before = page.last().map(|t| t.checkpoint.id.clone());
            pages.push(ids(&page));
        }
        assert_eq!(
            pages.iter().map(Vec::len).collect::<Vec<_>>(),
            [10, 10, 5],
            "pages of ten"
        );
        assert_eq!(pages.concat(), newest_first, "pages cover the history once");

        let all = saver
            .list(&t, Some(""), &ListFilter::default())
            .await
            .unwrap();
        assert_eq!(ids(&all), newest_first);
        // Each entry has its own values and parent.
        for (k, tuple) in all.iter().enumerate() {
            assert_eq!(tuple.checkpoint.channel_values["n"], json!(25 - k));
            assert_eq!(
                tuple.parent_id.as_ref(),
                all.get(k + 1).map(|p| &p.at.checkpoint_id)
            );
            assert_eq!(tuple.at.thread_id, t);
        }
        assert!(saver
            .list(&thread(), Some(""), &ListFilter::default())
            .await
            .unwrap()
            .is_empty());
        assert!(saver
            .get_tuple(&thread(), "", None)
            .await
            .unwrap()
            .is_none());
        assert!(saver
            .get_tuple(&t, "", Some(&new_checkpoint_id()))
            .await
            .unwrap()
            .is_none());
    })
    .await;
}

#[tokio::test]
async fn list_filters_on_metadata_by_containment_and_spans_namespaces() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let root = chain(saver.as_ref(), &t, "", 6).await;
        let sub = chain(saver.as_ref(), &t, "child:1", 3).await;
        let list = |ns: Option<&'static str>, metadata: Value, limit: Option<usize>| {
            let saver = saver.clone();
            let t = t.clone();
            async move {
                ids(&saver
                    .list(
                        &t,
                        ns,
                        &ListFilter {
                            before: None,
                            limit,
                            metadata: Some(metadata),
                        },
                    )
                    .await
                    .unwrap())
            }
        };
        assert_eq!(
            list(Some(""), json!({"parity": "even"}), None).await,
            [root[5].as_str(), root[3].as_str(), root[1].as_str()]
        );
        assert_eq!(
            list(
                Some(""),
                json!({"parity": "even", "source": "loop"}),
                Some(2)
            )
            .await,
            [root[5].as_str(), root[3].as_str()]
        );
        assert_eq!(
            list(Some(""), json!({"step": 2, "parity": "even"}), None).await,
            [root[1].as_str()]
        );
        // Containment, as jsonb's `@>`: an array filter matches arrays holding its items.
        assert_eq!(
            list(Some(""), json!({"tags": ["odd"]}), None).await,
            [root[4].as_str(), root[2].as_str(), root[0].as_str()]
        );
        assert!(list(Some(""), json!({"parity": "none"}), None)
            .await
            .is_empty());
        assert!(list(Some(""), json!({"step": "2"}), None).await.is_empty());
        assert_eq!(list(Some(""), json!({}), None).await.len(), 6);
        // Without a namespace: every namespace, newest first.
        let mut everywhere: Vec<String> = root.iter().chain(&sub).cloned().collect();
        everywhere.sort();
        everywhere.reverse();
        assert_eq!(list(None, json!({}), None).await, everywhere);
        assert_eq!(
            list(None, json!({"parity": "odd"}), None).await,
            [
                sub[2].as_str(),
                sub[0].as_str(),
                root[4].as_str(),
                root[2].as_str(),
                root[0].as_str()
            ]
        );
        assert_eq!(
            list(Some("child:1"), json!({}), Some(1)).await,
            [sub[2].as_str()]
        );
        let from_sub = saver
            .list(&t, None, &ListFilter::default())
            .await
            .unwrap()
            .into_iter()
            .find(|x| x.checkpoint.id == sub[0])
            .unwrap();
        assert_eq!(from_sub.at.checkpoint_ns, "child:1");
        assert_eq!(from_sub.checkpoint.channel_values["n"], json!(1));
    })
    .await;
}

#[tokio::test]
async fn copies_are_independent_and_deletes_are_complete() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let (a, b, c) = (thread(), thread(), thread());
        let ids_a = chain(saver.as_ref(), &a, "", 3).await;
        chain(saver.as_ref(), &a, "child:1", 2).await;
        let w = vec![write("task", "n", json!(9))];
        saver.put_writes(&a, "", &ids_a[2], &w).await.unwrap();
        // `c` has checkpoints of its own, which a copy onto it replaces.
        chain(saver.as_ref(), &c, "", 4).await;

        saver.copy_thread(&a, &b).await.unwrap();
        saver.copy_thread(&a, &c).await.unwrap();
        let footprint_a = db.checkpoint_footprint(&a).await;
        assert_eq!(db.checkpoint_footprint(&b).await, footprint_a);
        assert_eq!(db.checkpoint_footprint(&c).await, footprint_a);
        let copied = saver.get_tuple(&b, "", None).await.unwrap().unwrap();
        let original = saver.get_tuple(&a, "", None).await.unwrap().unwrap();
        assert_eq!(copied.checkpoint, original.checkpoint);
        assert_eq!(copied.metadata, original.metadata);
        assert_eq!(copied.parent_id, original.parent_id);
        assert_eq!(copied.pending_writes, w);
        assert_eq!(copied.at.thread_id, b);

        // The copy goes its own way.
        saver
            .put_writes(&b, "", &ids_a[2], &[write("task", "x", json!(1))])
            .await
            .unwrap();
        let step = checkpoint(&[("n", 4)]);
        saver
            .put(
                &b,
                "",
                &step,
                &json!({}),
                Some(&ids_a[2]),
                &[full("n", 4, json!(4))],
            )
            .await
            .unwrap();
        assert_eq!(db.checkpoint_footprint(&a).await, footprint_a);

        // Copying a thread without checkpoints, or onto itself, changes nothing.
        saver.copy_thread(&thread(), &b).await.unwrap();
        saver.copy_thread(&a, &a).await.unwrap();
        assert_eq!(db.checkpoint_footprint(&a).await, footprint_a);
        assert_eq!(db.checkpoint_footprint(&b).await.checkpoints, 6);

        saver.delete_thread(&a).await.unwrap();
        assert_eq!(
            db.checkpoint_footprint(&a).await,
            CheckpointFootprint::default()
        );
        assert!(saver.get_tuple(&a, "", None).await.unwrap().is_none());
        assert!(saver
            .get_tuple(&a, "child:1", None)
            .await
            .unwrap()
            .is_none());
        assert_eq!(
            saver
                .get_tuple(&b, "", None)
                .await
                .unwrap()
                .unwrap()
                .checkpoint
                .id,
            step.id
        );
        assert_eq!(db.checkpoint_footprint(&c).await, footprint_a);
        // Deleting what does not exist is not an error.
        saver.delete_thread(&a).await.unwrap();
    })
    .await;
}

/// LangGraph's Python loop saves a step's writes while the checkpoint they were made on is
/// still being saved (`durability="async"`): writes that come first are kept, and read with
/// their checkpoint once it is stored; its first save does not take them away.
#[tokio::test]
async fn writes_saved_before_their_checkpoint_are_kept() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let ids = chain(saver.as_ref(), &t, "", 1).await;
        let next = checkpoint(&[("n", 2)]);
        let early = [
            write("task", "n", json!(5)),
            write("task", "__interrupt__", json!(["why"])),
        ];
        saver.put_writes(&t, "", &next.id, &early).await.unwrap();
        saver
            .put(
                &t,
                "",
                &next,
                &json!({"step": 1}),
                Some(&ids[0]),
                &[full("n", 2, json!(2))],
            )
            .await
            .unwrap();
        let got = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        assert_eq!(got.checkpoint.id, next.id);
        assert_eq!(got.pending_writes, early.to_vec());
    })
    .await;
}

/// A trigger channel (`branch:to:<node>`) has no blob from Spindle's engine, but LangGraph's
/// Python engine stores one and needs it back: it is loaded when there is one.
#[tokio::test]
async fn a_trigger_channel_with_a_blob_loads_its_value() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let c = checkpoint(&[("n", 1), ("branch:to:a", 1), ("branch:to:b", 2)]);
        let blobs = [full("n", 1, json!(1)), full("branch:to:a", 1, json!(null))];
        saver
            .put(&t, "", &c, &json!({"step": 0}), None, &blobs)
            .await
            .unwrap();
        let got = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        assert_eq!(
            got.checkpoint.channel_values.get("branch:to:a"),
            Some(&json!(null))
        );
        assert!(!got.checkpoint.channel_values.contains_key("branch:to:b"));
        assert_eq!(got.checkpoint.channel_values["n"], json!(1));
    })
    .await;
}

#[tokio::test]
async fn pending_writes_keep_their_order() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let ids = chain(saver.as_ref(), &t, "", 2).await;

        // Same sequence against the engine's in-memory saver: both must agree.
        let memory = InMemoryCheckpointer::new();
        chain_into(&memory, &saver, &t).await;
        let batches = [
            vec![
                write("a", "n", json!(1)),
                write("a", "__error__", json!("boom")),
            ],
            vec![
                write("b", "n", json!(2)),
                write("b", "__interrupt__", json!([1])),
            ],
            // A retried task replaces its special write and appends its plain one.
            vec![
                write("a", "n", json!(3)),
                write("a", "__error__", json!("again")),
            ],
            vec![],
        ];
        for batch in &batches {
            saver.put_writes(&t, "", &ids[1], batch).await.unwrap();
            memory.put_writes(&t, "", &ids[1], batch).await.unwrap();
        }
        let got = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        let want = memory.get_tuple(&t, "", None).await.unwrap().unwrap();
        assert_eq!(got.pending_writes, want.pending_writes);
        assert_eq!(got.pending_writes.len(), 5);
        assert_eq!(got.pending_writes[4].value, json!("again"));

        // Saving a checkpoint again under its id replaces it and its writes.
        let again = saver
            .get_tuple(&t, "", Some(&ids[1]))
            .await
            .unwrap()
            .unwrap();
        let mut replaced = again.checkpoint.clone();
        replaced.channel_versions.insert("n".into(), 3);
        for s in [saver.as_ref() as &dyn Checkpointer, &memory] {
            s.put(
                &t,
                "",
                &replaced,
                &json!({"again": true}),
                Some(&ids[0]),
                &[full("n", 3, json!(30))],
            )
            .await
            .unwrap();
        }
        let got = saver
            .get_tuple(&t, "", Some(&ids[1]))
            .await
            .unwrap()
            .unwrap();
        let want = memory
            .get_tuple(&t, "", Some(&ids[1]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, want);
        assert!(got.pending_writes.is_empty());
        assert_eq!(got.checkpoint.channel_values["n"], json!(30));
    })
    .await;
}

#[tokio::test]
async fn a_large_batch_of_writes_keeps_its_order() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let ids = chain(saver.as_ref(), &t, "", 1).await;
        // More rows than one insert statement carries, after writes already there.
        let first = vec![write("a", "n", json!(-1))];
        saver.put_writes(&t, "", &ids[0], &first).await.unwrap();
        let batch: Vec<PendingWrite> = (0..1_234)
            .map(|i| write(&format!("task-{}", i % 7), "n", json!(i)))
            .collect();
        saver.put_writes(&t, "", &ids[0], &batch).await.unwrap();
        let got = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        let want: Vec<PendingWrite> = first.into_iter().chain(batch).collect();
        assert_eq!(got.pending_writes, want);
    })
    .await;
}

/// Copies the checkpoints of `t` in `from` into `to` (for comparing savers).
async fn chain_into(to: &dyn Checkpointer, from: &Arc<dyn Checkpointer>, t: &str) {
    let mut all = from.list(t, None, &ListFilter::default()).await.unwrap();
    all.reverse();
    for tuple in all {
        let blobs: Vec<ChannelBlob> = tuple
            .checkpoint
            .channel_values
            .iter()
            .map(|(c, v)| full(c, tuple.checkpoint.channel_versions[c], v.clone()))
            .collect();
        to.put(
            t,
            &tuple.at.checkpoint_ns,
            &tuple.checkpoint,
            &tuple.metadata,
            tuple.parent_id.as_deref(),
            &blobs,
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn concurrent_writes_to_one_checkpoint_are_all_kept() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let ids = chain(saver.as_ref(), &t, "", 1).await;
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let saver = saver.clone();
                let (t, id) = (t.clone(), ids[0].clone());
                tokio::spawn(async move {
                    let task = format!("task-{i}");
                    saver
                        .put_writes(
                            &t,
                            "",
                            &id,
                            &[
                                write(&task, "n", json!(i)),
                                write(&task, "__done__", Value::Null),
                            ],
                        )
                        .await
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let got = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        assert_eq!(got.pending_writes.len(), 16);
        // Each task's writes stay together and in order.
        for pair in got.pending_writes.chunks(2) {
            assert_eq!(pair[0].task_id, pair[1].task_id);
            assert_eq!(
                (pair[0].channel.as_str(), pair[1].channel.as_str()),
                ("n", "__done__")
            );
        }
    })
    .await;
}

/// The latest checkpoint and a history page are read through the primary key, newest first,
/// not by sorting the thread.
#[tokio::test]
async fn latest_and_history_reads_use_the_index() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        chain(saver.as_ref(), &t, "", 50).await;
        let latest = "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, \
                      metadata FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 \
                      ORDER BY checkpoint_id DESC LIMIT 1";
        let page = "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, \
                    metadata FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = $2 \
                    AND checkpoint_id < $3 ORDER BY checkpoint_id DESC LIMIT 10";
        let before = new_checkpoint_id();
        for (sql, params) in [
            (latest, vec![t.as_str(), ""]),
            (page, vec![t.as_str(), "", &before]),
        ] {
            let plan = db.query_plan(sql, &params).await;
            match db.backend() {
                Backend::Sqlite => {
                    // The table is WITHOUT ROWID: its rows live in the primary key.
                    assert!(
                        plan.contains("SEARCH checkpoints USING PRIMARY KEY"),
                        "{plan}"
                    );
                    assert!(!plan.contains("TEMP B-TREE"), "sorts: {plan}");
                }
                Backend::Postgres => {
                    assert!(
                        plan.contains("Scan Backward using checkpoints_pkey"),
                        "{plan}"
                    );
                    assert!(!plan.contains("Sort"), "sorts: {plan}");
                }
            }
        }
    })
    .await;
}

#[tokio::test]
async fn nul_characters_survive_in_values_and_do_not_fail_a_step() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let text = json!("a\u{0}b");
        let c = checkpoint(&[("n", 1)]);
        saver
            .put(
                &t,
                "",
                &c,
                &json!({"writes": {"node": text}, "k\u{0}": 1}),
                None,
                &[full("n", 1, text.clone())],
            )
            .await
            .unwrap();
        saver
            .put_writes(&t, "", &c.id, &[write("task", "n", text.clone())])
            .await
            .unwrap();
        let got = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        assert_eq!(got.checkpoint.channel_values["n"], text);
        assert_eq!(got.pending_writes[0].value, text);
        // Metadata is jsonb on PostgreSQL, which cannot hold U+0000.
        let kept = match db.backend() {
            Backend::Sqlite => text,
            Backend::Postgres => json!("a\u{fffd}b"),
        };
        assert_eq!(got.metadata["writes"]["node"], kept);
    })
    .await;
}

#[tokio::test]
async fn a_queued_checkpoint_is_not_stored_without_its_parent() {
    for_each_backend(|db| async move {
        let saver = db.storage().checkpointer();
        let t = thread();
        let queued = |parent: Option<String>| QueuedWrite::Checkpoint {
            thread_id: t.clone(),
            checkpoint_ns: String::new(),
            checkpoint: Box::new(checkpoint(&[("n", 1)])),
            metadata: json!({"source": "loop", "step": 0}),
            parent_id: parent,
            blobs: vec![full("n", 1, json!(1))],
        };
        // A backend without a queue has the engine wait for each save before the next.
        let Ok(receipt) = saver.queue(queued(Some(new_checkpoint_id()))) else {
            return;
        };
        // Its parent's save failed (or never came): storing it would leave a checkpoint whose
        // history and delta bases are missing.
        let refused = receipt.await;
        assert!(
            matches!(refused, Err(CheckpointError::Missing(_))),
            "{refused:?}"
        );
        assert!(saver.get_tuple(&t, "", None).await.unwrap().is_none());

        let first = queued(None);
        let QueuedWrite::Checkpoint { checkpoint: c, .. } = &first else {
            unreachable!()
        };
        let first_id = c.id.clone();
        let first = saver.queue(first).map_err(|_| "queued before").unwrap();
        let second = saver
            .queue(queued(Some(first_id.clone())))
            .map_err(|_| "queued before")
            .unwrap();
        first.await.unwrap();
        second.await.unwrap();
        let latest = saver.get_tuple(&t, "", None).await.unwrap().unwrap();
        assert_eq!(latest.parent_id.as_deref(), Some(first_id.as_str()));
    })
    .await;
}
