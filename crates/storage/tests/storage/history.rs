//! What a thread's history keeps when its runs are rolled back, when it is copied, and when
//! the assistant of its runs is deleted; and the graph and assistant a run names in its
//! thread's metadata. The checkpoints are the engine's own (the `echo` example graph run
//! through the storage's checkpointer), plus a subgraph namespace with a pending write.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use spindle_graph::checkpoint::{
    new_checkpoint_id, now_rfc3339, BlobValue, ChannelBlob, Checkpoint, Checkpointer, ListFilter,
    PendingWrite,
};
use spindle_graph::{Durability, RunConfig, RunEnv, RunInput};
use spindle_storage::test_util::{for_each_backend, CheckpointFootprint, TestDb};
use spindle_storage::*;
use uuid::Uuid;

use crate::common::*;

const LEASE: Duration = Duration::from_secs(60);

fn new_run(thread_id: ResourceId, assistant_id: ResourceId, strategy: MultitaskStrategy) -> NewRun {
    NewRun {
        run_id: Uuid::new_v4(),
        thread_id,
        assistant_id,
        assistant_read: None,
        kwargs: JsonObject::new(),
        metadata: JsonObject::new(),
        multitask_strategy: strategy,
        run_after: Utc::now(),
        claim: None,
        if_thread_missing: IfThreadMissing::Reject,
        cron_firing: None,
    }
}

/// Creates a run and claims it for `worker` (the thread has nothing else active).
async fn running(s: &dyn Storage, scope: &Scope, thread: ResourceId, worker: &str) -> Run {
    let run = s
        .create_run(
            scope,
            new_run(thread, ResourceId::generate(), MultitaskStrategy::Enqueue),
        )
        .await
        .unwrap()
        .run;
    let claimed = s.claim_run(worker, LEASE, 3).await.unwrap().unwrap();
    assert_eq!(claimed.run.run_id, run.run_id);
    run
}

fn ended(status: RunStatus) -> RunEnd {
    RunEnd {
        status,
        error: None,
        thread_status: ThreadStatus::Idle,
        thread_values: Some(json!({"ended": status.as_str()})),
        thread_interrupts: JsonObject::new(),
        events: Vec::new(),
        after_checkpoint: None,
    }
}

/// One turn of the `echo` graph on `thread`, saved as run `run_id` saves it (its id in the
/// checkpoints' metadata), plus a checkpoint of a subgraph namespace with a pending write.
async fn turn(saver: &Arc<dyn Checkpointer>, thread: ResourceId, run_id: Uuid, text: &str) {
    let graph = Arc::new(spindle_graph::examples::get("echo").unwrap().unwrap());
    let metadata = json!({"run_id": run_id.to_string()});
    spindle_graph::pregel::run(
        &graph,
        RunInput::Values(json!({"messages": [{"role": "user", "content": text}]})),
        RunConfig {
            thread_id: Some(thread.to_string()),
            durability: Durability::Sync,
            config: json!({"metadata": metadata}),
            ..Default::default()
        },
        RunEnv {
            checkpointer: Some(saver.clone()),
            ..Default::default()
        },
    )
    .await
    .expect("the echo graph runs");
    let child = subgraph_checkpoint(text);
    saver
        .put(
            thread.as_str(),
            "child:1",
            &child,
            &metadata,
            None,
            &[ChannelBlob {
                channel: "note".into(),
                version: child.channel_versions["note"],
                value: BlobValue::Full { value: json!(text) },
            }],
        )
        .await
        .unwrap();
    let write = PendingWrite {
        task_id: "task".into(),
        channel: "note".into(),
        value: json!(text),
    };
    saver
        .put_writes(thread.as_str(), "child:1", &child.id, &[write])
        .await
        .unwrap();
}

/// A subgraph's checkpoint whose `note` channel is at a version of its own per text.
fn subgraph_checkpoint(text: &str) -> Checkpoint {
    Checkpoint {
        v: 1,
        id: new_checkpoint_id(),
        ts: now_rfc3339(),
        channel_values: Default::default(),
        channel_versions: [("note".to_owned(), 100 + text.len() as u64)].into(),
        versions_seen: Default::default(),
        updated_channels: Vec::new(),
        delta_depths: Default::default(),
    }
}

async fn messages(saver: &Arc<dyn Checkpointer>, thread: ResourceId) -> Vec<Value> {
    let latest = saver
        .get_tuple(thread.as_str(), "", None)
        .await
        .unwrap()
        .expect("the thread has a checkpoint");
    latest.checkpoint.channel_values["messages"]
        .as_array()
        .unwrap()
        .clone()
}

/// Every checkpoint of the thread, all namespaces, as `(namespace, id, pending writes)`.
async fn history(
    saver: &Arc<dyn Checkpointer>,
    thread: ResourceId,
) -> Vec<(String, String, usize)> {
    let all = saver
        .list(thread.as_str(), None, &ListFilter::default())
        .await
        .unwrap();
    let mut rows: Vec<_> = all
        .into_iter()
        .map(|t| {
            (
                t.at.checkpoint_ns,
                t.at.checkpoint_id,
                t.pending_writes.len(),
            )
        })
        .collect();
    rows.sort();
    rows
}

async fn status(s: &dyn Storage, scope: &Scope, thread: ResourceId) -> ThreadStatus {
    s.get_thread(scope, thread).await.unwrap().status
}

async fn footprint(db: &TestDb, thread: ResourceId) -> CheckpointFootprint {
    db.checkpoint_footprint(thread.as_str()).await
}

/// A save of a run that is gone, as a worker that still runs it would make.
async fn late_save(saver: &Arc<dyn Checkpointer>, thread: ResourceId, run_id: Uuid) -> bool {
    let late = subgraph_checkpoint("late");
    let blob = ChannelBlob {
        channel: "note".into(),
        version: late.channel_versions["note"],
        value: BlobValue::Full {
            value: json!("late"),
        },
    };
    saver
        .put(
            thread.as_str(),
            "",
            &late,
            &json!({"run_id": run_id.to_string()}),
            None,
            &[blob],
        )
        .await
        .is_ok()
}

/// Rolled back while its worker runs it (`multitask_strategy: rollback`), a run goes at its
/// end with every checkpoint it saved (all namespaces), their pending writes and blobs: the
/// thread is as the run before it left it, and a save its worker makes afterwards is refused.
#[tokio::test]
async fn a_rolled_back_run_takes_its_checkpoints_writes_and_blobs() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let saver = s.checkpointer();
        let alice = fresh_user();
        let thread = s
            .create_thread(&alice, new_thread(json!({})))
            .await
            .unwrap()
            .thread_id;
        let first = running(s, &alice, thread, "w").await;
        turn(&saver, thread, first.run_id, "one").await;
        s.finish_run(
            first.thread_id,
            first.run_id,
            "w",
            ended(RunStatus::Success),
        )
        .await
        .unwrap();
        let before = (footprint(&db, thread).await, history(&saver, thread).await);
        assert_eq!(messages(&saver, thread).await.len(), 2);

        let second = running(s, &alice, thread, "w").await;
        turn(&saver, thread, second.run_id, "two!").await;
        assert_eq!(messages(&saver, thread).await.len(), 4);
        let next = s
            .create_run(
                &alice,
                new_run(thread, ResourceId::generate(), MultitaskStrategy::Rollback),
            )
            .await
            .unwrap();
        assert_eq!(next.cancelled, vec![second.run_id]);
        let end = s
            .finish_run(
                second.thread_id,
                second.run_id,
                "w",
                ended(RunStatus::Interrupted),
            )
            .await
            .unwrap();
        assert_eq!(end, None, "a rolled-back run is deleted");
        assert_not_found(
            s.get_run(&alice, thread, second.run_id).await,
            "rolled back",
        );

        let after = (footprint(&db, thread).await, history(&saver, thread).await);
        assert_eq!(
            after, before,
            "the thread's history as the first run left it"
        );
        assert_eq!(messages(&saver, thread).await.len(), 2);
        assert_eq!(
            s.get_thread(&alice, thread).await.unwrap().values,
            Some(json!({"ended": "success"})),
            "the thread keeps the values it had before the rolled-back run"
        );

        assert!(
            !late_save(&saver, thread, second.run_id).await,
            "a save of the deleted run is refused"
        );
        assert_eq!(footprint(&db, thread).await, before.0);
        // The next run's saves are not.
        let claimed = s.claim_run("w2", LEASE, 3).await.unwrap().unwrap();
        assert_eq!(claimed.run.run_id, next.run.run_id);
        assert!(late_save(&saver, thread, next.run.run_id).await);
    })
    .await;
}

/// Rolled back (`cancel?action=rollback`) after its worker was lost, a run is deleted by the
/// claim that finds it, with its checkpoints; its worker, should it still run, saves nothing.
#[tokio::test]
async fn a_rolled_back_run_whose_worker_was_lost_takes_its_checkpoints() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let saver = s.checkpointer();
        let alice = fresh_user();
        let thread = s
            .create_thread(&alice, new_thread(json!({})))
            .await
            .unwrap()
            .thread_id;
        let run = running(s, &alice, thread, "w").await;
        turn(&saver, thread, run.run_id, "one").await;
        assert!(footprint(&db, thread).await.checkpoints > 0);
        s.cancel_runs(&alice, thread, &[run.run_id], CancelAction::Rollback)
            .await
            .unwrap();
        s.renew_lease(run.run_id, "w", Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(s.claim_run("w2", LEASE, 3).await.unwrap().is_none());
        assert_not_found(s.get_run(&alice, thread, run.run_id).await, "rolled back");
        assert_eq!(footprint(&db, thread).await, CheckpointFootprint::default());
        assert!(!late_save(&saver, thread, run.run_id).await);
        assert_eq!(footprint(&db, thread).await, CheckpointFootprint::default());
    })
    .await;
}

/// A copy has the whole history (every namespace, pending writes, blobs, the same checkpoint
/// ids, as LangGraph's copy), the graph its state is of, in one transaction; deleting the
/// original leaves it whole.
#[tokio::test]
async fn a_copy_carries_the_whole_history_and_outlives_its_original() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let saver = s.checkpointer();
        let alice = fresh_user();
        let echo = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("echo", "e", json!({}))),
            )
            .await
            .unwrap();
        let thread = s
            .create_thread(&alice, new_thread(json!({"k": 1})))
            .await
            .unwrap()
            .thread_id;
        let run = s
            .create_run(
                &alice,
                new_run(thread, echo.assistant_id, MultitaskStrategy::Enqueue),
            )
            .await
            .unwrap()
            .run;
        s.claim_run("w", LEASE, 3).await.unwrap().unwrap();
        turn(&saver, thread, run.run_id, "one").await;
        turn(&saver, thread, run.run_id, "two!").await;
        s.finish_run(run.thread_id, run.run_id, "w", ended(RunStatus::Success))
            .await
            .unwrap();
        let original = s.get_thread(&alice, thread).await.unwrap();

        let copy = s
            .copy_thread(&alice, thread, ResourceId::generate())
            .await
            .unwrap();
        assert_eq!(copy.status, ThreadStatus::Idle);
        assert_eq!(copy.metadata, original.metadata);
        assert_eq!(copy.metadata["graph_id"], json!("echo"));
        assert_eq!(copy.values, original.values);
        let history_of_original = history(&saver, thread).await;
        assert!(history_of_original
            .iter()
            .any(|(ns, _, w)| ns == "child:1" && *w == 1));
        assert_eq!(history(&saver, copy.thread_id).await, history_of_original);
        assert_eq!(
            footprint(&db, copy.thread_id).await,
            footprint(&db, thread).await
        );

        // As the server deletes a thread: its row, then its checkpoints.
        s.delete_thread(&alice, thread).await.unwrap();
        saver.delete_thread(thread.as_str()).await.unwrap();
        assert_eq!(footprint(&db, thread).await, CheckpointFootprint::default());
        assert_eq!(history(&saver, copy.thread_id).await, history_of_original);
        assert_eq!(messages(&saver, copy.thread_id).await.len(), 4);
        let child = saver
            .get_tuple(copy.thread_id.as_str(), "child:1", None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(child.checkpoint.channel_values["note"], json!("two!"));
        assert_eq!(child.pending_writes.len(), 1);
    })
    .await;
}

/// A thread whose metadata does not name its graph (its runs predate runs naming it) gets
/// its latest run's graph and assistant in the copy's metadata, so the copy has a graph.
#[tokio::test]
async fn a_copy_names_the_graph_of_its_originals_latest_run() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let echo = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("echo", "e", json!({}))),
            )
            .await
            .unwrap();
        let thread = s
            .create_thread(&alice, new_thread(json!({"k": 1})))
            .await
            .unwrap()
            .thread_id;
        // Busy when the run is created: the run leaves the metadata as it is.
        db.set_thread_state(thread, ThreadStatus::Busy, None).await;
        s.create_run(
            &alice,
            new_run(thread, echo.assistant_id, MultitaskStrategy::Enqueue),
        )
        .await
        .unwrap();
        assert_eq!(
            s.get_thread(&alice, thread).await.unwrap().metadata,
            obj(json!({"k": 1}))
        );
        let copy = s
            .copy_thread(&alice, thread, ResourceId::generate())
            .await
            .unwrap();
        assert_eq!(
            copy.metadata,
            obj(json!({
                "k": 1,
                "graph_id": "echo",
                "assistant_id": echo.assistant_id.to_string(),
            }))
        );
    })
    .await;
}

/// A run on a thread that is not busy writes its graph and assistant into the thread's
/// metadata, over what was there, as the reference does; one queued behind a busy thread's
/// run leaves them.
#[tokio::test]
async fn a_run_names_its_graph_and_assistant_in_its_threads_metadata() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let echo = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("echo", "e", json!({}))),
            )
            .await
            .unwrap();
        let chain = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("chain", "c", json!({}))),
            )
            .await
            .unwrap();
        let thread = s
            .create_thread(
                &alice,
                new_thread(json!({"graph_id": "old", "assistant_id": "x", "k": 1})),
            )
            .await
            .unwrap()
            .thread_id;
        let metadata = |graph: &str, assistant: &Assistant| {
            obj(json!({
                "graph_id": graph,
                "assistant_id": assistant.assistant_id.to_string(),
                "k": 1,
            }))
        };

        let first = s
            .create_run(
                &alice,
                new_run(thread, echo.assistant_id, MultitaskStrategy::Enqueue),
            )
            .await
            .unwrap()
            .run;
        assert_eq!(
            s.get_thread(&alice, thread).await.unwrap().metadata,
            metadata("echo", &echo)
        );
        let queued = s
            .create_run(
                &alice,
                new_run(thread, chain.assistant_id, MultitaskStrategy::Enqueue),
            )
            .await
            .unwrap()
            .run;
        assert_eq!(
            s.get_thread(&alice, thread).await.unwrap().metadata,
            metadata("echo", &echo),
            "a run queued on a busy thread leaves the metadata"
        );
        for run in [first, queued] {
            let claimed = s.claim_run("w", LEASE, 3).await.unwrap().unwrap();
            assert_eq!(claimed.run.run_id, run.run_id);
            s.finish_run(run.thread_id, run.run_id, "w", ended(RunStatus::Success))
                .await
                .unwrap();
        }
        s.create_run(
            &alice,
            new_run(thread, chain.assistant_id, MultitaskStrategy::Enqueue),
        )
        .await
        .unwrap();
        let found = s
            .search_threads(
                &alice,
                thread_search(ThreadFilter {
                    metadata: Some(obj(json!({"graph_id": "chain"}))),
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
        assert_eq!(ids_of_threads(&found.items), vec![thread]);
        assert_eq!(found.items[0].metadata, metadata("chain", &chain));
    })
    .await;
}

/// Deleting an assistant stops its active runs and deletes its runs (their events with
/// them), releases their threads and keeps the threads with their state; the runs that
/// were running are returned, for their workers to be stopped.
#[tokio::test]
async fn deleting_an_assistant_stops_and_deletes_its_runs_and_keeps_their_threads() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let saver = s.checkpointer();
        let alice = fresh_user();
        let doomed = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("echo", "d", json!({}))),
            )
            .await
            .unwrap();
        let other = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("echo", "o", json!({}))),
            )
            .await
            .unwrap();
        let t_running = s
            .create_thread(&alice, new_thread(json!({})))
            .await
            .unwrap();
        let t_done = s
            .create_thread(&alice, new_thread(json!({})))
            .await
            .unwrap();
        let t_pending = s
            .create_thread(&alice, new_thread(json!({})))
            .await
            .unwrap();

        // A finished run of the assistant, with checkpoints.
        let done = s
            .create_run(
                &alice,
                new_run(
                    t_done.thread_id,
                    doomed.assistant_id,
                    MultitaskStrategy::Enqueue,
                ),
            )
            .await
            .unwrap()
            .run;
        s.claim_run("w", LEASE, 3).await.unwrap().unwrap();
        turn(&saver, t_done.thread_id, done.run_id, "one").await;
        s.append_events(&[LoggedEvent {
            thread_id: t_done.thread_id,
            seq: 1,
            run_id: done.run_id,
            event: "values".into(),
            data: json!({}),
            created_at: Utc::now(),
        }])
        .await
        .unwrap();
        s.finish_run(done.thread_id, done.run_id, "w", ended(RunStatus::Success))
            .await
            .unwrap();
        // A running one, with another assistant's run queued behind it.
        let live = s
            .create_run(
                &alice,
                new_run(
                    t_running.thread_id,
                    doomed.assistant_id,
                    MultitaskStrategy::Enqueue,
                ),
            )
            .await
            .unwrap()
            .run;
        s.claim_run("w", LEASE, 3).await.unwrap().unwrap();
        let behind = s
            .create_run(
                &alice,
                new_run(
                    t_running.thread_id,
                    other.assistant_id,
                    MultitaskStrategy::Enqueue,
                ),
            )
            .await
            .unwrap()
            .run;
        // A pending one, alone on its thread.
        let pending = s
            .create_run(
                &alice,
                new_run(
                    t_pending.thread_id,
                    doomed.assistant_id,
                    MultitaskStrategy::Enqueue,
                ),
            )
            .await
            .unwrap()
            .run;
        let before = footprint(&db, t_done.thread_id).await;

        let stopped = s
            .delete_assistant(&alice, doomed.assistant_id, false)
            .await
            .unwrap();
        assert_eq!(stopped, vec![live.run_id]);
        assert_not_found(
            s.get_assistant(&alice, doomed.assistant_id).await,
            "deleted",
        );
        for (thread, run) in [
            (t_done.thread_id, done.run_id),
            (t_running.thread_id, live.run_id),
            (t_pending.thread_id, pending.run_id),
        ] {
            assert_not_found(s.get_run(&alice, thread, run).await, "its runs go");
        }
        assert!(s
            .read_events(t_done.thread_id, 0, None, 100)
            .await
            .unwrap()
            .is_empty());
        // The threads stay, with their state.
        assert_eq!(footprint(&db, t_done.thread_id).await, before);
        assert_eq!(
            status(s, &alice, t_done.thread_id).await,
            ThreadStatus::Idle
        );
        assert_eq!(
            status(s, &alice, t_pending.thread_id).await,
            ThreadStatus::Idle
        );
        assert_eq!(
            status(s, &alice, t_running.thread_id).await,
            ThreadStatus::Busy,
            "the other assistant's run still waits on it"
        );
        let next = s.claim_run("w2", LEASE, 3).await.unwrap().unwrap();
        assert_eq!(next.run.run_id, behind.run_id, "and may start now");
        // Its worker's late saves are refused.
        assert!(!late_save(&saver, t_running.thread_id, live.run_id).await);
        assert_eq!(
            s.get_run(&alice, t_running.thread_id, behind.run_id)
                .await
                .unwrap()
                .assistant_id,
            other.assistant_id
        );
    })
    .await;
}

/// With `delete_threads`, the caller's threads whose metadata names the assistant go too
/// (as the reference's `?delete_threads=true`), their running runs returned to be stopped;
/// another user's threads stay.
#[tokio::test]
async fn deleting_an_assistant_with_its_threads() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let bob = fresh_user();
        let shared = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("echo", "s", json!({}))),
            )
            .await
            .unwrap();
        let names = json!({"assistant_id": shared.assistant_id.to_string()});
        let mine = s
            .create_thread(&alice, new_thread(names.clone()))
            .await
            .unwrap();
        let unrelated = s
            .create_thread(&alice, new_thread(json!({})))
            .await
            .unwrap();
        let live = s
            .create_run(
                &alice,
                new_run(
                    mine.thread_id,
                    shared.assistant_id,
                    MultitaskStrategy::Enqueue,
                ),
            )
            .await
            .unwrap()
            .run;
        s.claim_run("w", LEASE, 3).await.unwrap().unwrap();
        let bobs = s.create_thread(&bob, new_thread(names)).await.unwrap();

        let stopped = s
            .delete_assistant(&alice, shared.assistant_id, true)
            .await
            .unwrap();
        assert_eq!(stopped, vec![live.run_id]);
        assert_not_found(
            s.get_thread(&alice, mine.thread_id).await,
            "its thread goes",
        );
        s.get_thread(&alice, unrelated.thread_id).await.unwrap();
        s.get_thread(&bob, bobs.thread_id).await.unwrap();
    })
    .await;
}
