use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use spindle_graph::checkpoint::new_checkpoint_id;
use spindle_storage::test_util::{for_each_backend, for_each_backend_alone, TestDb};

use spindle_storage::*;
use uuid::Uuid;

use crate::common::*;

const LEASE: Duration = Duration::from_secs(60);
const ATTEMPTS: i32 = 3;

fn new_run(thread_id: ResourceId, strategy: MultitaskStrategy) -> NewRun {
    NewRun {
        run_id: Uuid::new_v4(),
        thread_id,
        assistant_id: ResourceId::generate(),
        assistant_read: None,
        kwargs: obj(json!({"input": {"zeta": 1, "alpha": 2}, "stream_mode": ["values"]})),
        metadata: obj(json!({"m": 1})),
        multitask_strategy: strategy,
        run_after: Utc::now(),
        claim: None,
        if_thread_missing: IfThreadMissing::Reject,
        cron_firing: None,
    }
}

async fn thread_of(s: &dyn Storage, scope: &Scope) -> ResourceId {
    s.create_thread(scope, new_thread(json!({})))
        .await
        .unwrap()
        .thread_id
}

async fn run_on(
    s: &dyn Storage,
    scope: &Scope,
    thread: ResourceId,
    strategy: MultitaskStrategy,
) -> Run {
    s.create_run(scope, new_run(thread, strategy))
        .await
        .unwrap()
        .run
}

async fn claim(s: &dyn Storage, worker: &str) -> Option<ClaimedRun> {
    s.claim_run(worker, LEASE, ATTEMPTS).await.unwrap()
}

fn end(status: RunStatus, thread_status: ThreadStatus) -> RunEnd {
    RunEnd {
        status,
        error: None,
        thread_status,
        thread_values: Some(json!({"done": status.as_str()})),
        thread_interrupts: JsonObject::new(),
        events: Vec::new(),
        after_checkpoint: None,
    }
}

async fn run_status(s: &dyn Storage, scope: &Scope, thread: ResourceId, run: Uuid) -> RunStatus {
    s.get_run(scope, thread, run).await.unwrap().status
}

async fn thread_status(s: &dyn Storage, scope: &Scope, thread: ResourceId) -> ThreadStatus {
    s.get_thread(scope, thread).await.unwrap().status
}

/// Ends `worker`'s lease on the run now, as if it had died.
async fn expire(s: &dyn Storage, run_id: Uuid, worker: &str) {
    s.renew_lease(run_id, worker, Duration::ZERO)
        .await
        .unwrap()
        .expect("the worker holds the run");
    // Past the lease's end on any clock resolution.
    tokio::time::sleep(Duration::from_millis(2)).await;
}

fn event(thread_id: ResourceId, run_id: Uuid, seq: i64) -> LoggedEvent {
    LoggedEvent {
        thread_id,
        seq,
        run_id,
        event: if seq % 2 == 0 {
            "values"
        } else {
            "updates|child:1"
        }
        .to_owned(),
        // Key order is not alphabetical: the log keeps it as written.
        data: json!({"seq": seq, "b": [1, 2], "a": {"z": null, "y": "text"}}),
        created_at: Utc::now(),
    }
}

fn seqs(events: &[LoggedEvent]) -> Vec<i64> {
    events.iter().map(|e| e.seq).collect()
}

#[tokio::test]
async fn create_stores_a_pending_run_and_marks_the_thread_busy() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let new = new_run(thread, MultitaskStrategy::Enqueue);
        let created = s.create_run(&alice, new.clone()).await.unwrap();
        assert!(created.cancelled.is_empty());
        let run = created.run;
        assert_eq!(run.run_id, new.run_id);
        assert_eq!(run.thread_id, thread);
        assert_eq!(run.assistant_id, new.assistant_id);
        assert_eq!(run.user_id.as_deref(), Some(alice.user_id.as_str()));
        assert_eq!(run.status, RunStatus::Pending);
        assert_eq!(run.kwargs, new.kwargs);
        assert_eq!(
            serde_json::to_string(&run.kwargs["input"]).unwrap(),
            r#"{"zeta":1,"alpha":2}"#
        );
        assert_eq!(run.metadata, new.metadata);
        assert_eq!(run.multitask_strategy, MultitaskStrategy::Enqueue);
        assert_eq!(run.attempt, 0);
        assert_eq!(run.cancel, None);
        assert_eq!(run.created_at, run.updated_at);
        assert_eq!(s.get_run(&alice, thread, run.run_id).await.unwrap(), run);
        assert_eq!(
            s.list_runs(&alice, thread, RunFilter::default(), all())
                .await
                .unwrap(),
            vec![run.clone()]
        );
        let t = s.get_thread(&alice, thread).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Busy);
        assert!(t.updated_at >= run.created_at);

        assert_conflict(
            s.create_run(&alice, new.clone()).await,
            "a run id that is taken",
        );
        assert_not_found(
            s.get_run(&alice, ResourceId::generate(), run.run_id).await,
            "a run under another thread id",
        );
    })
    .await;
}

/// A run created claimed says whether its thread has a checkpoint yet: the first run of a
/// new thread then starts without reading one.
#[tokio::test]
async fn a_run_created_claimed_knows_whether_its_thread_is_new() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let claimed = || NewRun {
            claim: Some(Claim {
                worker_id: "w".into(),
                lease: LEASE,
            }),
            ..new_run(thread, MultitaskStrategy::Enqueue)
        };
        let first = s.create_run(&alice, claimed()).await.unwrap();
        let start = first.claimed.expect("created claimed");
        assert!(start.thread_is_new, "no checkpoint yet");
        // Not claimed: nobody asked, and it says nothing.
        let queued = s
            .create_run(&alice, new_run(thread, MultitaskStrategy::Enqueue))
            .await
            .unwrap();
        assert_eq!(queued.claimed, None);
        s.cancel_runs(
            &alice,
            thread,
            &[queued.run.run_id],
            CancelAction::Interrupt,
        )
        .await
        .unwrap();

        save_checkpoint(s, thread, &new_checkpoint_id()).await;
        s.finish_run(
            first.run.thread_id,
            first.run.run_id,
            "w",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        let second = s.create_run(&alice, claimed()).await.unwrap();
        let start = second.claimed.expect("created claimed");
        assert!(!start.thread_is_new, "the thread has a checkpoint now");
    })
    .await;
}

/// A run claimed from the queue is never told its thread is new when the thread has a
/// checkpoint (the run would start over and lose the thread's state); PostgreSQL's claim also
/// tells a new thread so, sparing the run a read.
#[tokio::test]
async fn a_run_claimed_from_the_queue_knows_whether_its_thread_is_new() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let fresh = thread_of(s, &alice).await;
        let kept = thread_of(s, &alice).await;
        save_checkpoint(s, kept, &new_checkpoint_id()).await;
        run_on(s, &alice, fresh, MultitaskStrategy::Enqueue).await;
        run_on(s, &alice, kept, MultitaskStrategy::Enqueue).await;
        let first = claim(s, "w").await.expect("a run to claim");
        let second = claim(s, "w").await.expect("another run to claim");
        assert_eq!(
            (first.run.thread_id, second.run.thread_id),
            (fresh, kept),
            "oldest first"
        );
        assert!(!second.thread_is_new, "the thread has a checkpoint");
        if db.backend() == Backend::Postgres {
            assert!(first.thread_is_new, "no checkpoint yet");
        }
    })
    .await;
}

/// Saves an empty root checkpoint `id` on `thread`.
async fn save_checkpoint(s: &dyn Storage, thread: ResourceId, id: &str) {
    let checkpoint = spindle_graph::checkpoint::Checkpoint {
        v: 1,
        id: id.to_owned(),
        ts: Utc::now().to_rfc3339(),
        channel_values: Default::default(),
        channel_versions: Default::default(),
        versions_seen: Default::default(),
        updated_channels: Vec::new(),
        delta_depths: Default::default(),
    };
    s.checkpointer()
        .put(thread.as_str(), "", &checkpoint, &json!({}), None, &[])
        .await
        .unwrap();
}

/// A worker writes a run's end behind its last save without waiting for it: the end holds
/// only if that checkpoint of the run's thread is stored, and a refused end changes nothing.
#[tokio::test]
async fn an_end_behind_a_checkpoint_is_refused_until_that_checkpoint_is_stored() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let other = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Reject).await;
        claim(s, "w").await.unwrap();
        let last = new_checkpoint_id();
        // The same id on another thread is not the run's checkpoint.
        save_checkpoint(s, other, &last).await;
        let behind = || RunEnd {
            events: vec![event(thread, run.run_id, 1)],
            after_checkpoint: Some(last.clone()),
            ..end(RunStatus::Success, ThreadStatus::Idle)
        };
        let refused = s.finish_run(run.thread_id, run.run_id, "w", behind()).await;
        assert!(
            matches!(refused, Err(StorageError::Checkpoint(_))),
            "{refused:?}"
        );
        assert_eq!(
            run_status(s, &alice, thread, run.run_id).await,
            RunStatus::Running
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Busy);
        let logged = s.read_events(thread, 0, None, 100).await.unwrap();
        assert!(logged.is_empty(), "a refused end logged {logged:?}");

        save_checkpoint(s, thread, &last).await;
        s.finish_run(run.thread_id, run.run_id, "w", behind())
            .await
            .unwrap();
        assert_eq!(
            run_status(s, &alice, thread, run.run_id).await,
            RunStatus::Success
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Idle);
        let logged = s.read_events(thread, 0, None, 100).await.unwrap();
        assert_eq!(logged.len(), 2, "the run's event and its end");
    })
    .await;
}

/// A run's checkpoint save, as the engine asks for it.
fn checkpoint_write(thread: ResourceId, id: &str) -> spindle_graph::checkpoint::QueuedWrite {
    spindle_graph::checkpoint::QueuedWrite::Checkpoint {
        thread_id: thread.to_string(),
        checkpoint_ns: String::new(),
        checkpoint: Box::new(spindle_graph::checkpoint::Checkpoint {
            v: 1,
            id: id.to_owned(),
            ts: Utc::now().to_rfc3339(),
            channel_values: Default::default(),
            channel_versions: Default::default(),
            versions_seen: Default::default(),
            updated_channels: Vec::new(),
            delta_depths: Default::default(),
        }),
        metadata: json!({"step": 1}),
        parent_id: None,
        blobs: Vec::new(),
    }
}

/// Stores a logged save the way the worker does: queued, then its receipt awaited.
async fn store_logged(
    s: &dyn Storage,
    save: LoggedSave,
) -> Result<(), spindle_graph::checkpoint::CheckpointError> {
    s.queue_logged(save).await
}

async fn checkpoint_stored(s: &dyn Storage, thread: ResourceId, id: &str) -> bool {
    s.checkpointer()
        .get_tuple(thread.as_str(), "", Some(id))
        .await
        .unwrap()
        .is_some()
}

/// A step's checkpoint is stored with the run's events emitted before it, in one
/// transaction (queued or awaited): both are stored, or neither, so a crash can never leave
/// a step saved whose events the log lacks.
#[tokio::test]
async fn a_save_and_the_events_before_it_are_stored_together_or_not_at_all() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let first = claim(s, "w").await.unwrap().last_seq + 1;
        for queued in [true, false] {
            let base = s.last_event_seq(thread).await.unwrap();
            let events = vec![
                event(thread, run.run_id, base + 1),
                event(thread, run.run_id, base + 2),
            ];
            let id = new_checkpoint_id();
            let save = LoggedSave {
                write: checkpoint_write(thread, &id),
                events: events.clone(),
            };
            if queued {
                store_logged(s, save).await.unwrap();
            } else {
                s.save_logged(save).await.unwrap();
            }
            assert!(checkpoint_stored(s, thread, &id).await);
            let logged = s.read_events(thread, base, None, 100).await.unwrap();
            assert_eq!(seqs(&logged), seqs(&events), "queued: {queued}");
            assert_eq!(logged[0].data, events[0].data);

            // Events that reuse a seq are refused, and take their checkpoint with them.
            let refused = new_checkpoint_id();
            let save = LoggedSave {
                write: checkpoint_write(thread, &refused),
                events: vec![event(thread, run.run_id, base + 2)],
            };
            let outcome = if queued {
                store_logged(s, save).await
            } else {
                s.save_logged(save).await
            };
            assert!(outcome.is_err(), "queued: {queued}");
            assert!(
                !checkpoint_stored(s, thread, &refused).await,
                "a checkpoint stored without its events (queued: {queued})"
            );
            assert_eq!(s.last_event_seq(thread).await.unwrap(), base + 2);
        }
        // A save with no events to carry is a plain save.
        let id = new_checkpoint_id();
        let save = LoggedSave {
            write: checkpoint_write(thread, &id),
            events: Vec::new(),
        };
        store_logged(s, save).await.unwrap();
        assert!(checkpoint_stored(s, thread, &id).await);
        assert_eq!(s.last_event_seq(thread).await.unwrap(), first + 3);
    })
    .await;
}

/// A run offered a claim starts claimed when nothing else is active on its thread and it is
/// due; otherwise it is queued as usual and the claim is not used.
#[tokio::test]
async fn a_run_created_with_a_claim_starts_claimed_only_when_it_can_start_now() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let offer = || {
            Some(Claim {
                worker_id: "w1".into(),
                lease: LEASE,
            })
        };
        let offered = |thread| NewRun {
            claim: offer(),
            ..new_run(thread, MultitaskStrategy::Enqueue)
        };

        let first = s.create_run(&alice, offered(thread)).await.unwrap();
        assert_eq!(first.run.status, RunStatus::Running);
        assert_eq!(first.run.attempt, 1);
        assert!(first.run.started_at.is_some());
        // What creation answers is what a read gives.
        assert_eq!(
            s.get_run(&alice, thread, first.run.run_id).await.unwrap(),
            first.run
        );
        let after_seq = first.claimed.expect("created claimed").last_seq;
        // Its first event is logged with it: a stream may send it at once.
        let logged = s.read_events(thread, 0, None, 10).await.unwrap();
        let start = logged.last().expect("the run's first event");
        assert_eq!(
            (start.seq, start.event.as_str(), &start.data),
            (
                after_seq,
                "metadata",
                &start_event_data(first.run.run_id, 1)
            )
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Busy);
        // Claimed for w1: no other worker takes it, and w1 holds its lease.
        assert!(claim(s, "w2").await.is_none());
        assert!(s
            .renew_lease(first.run.run_id, "w1", LEASE)
            .await
            .unwrap()
            .is_some());

        // The thread is taken: the next one is queued, claim or not.
        let second = s.create_run(&alice, offered(thread)).await.unwrap();
        assert_eq!(second.run.status, RunStatus::Pending);
        assert_eq!(second.run.attempt, 0);
        assert_eq!(second.claimed, None);

        // A delayed run on an idle thread waits for its time.
        let idle = thread_of(s, &alice).await;
        let delayed = s
            .create_run(
                &alice,
                NewRun {
                    run_after: Utc::now() + chrono::Duration::seconds(60),
                    ..offered(idle)
                },
            )
            .await
            .unwrap();
        assert_eq!(delayed.run.status, RunStatus::Pending);
        assert_eq!(delayed.claimed, None);

        // The claimed run ends like any other, and the queued one is claimed next.
        s.finish_run(
            first.run.thread_id,
            first.run.run_id,
            "w1",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        let next = claim(s, "w2").await.expect("the queued run");
        assert_eq!(next.run.run_id, second.run.run_id);
        assert!(next.last_seq > after_seq, "the first run's end was logged");
    })
    .await;
}

#[tokio::test]
async fn a_missing_thread_is_refused_or_created() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let bob = fresh_user();
        let missing = ResourceId::generate();
        assert_not_found(
            s.create_run(&alice, new_run(missing, MultitaskStrategy::Enqueue))
                .await,
            "reject on a missing thread",
        );
        assert_not_found(s.get_thread(&alice, missing).await, "nothing created");

        let create = NewRun {
            if_thread_missing: IfThreadMissing::Create {
                metadata: obj(json!({"graph_id": "echo"})),
            },
            ..new_run(missing, MultitaskStrategy::Reject)
        };
        let run = s.create_run(&alice, create.clone()).await.unwrap().run;
        let thread = s.get_thread(&alice, missing).await.unwrap();
        assert_eq!(thread.user_id.as_deref(), Some(alice.user_id.as_str()));
        assert_eq!(thread.metadata, obj(json!({"graph_id": "echo"})));
        assert_eq!(thread.status, ThreadStatus::Busy);
        assert_eq!(run.thread_id, missing);

        // Another user's thread is not there to be used, nor to be created.
        assert_not_found(
            s.create_run(
                &bob,
                NewRun {
                    run_id: Uuid::new_v4(),
                    ..create
                },
            )
            .await,
            "create on another user's thread",
        );
    })
    .await;
}

#[tokio::test]
async fn another_users_runs_do_not_exist() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let bob = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert_not_found(
            s.create_run(&bob, new_run(thread, MultitaskStrategy::Enqueue))
                .await,
            "bob runs on alice's thread",
        );
        assert_not_found(s.get_run(&bob, thread, run.run_id).await, "bob gets");
        assert_not_found(
            s.list_runs(&bob, thread, RunFilter::default(), all()).await,
            "bob lists",
        );
        assert_not_found(
            s.cancel_runs(&bob, thread, &[run.run_id], CancelAction::Interrupt)
                .await,
            "bob cancels",
        );
        let claimed = claim(s, "w").await.unwrap();
        s.finish_run(
            run.thread_id,
            run.run_id,
            "w",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        assert_eq!(claimed.run.run_id, run.run_id);
        assert_not_found(s.delete_run(&bob, thread, run.run_id).await, "bob deletes");
        assert_eq!(
            run_status(s, &alice, thread, run.run_id).await,
            RunStatus::Success
        );
        assert_eq!(
            s.list_runs(&alice, thread, RunFilter::default(), all())
                .await
                .unwrap()
                .len(),
            1
        );
    })
    .await;
}

#[tokio::test]
async fn list_is_newest_first_with_status_filter_and_paging() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(
                run_on(s, &alice, thread, MultitaskStrategy::Enqueue)
                    .await
                    .run_id,
            );
        }
        claim(s, "w").await.unwrap();
        let listed: Vec<Uuid> = s
            .list_runs(&alice, thread, RunFilter::default(), all())
            .await
            .unwrap()
            .iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(listed, ids.iter().rev().copied().collect::<Vec<_>>());
        let page2: Vec<Uuid> = s
            .list_runs(&alice, thread, RunFilter::default(), page(2, 1))
            .await
            .unwrap()
            .iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(page2, vec![ids[2], ids[1]]);
        let running = s
            .list_runs(
                &alice,
                thread,
                RunFilter {
                    status: Some(RunStatus::Running),
                },
                all(),
            )
            .await
            .unwrap();
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].run_id, ids[0]);
        assert_not_found(
            s.list_runs(&alice, ResourceId::generate(), RunFilter::default(), all())
                .await,
            "runs of a missing thread",
        );
    })
    .await;
}

#[tokio::test]
async fn reject_conflicts_while_a_run_is_pending_or_running() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let first = run_on(s, &alice, thread, MultitaskStrategy::Reject).await;
        assert_conflict(
            s.create_run(&alice, new_run(thread, MultitaskStrategy::Reject))
                .await,
            "reject with a pending run",
        );
        claim(s, "w").await.unwrap();
        assert_conflict(
            s.create_run(&alice, new_run(thread, MultitaskStrategy::Reject))
                .await,
            "reject with a running run",
        );
        let listed = s
            .list_runs(&alice, thread, RunFilter::default(), all())
            .await
            .unwrap();
        assert_eq!(listed.len(), 1, "a refused run is not stored");
        s.finish_run(
            first.thread_id,
            first.run_id,
            "w",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Idle);
        run_on(s, &alice, thread, MultitaskStrategy::Reject).await;
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Busy);
    })
    .await;
}

#[tokio::test]
async fn enqueue_runs_one_after_the_other_oldest_first() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let first = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let second = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;

        let claimed = claim(s, "w1").await.unwrap();
        assert_eq!(claimed.run.run_id, first.run_id);
        assert_eq!(claimed.run.status, RunStatus::Running);
        assert_eq!(claimed.run.attempt, 1);
        assert_eq!(claimed.last_seq, 0);
        assert!(
            claim(s, "w2").await.is_none(),
            "the thread's next run waits for the running one"
        );
        assert_eq!(
            run_status(s, &alice, thread, second.run_id).await,
            RunStatus::Pending
        );

        s.finish_run(
            first.thread_id,
            first.run_id,
            "w1",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        let t = s.get_thread(&alice, thread).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Busy, "another run is pending");
        assert_eq!(t.values, Some(json!({"done": "success"})));

        let claimed = claim(s, "w2").await.unwrap();
        assert_eq!(claimed.run.run_id, second.run_id);
        s.finish_run(
            second.thread_id,
            second.run_id,
            "w2",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Idle);
        assert!(claim(s, "w2").await.is_none());
    })
    .await;
}

#[tokio::test]
async fn interrupt_ends_pending_runs_and_flags_the_running_one() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let running = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w1").await.unwrap();
        let pending = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;

        let created = s
            .create_run(&alice, new_run(thread, MultitaskStrategy::Interrupt))
            .await
            .unwrap();
        assert_eq!(created.cancelled, vec![running.run_id, pending.run_id]);
        assert_eq!(
            run_status(s, &alice, thread, pending.run_id).await,
            RunStatus::Interrupted
        );
        let flagged = s.get_run(&alice, thread, running.run_id).await.unwrap();
        assert_eq!(flagged.status, RunStatus::Running);
        assert_eq!(flagged.cancel, Some(CancelAction::Interrupt));
        let renewed = s
            .renew_lease(running.run_id, "w1", LEASE)
            .await
            .unwrap()
            .expect("w1 still holds the run");
        assert_eq!(renewed.cancel, Some(CancelAction::Interrupt));

        assert!(claim(s, "w2").await.is_none(), "still running");
        s.finish_run(
            running.thread_id,
            running.run_id,
            "w1",
            end(RunStatus::Interrupted, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        assert_eq!(
            run_status(s, &alice, thread, running.run_id).await,
            RunStatus::Interrupted
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Busy);
        let next = claim(s, "w2").await.unwrap();
        assert_eq!(next.run.run_id, created.run.run_id);
    })
    .await;
}

#[tokio::test]
async fn rollback_deletes_pending_runs_and_the_running_one_when_it_ends() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let running = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w1").await.unwrap();
        s.append_events(&[
            event(thread, running.run_id, 1),
            event(thread, running.run_id, 2),
        ])
        .await
        .unwrap();
        let pending = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;

        let created = s
            .create_run(&alice, new_run(thread, MultitaskStrategy::Rollback))
            .await
            .unwrap();
        assert_eq!(created.cancelled, vec![running.run_id, pending.run_id]);
        assert_not_found(
            s.get_run(&alice, thread, pending.run_id).await,
            "a pending run rolled back",
        );
        assert_eq!(
            s.get_run(&alice, thread, running.run_id)
                .await
                .unwrap()
                .cancel,
            Some(CancelAction::Rollback)
        );
        s.finish_run(
            running.thread_id,
            running.run_id,
            "w1",
            end(RunStatus::Interrupted, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        assert_not_found(
            s.get_run(&alice, thread, running.run_id).await,
            "a running run rolled back once it ended",
        );
        assert!(s
            .read_events(thread, 0, None, 100)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Busy);
        let next = claim(s, "w2").await.unwrap();
        assert_eq!(next.run.run_id, created.run.run_id);
        // The rolled-back run's events are gone, but their seqs are not handed out again: a
        // client that saw them resumes after them without missing the next run's events.
        assert_eq!(next.last_seq, 2);
        assert_conflict(
            s.append_events(&[event(thread, next.run.run_id, 2)]).await,
            "a seq of a removed event",
        );
        // A worker that lost the rolled-back run cannot log events for it any more, alone or
        // beside another run's.
        assert_not_found(
            s.append_events(&[event(thread, running.run_id, 3)]).await,
            "events of a rolled-back run",
        );
        assert_not_found(
            s.append_events(&[
                event(thread, next.run.run_id, 3),
                event(thread, running.run_id, 4),
            ])
            .await,
            "events of a rolled-back run beside a running one's",
        );
        assert!(s
            .read_events(thread, 0, None, 100)
            .await
            .unwrap()
            .is_empty());
    })
    .await;
}

#[tokio::test]
async fn racing_claims_run_one_run_per_thread() {
    for_each_backend(|db| async move {
        let s = db.storage_arc();
        let alice = fresh_user();
        let mut threads = Vec::new();
        for _ in 0..4 {
            let thread = thread_of(&*s, &alice).await;
            for _ in 0..3 {
                run_on(&*s, &alice, thread, MultitaskStrategy::Enqueue).await;
            }
            threads.push(thread);
        }
        for round in 0..3 {
            let claims: Vec<_> = (0..12)
                .map(|i| {
                    let s = s.clone();
                    let worker = format!("w{i}");
                    tokio::spawn(async move {
                        let claimed = s.claim_run(&worker, LEASE, ATTEMPTS).await;
                        (worker, claimed)
                    })
                })
                .collect();
            let mut claimed = Vec::new();
            for handle in claims {
                let (worker, result) = handle.await.unwrap();
                if let Some(c) = result.expect("a claim never fails") {
                    claimed.push((worker, c.run));
                }
            }
            let claimed_threads: HashSet<ResourceId> =
                claimed.iter().map(|(_, r)| r.thread_id).collect();
            assert_eq!(claimed.len(), 4, "round {round}: one claim per thread");
            assert_eq!(claimed_threads, threads.iter().copied().collect());
            for thread in &threads {
                let running = s
                    .list_runs(
                        &alice,
                        *thread,
                        RunFilter {
                            status: Some(RunStatus::Running),
                        },
                        all(),
                    )
                    .await
                    .unwrap();
                assert_eq!(running.len(), 1, "round {round}");
            }
            for (worker, run) in claimed {
                assert_eq!(run.attempt, 1);
                assert!(
                    s.renew_lease(run.run_id, "nobody", LEASE)
                        .await
                        .unwrap()
                        .is_none(),
                    "only the owner renews"
                );
                s.finish_run(
                    run.thread_id,
                    run.run_id,
                    &worker,
                    end(RunStatus::Success, ThreadStatus::Idle),
                )
                .await
                .unwrap();
            }
        }
        for thread in &threads {
            assert_eq!(
                thread_status(&*s, &alice, *thread).await,
                ThreadStatus::Idle
            );
        }
        assert!(claim(&*s, "w").await.is_none());
    })
    .await;
}

#[tokio::test]
async fn a_run_is_not_claimed_before_its_time() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let later_thread = thread_of(s, &alice).await;
        let later = s
            .create_run(
                &alice,
                NewRun {
                    run_after: Utc::now() + chrono::Duration::hours(1),
                    ..new_run(later_thread, MultitaskStrategy::Enqueue)
                },
            )
            .await
            .unwrap()
            .run;
        assert!(claim(s, "w").await.is_none(), "not due yet");
        let now_thread = thread_of(s, &alice).await;
        let now = run_on(s, &alice, now_thread, MultitaskStrategy::Enqueue).await;
        assert_eq!(claim(s, "w").await.unwrap().run.run_id, now.run_id);
        assert!(claim(s, "w").await.is_none());
        assert_eq!(
            run_status(s, &alice, later_thread, later.run_id).await,
            RunStatus::Pending
        );

        let soon_thread = thread_of(s, &alice).await;
        let soon = s
            .create_run(
                &alice,
                NewRun {
                    run_after: Utc::now() + chrono::Duration::milliseconds(50),
                    ..new_run(soon_thread, MultitaskStrategy::Enqueue)
                },
            )
            .await
            .unwrap()
            .run;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(claim(s, "w").await.unwrap().run.run_id, soon.run_id);
    })
    .await;
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_until_attempts_run_out() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let first = s.claim_run("w1", LEASE, 2).await.unwrap().unwrap();
        assert_eq!(first.run.attempt, 1);
        s.append_events(&[event(thread, run.run_id, 1), event(thread, run.run_id, 2)])
            .await
            .unwrap();
        assert!(
            s.claim_run("w2", LEASE, 2).await.unwrap().is_none(),
            "the lease still holds"
        );

        // The worker dies: its lease runs out (a zero renewal ends it now, with no timing
        // to depend on).
        expire(s, run.run_id, "w1").await;
        let second = s.claim_run("w2", LEASE, 2).await.unwrap().unwrap();
        assert_eq!(second.run.run_id, run.run_id);
        assert_eq!(second.run.attempt, 2);
        assert_eq!(second.run.status, RunStatus::Running);
        assert_eq!(
            second.last_seq,
            2 + UNLOGGED_EVENTS_MAX,
            "the new worker numbers past the log and past what the lost one may have streamed \
             without logging, so no seq a client saw is given to another event"
        );
        assert_eq!(s.renew_lease(run.run_id, "w1", LEASE).await.unwrap(), None);
        assert_not_found(
            s.finish_run(
                run.thread_id,
                run.run_id,
                "w1",
                end(RunStatus::Success, ThreadStatus::Idle),
            )
            .await,
            "the old worker lost the run",
        );

        expire(s, run.run_id, "w2").await;
        assert!(s.claim_run("w3", LEASE, 2).await.unwrap().is_none());
        assert_eq!(
            run_status(s, &alice, thread, run.run_id).await,
            RunStatus::Error
        );
        let t = s.get_thread(&alice, thread).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Error, "the thread is not left busy");
        assert_eq!(t.error.as_ref().unwrap()["error"], json!("WorkerLost"));
        let logged = s.read_events(thread, 2, None, 10).await.unwrap();
        let past = 2 + 2 * UNLOGGED_EVENTS_MAX;
        assert_eq!(
            seqs(&logged),
            vec![past + 1, past + 2],
            "the end of a run given up on also comes after what its last worker streamed"
        );
        // Its streams learn why it ended, before its end, as from a run whose graph failed.
        let names: Vec<&str> = logged.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(names, ["error", RUN_END_EVENT]);
        assert_eq!(logged[0].run_id, run.run_id);
        assert_eq!(logged[0].data["error"], json!("WorkerLost"));
        assert_eq!(logged[0].data, t.error.clone().unwrap());
    })
    .await;
}

#[tokio::test]
async fn a_claimable_run_is_seen_without_claiming_it() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        assert!(!s.has_claimable_run().await.unwrap(), "no runs");
        assert_eq!(s.queue_outlook().await.unwrap(), QueueOutlook::default());
        let thread = thread_of(s, &alice).await;
        let first = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert!(s.has_claimable_run().await.unwrap(), "a due pending run");
        assert!(
            s.has_claimable_run().await.unwrap(),
            "looking claims nothing"
        );
        assert_eq!(claim(s, "w1").await.unwrap().run.run_id, first.run_id);
        assert!(
            !s.has_claimable_run().await.unwrap(),
            "the second run waits for its thread's running run"
        );
        let outlook = s.queue_outlook().await.unwrap();
        assert!(
            outlook.pending,
            "a run is pending, behind its thread's running run"
        );
        assert!(outlook.due.is_some(), "the running run's lease");
        let mut later = new_run(thread_of(s, &alice).await, MultitaskStrategy::Enqueue);
        later.run_after = Utc::now() + chrono::Duration::hours(1);
        s.create_run(&alice, later).await.unwrap();
        assert!(!s.has_claimable_run().await.unwrap(), "a run not yet due");
        expire(s, first.run_id, "w1").await;
        assert!(
            s.has_claimable_run().await.unwrap(),
            "a run whose worker died"
        );
        assert_eq!(claim(s, "w2").await.unwrap().run.run_id, first.run_id);
    })
    .await;
}

#[tokio::test]
async fn a_lost_run_past_its_attempts_frees_the_thread_for_the_next() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let lost = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let next = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        s.claim_run("w1", LEASE, 1).await.unwrap().unwrap();
        expire(s, lost.run_id, "w1").await;
        let claimed = s.claim_run("w2", LEASE, 1).await.unwrap().unwrap();
        assert_eq!(
            claimed.run.run_id, next.run_id,
            "the same claim takes the next run"
        );
        assert_eq!(
            run_status(s, &alice, thread, lost.run_id).await,
            RunStatus::Error
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Busy);
    })
    .await;
}

#[tokio::test]
async fn a_lost_run_that_was_cancelled_ends_as_asked() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w1").await.unwrap();
        s.cancel_runs(&alice, thread, &[run.run_id], CancelAction::Interrupt)
            .await
            .unwrap();
        expire(s, run.run_id, "w1").await;
        assert!(claim(s, "w2").await.is_none(), "not resumed");
        assert_eq!(
            run_status(s, &alice, thread, run.run_id).await,
            RunStatus::Interrupted
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Idle);

        // Rolled back, it is deleted.
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w1").await.unwrap();
        s.cancel_runs(&alice, thread, &[run.run_id], CancelAction::Rollback)
            .await
            .unwrap();
        expire(s, run.run_id, "w1").await;
        assert!(claim(s, "w2").await.is_none(), "not resumed");
        assert_not_found(s.get_run(&alice, thread, run.run_id).await, "rolled back");
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Idle);
    })
    .await;
}

#[tokio::test]
async fn finishing_sets_the_threads_status_values_and_error() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let first = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let second = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w").await.unwrap();

        match s
            .finish_run(
                first.thread_id,
                first.run_id,
                "w",
                end(RunStatus::Running, ThreadStatus::Idle),
            )
            .await
        {
            Err(StorageError::Invalid(_)) => {}
            other => panic!("ending as running: {other:?}"),
        }
        assert_not_found(
            s.finish_run(
                first.thread_id,
                first.run_id,
                "other",
                end(RunStatus::Success, ThreadStatus::Idle),
            )
            .await,
            "finish by a worker that does not hold the run",
        );

        let failure = json!({"error": "ValueError", "message": "boom"});
        s.finish_run(
            first.thread_id,
            first.run_id,
            "w",
            RunEnd {
                error: Some(failure.clone()),
                ..end(RunStatus::Error, ThreadStatus::Error)
            },
        )
        .await
        .unwrap();
        let t = s.get_thread(&alice, thread).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Busy, "a run is still pending");
        assert_eq!(t.error, None);
        assert_eq!(t.values, Some(json!({"done": "error"})));
        assert_eq!(
            run_status(s, &alice, thread, first.run_id).await,
            RunStatus::Error
        );

        claim(s, "w").await.unwrap();
        let interrupts = obj(json!({"task-1": [{"id": "i1", "value": "approve?"}]}));
        s.finish_run(
            second.thread_id,
            second.run_id,
            "w",
            RunEnd {
                thread_interrupts: interrupts.clone(),
                ..end(RunStatus::Success, ThreadStatus::Interrupted)
            },
        )
        .await
        .unwrap();
        let t = s.get_thread(&alice, thread).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Interrupted);
        assert_eq!(t.interrupts, interrupts);
        assert!(t.state_updated_at >= t.created_at);
        assert_eq!(t.updated_at, t.state_updated_at);

        let third = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w").await.unwrap();
        s.finish_run(
            third.thread_id,
            third.run_id,
            "w",
            RunEnd {
                error: Some(failure.clone()),
                ..end(RunStatus::Error, ThreadStatus::Error)
            },
        )
        .await
        .unwrap();
        let t = s.get_thread(&alice, thread).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Error);
        assert_eq!(t.error, Some(failure));
        assert!(t.interrupts.is_empty());

        let fourth = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w").await.unwrap();
        s.finish_run(
            fourth.thread_id,
            fourth.run_id,
            "w",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        let t = s.get_thread(&alice, thread).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Idle);
        assert_eq!(t.error, None);
        assert_not_found(
            s.finish_run(
                fourth.thread_id,
                fourth.run_id,
                "w",
                end(RunStatus::Success, ThreadStatus::Idle),
            )
            .await,
            "finish twice",
        );
    })
    .await;
}

#[tokio::test]
async fn a_run_records_when_it_started_and_ended() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert_eq!((run.started_at, run.ended_at), (None, None));

        let first = claim(s, "w1").await.unwrap().run;
        let started = first.started_at.expect("a claimed run has started");
        assert!(started >= run.created_at);
        assert_eq!(first.ended_at, None);

        // A run resumed after its worker died keeps its first start.
        expire(s, run.run_id, "w1").await;
        let second = claim(s, "w2").await.unwrap().run;
        assert_eq!(second.attempt, 2);
        assert_eq!(second.started_at, Some(started));

        let failure = json!({"error": "ValueError", "message": "boom"});
        let ended = s
            .finish_run(
                run.thread_id,
                run.run_id,
                "w2",
                RunEnd {
                    error: Some(failure.clone()),
                    ..end(RunStatus::Error, ThreadStatus::Error)
                },
            )
            .await
            .unwrap()
            .expect("the run as it ended");
        assert_eq!(ended.status, RunStatus::Error);
        assert_eq!(ended.error, Some(failure));
        assert_eq!(ended.started_at, Some(started));
        let ended_at = ended.ended_at.expect("an ended run has ended_at");
        assert!(ended_at >= started);
        assert_eq!(ended.updated_at, ended_at);
        let stored = s.get_run(&alice, thread, run.run_id).await.unwrap();
        assert_eq!(
            (stored.started_at, stored.ended_at),
            (ended.started_at, ended.ended_at)
        );

        // A pending run cancelled before it ran ended without starting.
        let blocker = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w1").await.unwrap();
        let pending = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        s.cancel_runs(&alice, thread, &[pending.run_id], CancelAction::Interrupt)
            .await
            .unwrap();
        let cancelled = s.get_run(&alice, thread, pending.run_id).await.unwrap();
        assert_eq!(cancelled.started_at, None);
        assert!(cancelled.ended_at.is_some());

        // A rolled-back run is gone: there is nothing to return.
        s.cancel_runs(&alice, thread, &[blocker.run_id], CancelAction::Rollback)
            .await
            .unwrap();
        let rolled_back = s
            .finish_run(
                blocker.thread_id,
                blocker.run_id,
                "w1",
                end(RunStatus::Interrupted, ThreadStatus::Idle),
            )
            .await
            .unwrap();
        assert!(rolled_back.is_none());
    })
    .await;
}

#[tokio::test]
async fn cancel_ends_pending_runs_and_flags_running_ones() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();

        // A pending run ends at once, and its thread is idle again.
        let thread = thread_of(s, &alice).await;
        let pending = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let stopped = s
            .cancel_runs(&alice, thread, &[pending.run_id], CancelAction::Interrupt)
            .await
            .unwrap();
        assert_eq!(stopped, vec![pending.run_id]);
        assert_eq!(
            run_status(s, &alice, thread, pending.run_id).await,
            RunStatus::Interrupted
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Idle);
        assert!(claim(s, "w").await.is_none());
        assert_not_found(
            s.cancel_runs(&alice, thread, &[pending.run_id], CancelAction::Interrupt)
                .await,
            "cancel of a finished run",
        );

        // Rolled back, it is gone.
        let pending = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        s.cancel_runs(&alice, thread, &[pending.run_id], CancelAction::Rollback)
            .await
            .unwrap();
        assert_not_found(
            s.get_run(&alice, thread, pending.run_id).await,
            "rolled back",
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Idle);

        // A running one is flagged; the thread stays busy until its worker ends it.
        let running = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w").await.unwrap();
        let other_thread = thread_of(s, &alice).await;
        assert_not_found(
            s.cancel_runs(
                &alice,
                other_thread,
                &[running.run_id],
                CancelAction::Interrupt,
            )
            .await,
            "a run of another thread",
        );
        assert_not_found(
            s.cancel_runs(&alice, thread, &[Uuid::new_v4()], CancelAction::Interrupt)
                .await,
            "a missing run",
        );
        let stopped = s
            .cancel_runs(
                &alice,
                thread,
                &[running.run_id, Uuid::new_v4()],
                CancelAction::Interrupt,
            )
            .await
            .unwrap();
        assert_eq!(stopped, vec![running.run_id]);
        let flagged = s.get_run(&alice, thread, running.run_id).await.unwrap();
        assert_eq!(flagged.status, RunStatus::Running);
        assert_eq!(flagged.cancel, Some(CancelAction::Interrupt));
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Busy);
        // A later rollback request wins over the interrupt.
        s.cancel_runs(&alice, thread, &[running.run_id], CancelAction::Rollback)
            .await
            .unwrap();
        s.cancel_runs(&alice, thread, &[running.run_id], CancelAction::Interrupt)
            .await
            .unwrap();
        assert_eq!(
            s.get_run(&alice, thread, running.run_id)
                .await
                .unwrap()
                .cancel,
            Some(CancelAction::Rollback)
        );
        s.finish_run(
            running.thread_id,
            running.run_id,
            "w",
            end(RunStatus::Interrupted, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        assert_not_found(
            s.get_run(&alice, thread, running.run_id).await,
            "rolled back",
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Idle);
    })
    .await;
}

#[tokio::test]
async fn delete_refuses_an_active_run_and_takes_its_events() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert_conflict(s.delete_run(&alice, thread, run.run_id).await, "pending");
        claim(s, "w").await.unwrap();
        assert_conflict(s.delete_run(&alice, thread, run.run_id).await, "running");
        s.append_events(&[event(thread, run.run_id, 1)])
            .await
            .unwrap();
        s.finish_run(
            run.thread_id,
            run.run_id,
            "w",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        let kept = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        // The first run's end event took seq 2.
        let next = claim(s, "w").await.unwrap().last_seq + 1;
        assert_eq!(next, 3);
        s.append_events(&[event(thread, kept.run_id, next)])
            .await
            .unwrap();

        s.delete_run(&alice, thread, run.run_id).await.unwrap();
        assert_not_found(s.get_run(&alice, thread, run.run_id).await, "deleted");
        assert_not_found(s.delete_run(&alice, thread, run.run_id).await, "twice");
        assert_not_found(
            s.delete_run(&alice, thread, Uuid::new_v4()).await,
            "a missing run",
        );
        assert_eq!(
            seqs(&s.read_events(thread, 0, None, 100).await.unwrap()),
            vec![3],
            "only the deleted run's events went"
        );
        assert_eq!(thread_status(s, &alice, thread).await, ThreadStatus::Busy);
    })
    .await;
}

#[tokio::test]
async fn the_event_log_pages_by_seq_and_filters_by_run() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let first = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let second = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let other_thread = thread_of(s, &alice).await;
        let other = run_on(s, &alice, other_thread, MultitaskStrategy::Enqueue).await;

        assert!(s.read_events(thread, 0, None, 10).await.unwrap().is_empty());
        s.append_events(&[]).await.unwrap();
        let batch: Vec<LoggedEvent> = (1..=5)
            .map(|seq| event(thread, first.run_id, seq))
            .collect();
        s.append_events(&batch).await.unwrap();
        let mut mixed: Vec<LoggedEvent> = (6..=10)
            .map(|seq| event(thread, second.run_id, seq))
            .collect();
        mixed.push(event(other_thread, other.run_id, 1));
        s.append_events(&mixed).await.unwrap();

        let page1 = s.read_events(thread, 0, None, 3).await.unwrap();
        assert_eq!(seqs(&page1), vec![1, 2, 3]);
        assert_eq!(page1[0], batch[0].clone().with_stored_time(&page1[0]));
        assert_eq!(
            serde_json::to_string(&page1[0].data).unwrap(),
            serde_json::to_string(&batch[0].data).unwrap(),
            "data is kept as written, key order included"
        );
        assert_eq!(page1[1].event, "values");
        assert_eq!(page1[0].event, "updates|child:1");
        assert_eq!(
            seqs(&s.read_events(thread, 3, None, 100).await.unwrap()),
            vec![4, 5, 6, 7, 8, 9, 10]
        );
        assert_eq!(
            seqs(
                &s.read_events(thread, 0, Some(second.run_id), 100)
                    .await
                    .unwrap()
            ),
            vec![6, 7, 8, 9, 10]
        );
        assert_eq!(
            seqs(
                &s.read_events(thread, 7, Some(second.run_id), 2)
                    .await
                    .unwrap()
            ),
            vec![8, 9]
        );
        assert_eq!(
            seqs(
                &s.read_events(thread, 0, Some(first.run_id), 100)
                    .await
                    .unwrap()
            ),
            vec![1, 2, 3, 4, 5]
        );
        assert!(s
            .read_events(thread, 10, None, 100)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            seqs(&s.read_events(other_thread, 0, None, 100).await.unwrap()),
            vec![1]
        );

        // A batch is one transaction: a taken seq refuses the whole batch.
        let clash = vec![
            event(thread, second.run_id, 11),
            event(thread, second.run_id, 3),
        ];
        assert_conflict(s.append_events(&clash).await, "a taken seq");
        assert_eq!(s.read_events(thread, 10, None, 100).await.unwrap(), vec![]);
        assert_not_found(
            s.append_events(&[event(thread, Uuid::new_v4(), 11)]).await,
            "events of a run that does not exist",
        );

        // A large batch.
        let big: Vec<LoggedEvent> = (11..=2500)
            .map(|seq| event(thread, second.run_id, seq))
            .collect();
        s.append_events(&big).await.unwrap();
        assert_eq!(
            s.read_events(thread, 0, None, 10_000).await.unwrap().len(),
            2500
        );

        // The claim tells the worker where the thread's log ends.
        let claimed = claim(s, "w").await.unwrap();
        assert_eq!(claimed.run.thread_id, thread);
        assert_eq!(claimed.last_seq, 2500);
    })
    .await;
}

#[tokio::test]
async fn deleting_a_thread_takes_its_runs_and_events() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let running = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let pending = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w").await.unwrap();
        s.append_events(&[event(thread, running.run_id, 1)])
            .await
            .unwrap();

        s.delete_thread(&alice, thread).await.unwrap();
        assert_not_found(
            s.get_run(&alice, thread, running.run_id).await,
            "running run",
        );
        assert_not_found(
            s.get_run(&alice, thread, pending.run_id).await,
            "pending run",
        );
        assert!(s
            .read_events(thread, 0, None, 100)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            s.renew_lease(running.run_id, "w", LEASE).await.unwrap(),
            None
        );
        assert_not_found(
            s.finish_run(
                running.thread_id,
                running.run_id,
                "w",
                end(RunStatus::Success, ThreadStatus::Idle),
            )
            .await,
            "finish after the thread went",
        );
        assert_not_found(
            s.append_events(&[event(thread, running.run_id, 2)]).await,
            "events after the thread went",
        );
        assert!(claim(s, "w").await.is_none());
    })
    .await;
}

trait StoredTime {
    fn with_stored_time(self, stored: &LoggedEvent) -> Self;
}

impl StoredTime for LoggedEvent {
    /// PostgreSQL keeps microseconds; compare everything else exactly.
    fn with_stored_time(self, stored: &LoggedEvent) -> Self {
        assert!(
            (self.created_at - stored.created_at)
                .num_microseconds()
                .unwrap()
                .abs()
                < 1
        );
        LoggedEvent {
            created_at: stored.created_at,
            ..self
        }
    }
}

#[tokio::test]
async fn every_way_a_run_ends_logs_its_end_event() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let ends = |events: Vec<LoggedEvent>| -> Vec<(Uuid, serde_json::Value)> {
            events
                .into_iter()
                .filter(|e| e.event == RUN_END_EVENT)
                .map(|e| (e.run_id, e.data))
                .collect()
        };

        // The worker ends it.
        let finished = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let claimed = claim(s, "w").await.unwrap();
        s.append_events(&[event(thread, finished.run_id, claimed.last_seq + 1)])
            .await
            .unwrap();
        s.finish_run(
            finished.thread_id,
            finished.run_id,
            "w",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        // A pending run is cancelled.
        let pending = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        s.cancel_runs(&alice, thread, &[pending.run_id], CancelAction::Interrupt)
            .await
            .unwrap();

        let events = s.read_events(thread, 0, None, 100).await.unwrap();
        assert_eq!(seqs(&events), vec![1, 2, 3], "end events follow the log");
        assert_eq!(
            ends(events),
            vec![
                (
                    finished.run_id,
                    json!({"run_id": finished.run_id.to_string(), "status": "success"})
                ),
                (
                    pending.run_id,
                    json!({"run_id": pending.run_id.to_string(), "status": "interrupted"})
                ),
            ]
        );
        assert_eq!(s.last_event_seq(thread).await.unwrap(), 3);
    })
    .await;
}

#[tokio::test]
async fn a_runs_last_events_are_logged_with_its_end() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;

        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let claimed = claim(s, "w").await.unwrap();
        let first = claimed.last_seq + 1;
        s.append_events(&[event(thread, run.run_id, first)])
            .await
            .unwrap();
        let tail = vec![
            event(thread, run.run_id, first + 1),
            event(thread, run.run_id, first + 2),
        ];
        s.finish_run(
            run.thread_id,
            run.run_id,
            "w",
            RunEnd {
                events: tail.clone(),
                ..end(RunStatus::Success, ThreadStatus::Idle)
            },
        )
        .await
        .unwrap();
        let events = s.read_events(thread, 0, None, 100).await.unwrap();
        assert_eq!(
            seqs(&events),
            vec![1, 2, 3, 4],
            "the end event follows the tail"
        );
        assert_eq!(events[3].event, RUN_END_EVENT);
        assert_eq!(
            events[1].clone(),
            tail[0].clone().with_stored_time(&events[1])
        );
        assert_eq!(s.last_event_seq(thread).await.unwrap(), 4);

        // A tail that does not continue the log is refused, and the run stays running.
        let next = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w").await.unwrap();
        let refused = s
            .finish_run(
                next.thread_id,
                next.run_id,
                "w",
                RunEnd {
                    events: vec![event(thread, next.run_id, 2)],
                    ..end(RunStatus::Success, ThreadStatus::Idle)
                },
            )
            .await;
        assert!(
            matches!(refused, Err(StorageError::Conflict(_))),
            "{refused:?}"
        );
        assert_eq!(
            run_status(s, &alice, thread, next.run_id).await,
            RunStatus::Running
        );
        assert_eq!(s.last_event_seq(thread).await.unwrap(), 4);
    })
    .await;
}

#[tokio::test]
async fn retention_prunes_old_events_of_ended_runs_and_keeps_the_counter() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let ended = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w").await.unwrap();
        s.append_events(&[event(thread, ended.run_id, 1)])
            .await
            .unwrap();
        s.finish_run(
            ended.thread_id,
            ended.run_id,
            "w",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        let active = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        claim(s, "w").await.unwrap();
        s.append_events(&[event(thread, active.run_id, 3)])
            .await
            .unwrap();

        let later = Utc::now() + chrono::Duration::seconds(1);
        assert_eq!(s.prune_events(later, 1000).await.unwrap(), 2);
        let left = s.read_events(thread, 0, None, 100).await.unwrap();
        assert_eq!(seqs(&left), vec![3], "the active run's events stay");
        assert_eq!(s.last_event_seq(thread).await.unwrap(), 3);
        assert_eq!(s.prune_events(later, 1000).await.unwrap(), 0);
    })
    .await;
}

/// The claim's search for runs whose worker died reads an index of the running runs, not every
/// run: SQLite has no index of its own for it (migration 0012 dropped an unread one), so this
/// holds only while an index leads with the status.
#[tokio::test]
async fn the_search_for_dead_workers_runs_uses_an_index() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        for _ in 0..20 {
            let thread = thread_of(s, &alice).await;
            run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        }
        claim(s, "w1").await.expect("a run to claim");
        // The parameter is bound as text, which PostgreSQL compares with a timestamp only cast.
        let cutoff = match db.backend() {
            Backend::Sqlite => "$1",
            Backend::Postgres => "$1::timestamptz",
        };
        let sql = format!(
            "SELECT run_id FROM runs WHERE status = 'running' AND lease_expires_at < {cutoff} \
             ORDER BY lease_expires_at LIMIT 1"
        );
        let plan = db.query_plan(&sql, &["2100-01-01T00:00:00Z"]).await;
        match db.backend() {
            Backend::Sqlite => {
                assert!(plan.contains("SEARCH runs USING INDEX"), "{plan}");
                assert!(!plan.contains("SCAN runs"), "{plan}");
            }
            Backend::Postgres => assert!(plan.contains("Index"), "{plan}"),
        }
    })
    .await;
}

/// A run's output is the thread's values its end wrote, stored with the end (read back by
/// get, list and the run `finish_run` returns); none before it ends.
#[tokio::test]
async fn a_runs_end_stores_its_output() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert_eq!(run.output, None);
        claim(s, "w").await.unwrap();
        assert_eq!(
            s.get_run(&alice, thread, run.run_id).await.unwrap().output,
            None
        );
        let ended = s
            .finish_run(
                run.thread_id,
                run.run_id,
                "w",
                end(RunStatus::Success, ThreadStatus::Idle),
            )
            .await
            .unwrap()
            .unwrap();
        let output = Some(json!({"done": "success"}));
        assert_eq!(ended.output, output);
        assert_eq!(
            s.get_run(&alice, thread, run.run_id).await.unwrap().output,
            output
        );
        let listed = s
            .list_runs(&alice, thread, RunFilter::default(), all())
            .await
            .unwrap();
        assert_eq!(listed[0].output, output);
    })
    .await;
}

/// Pending writes of a checkpoint, as a task of a step saves them.
fn writes_of(thread: ResourceId, checkpoint: &str, task: &str, channels: &[&str]) -> LoggedSave {
    LoggedSave {
        write: spindle_graph::checkpoint::QueuedWrite::Writes {
            thread_id: thread.to_string(),
            checkpoint_ns: String::new(),
            checkpoint_id: checkpoint.to_owned(),
            writes: channels
                .iter()
                .map(|channel| spindle_graph::checkpoint::PendingWrite {
                    task_id: task.to_owned(),
                    channel: (*channel).to_owned(),
                    value: json!(format!("{task}:{channel}")),
                })
                .collect(),
        },
        events: Vec::new(),
    }
}

/// Saves queued by several runs at once are stored as if one after the other, whatever the
/// backend groups them into: each with its events, pending writes of one checkpoint numbered
/// in the order they came (two tasks of one step), a task's special write replacing its
/// earlier one, a checkpoint saved again dropping its earlier writes. A save whose run is
/// gone fails alone: the others queued with it are stored.
#[tokio::test]
async fn saves_queued_together_are_stored_as_if_one_after_the_other() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let (a, b) = (thread_of(s, &alice).await, thread_of(s, &alice).await);
        let run_a = run_on(s, &alice, a, MultitaskStrategy::Enqueue).await;
        let run_b = run_on(s, &alice, b, MultitaskStrategy::Enqueue).await;
        let seq_a = claim(s, "w").await.unwrap().last_seq;
        let seq_b = claim(s, "w").await.unwrap().last_seq;
        let (c1, c2, cb) = (
            new_checkpoint_id(),
            new_checkpoint_id(),
            new_checkpoint_id(),
        );
        let gone = Uuid::new_v4();
        // On a thread of its own: a backend may store a thread's queued saves all or none.
        let c = thread_of(s, &alice).await;
        let mut of_gone_run = checkpoint_write(c, &new_checkpoint_id());
        if let spindle_graph::checkpoint::QueuedWrite::Checkpoint { metadata, .. } =
            &mut of_gone_run
        {
            *metadata = json!({"step": 2, "run_id": gone.to_string()});
        }
        let saves = vec![
            LoggedSave {
                write: checkpoint_write(a, &c1),
                events: vec![event(a, run_a.run_id, seq_a + 1)],
            },
            writes_of(a, &c1, "t1", &["x", "__error__"]),
            writes_of(a, &c1, "t2", &["y"]),
            writes_of(a, &c1, "t1", &["__error__"]),
            LoggedSave {
                write: checkpoint_write(b, &cb),
                events: vec![event(b, run_b.run_id, seq_b + 1)],
            },
            LoggedSave {
                write: of_gone_run,
                events: Vec::new(),
            },
            LoggedSave {
                write: checkpoint_write(a, &c2),
                events: vec![
                    event(a, run_a.run_id, seq_a + 2),
                    event(a, run_a.run_id, seq_a + 3),
                ],
            },
            writes_of(a, &c2, "t3", &["z"]),
            // Saved again: its writes go (a checkpoint saved again starts with none).
            LoggedSave {
                write: checkpoint_write(a, &c2),
                events: Vec::new(),
            },
            writes_of(a, &c2, "t4", &["w"]),
        ];
        let receipts: Vec<_> = saves.into_iter().map(|save| s.queue_logged(save)).collect();
        let mut outcomes = Vec::new();
        for receipt in receipts {
            outcomes.push(receipt.await.is_ok());
        }
        let expected = [true, true, true, true, true, false, true, true, true, true];
        assert_eq!(outcomes, expected, "only the save of the deleted run fails");

        let logged = s.read_events(a, seq_a, None, 100).await.unwrap();
        assert_eq!(seqs(&logged), vec![seq_a + 1, seq_a + 2, seq_a + 3]);
        assert_eq!(s.last_event_seq(b).await.unwrap(), seq_b + 1);
        let writes = |id: String| async move {
            let tuple = s.checkpointer().get_tuple(a.as_str(), "", Some(&id)).await;
            tuple
                .unwrap()
                .expect("checkpoint stored")
                .pending_writes
                .into_iter()
                .map(|w| format!("{}:{}", w.task_id, w.channel))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            writes(c1.clone()).await,
            vec!["t1:x", "t2:y", "t1:__error__"],
            "in the order saved, the special write replaced and last"
        );
        assert_eq!(writes(c2.clone()).await, vec!["t4:w"]);
        assert!(checkpoint_stored(s, b, &cb).await);
    })
    .await;
}

/// Another process on `db`'s database, listening once it hears a first notification (what it
/// heard before is dropped); `None` where one process has the database to itself (SQLite:
/// see `a_process_alone_on_its_database_is_told_what_nothing_else_tells_it`).
async fn another_process_listening(
    db: &TestDb,
) -> Option<(
    tokio::sync::mpsc::UnboundedReceiver<Wakeup>,
    Arc<dyn Storage>,
)> {
    if db.backend() == Backend::Sqlite {
        return None;
    }
    let s = db.storage();
    let other = spindle_storage::connect(db.url()).await.unwrap();
    let mut wakeups = other.wakeups()?;
    assert!(other.wakeups().is_none(), "one listener per storage");
    // The listener may still be connecting: wait until it hears a first notification.
    let alice = fresh_user();
    let thread = thread_of(s, &alice).await;
    let probe = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
    loop {
        let probed = s
            .cancel_runs(&alice, thread, &[probe.run_id], CancelAction::Interrupt)
            .await;
        if probed.is_err() {
            break;
        }
        if tokio::time::timeout(Duration::from_millis(200), wakeups.recv())
            .await
            .is_ok()
        {
            break;
        }
    }
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), wakeups.recv()).await {
    }
    Some((wakeups, other))
}

/// A run that rolled back the running run of its thread is claimable once that run's end is
/// written, and the workers of every process are told so: on PostgreSQL the rolled-back end
/// once told nobody, and the new run waited for the old run's lease to run out.
#[tokio::test]
async fn a_rolled_back_runs_end_tells_every_process_of_the_run_behind_it() {
    for_each_backend_alone(|db| async move {
        let s = db.storage();
        let Some((mut wakeups, _other)) = another_process_listening(&db).await else {
            return;
        };
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let old = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert_eq!(next(&mut wakeups).await, Wakeup::RunsQueued);
        assert_eq!(claim(s, "w").await.unwrap().run.run_id, old.run_id);
        let new = run_on(s, &alice, thread, MultitaskStrategy::Rollback).await;
        let outlook = s.queue_outlook().await.unwrap();
        assert!(outlook.pending, "a run waits behind the running one");
        let mut told = vec![next(&mut wakeups).await, next(&mut wakeups).await];
        told.sort_by_key(|w| format!("{w:?}"));
        assert_eq!(
            told,
            [Wakeup::Cancel { run_id: old.run_id }, Wakeup::RunsQueued]
        );
        let rolled_back = s
            .finish_run(
                thread,
                old.run_id,
                "w",
                end(RunStatus::Interrupted, ThreadStatus::Idle),
            )
            .await
            .unwrap();
        assert!(rolled_back.is_none(), "the old run is deleted with its end");
        assert_eq!(
            next(&mut wakeups).await,
            Wakeup::RunsQueued,
            "the run behind it can start now"
        );
        assert_eq!(claim(s, "w").await.unwrap().run.run_id, new.run_id);
    })
    .await;
}

/// On SQLite one process has the database to itself and tells its own streams and workers
/// what they would otherwise have to poll for: a run's end that leaves another queued behind
/// it, runs ended without a worker (a pending run cancelled), a thread deleted. (What the
/// process does itself, creating a pending run or cancelling a running one, it wakes itself
/// for; a run's own events its worker hands to the streams.)
#[tokio::test]
async fn a_process_alone_on_its_database_is_told_what_nothing_else_tells_it() {
    for_each_backend(|db| async move {
        if db.backend() != Backend::Sqlite {
            return;
        }
        let s = db.storage();
        let mut wakeups = s.wakeups().expect("the process's own wake-ups");
        assert!(s.wakeups().is_none(), "one listener per storage");
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let first = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert_eq!(claim(s, "w").await.unwrap().run.run_id, first.run_id);
        let second = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        s.finish_run(
            thread,
            first.run_id,
            "w",
            end(RunStatus::Success, ThreadStatus::Idle),
        )
        .await
        .unwrap();
        assert_eq!(
            next(&mut wakeups).await,
            Wakeup::RunsQueued,
            "the run queued behind it"
        );
        let third = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        s.cancel_runs(&alice, thread, &[third.run_id], CancelAction::Interrupt)
            .await
            .unwrap();
        let seq = s.last_event_seq(thread).await.unwrap();
        let told = told_now(&mut wakeups).await;
        assert!(
            told.contains(&Wakeup::Logged {
                thread_id: thread,
                seq
            }),
            "the cancelled pending run's end: {told:?}"
        );
        assert_eq!(claim(s, "w").await.unwrap().run.run_id, second.run_id);
        s.delete_thread(&alice, thread).await.unwrap();
        let gone = Wakeup::Logged {
            thread_id: thread,
            seq: i64::MAX,
        };
        assert_eq!(told_now(&mut wakeups).await, [gone], "the thread is gone");
    })
    .await;
}

/// The wake-ups told within 300 ms of each other.
async fn told_now(wakeups: &mut tokio::sync::mpsc::UnboundedReceiver<Wakeup>) -> Vec<Wakeup> {
    let mut told = vec![next(wakeups).await];
    while let Ok(Some(wakeup)) =
        tokio::time::timeout(Duration::from_millis(300), wakeups.recv()).await
    {
        told.push(wakeup);
    }
    told
}

/// The next wake-up, within 5 s.
async fn next(wakeups: &mut tokio::sync::mpsc::UnboundedReceiver<Wakeup>) -> Wakeup {
    let wakeup = tokio::time::timeout(Duration::from_secs(5), wakeups.recv());
    wakeup.await.expect("told within 5 s").expect("listening")
}

/// Where several processes share the database, each is told what the others commit that it
/// may be waiting for: a run to claim (created pending, or its thread's run ended with
/// another queued), a thread's log growing, a running run's cancel. On a database of its own:
/// notifications reach every schema of a database, so other tests' runs would wake it too.
#[tokio::test]
async fn other_processes_are_told_of_runs_to_claim_logs_that_grew_and_cancels() {
    for_each_backend_alone(|db| async move {
        let s = db.storage();
        let Some((mut wakeups, _other)) = another_process_listening(&db).await else {
            return; // One process has the database to itself: nothing to tell.
        };
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let first = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert_eq!(
            next(&mut wakeups).await,
            Wakeup::RunsQueued,
            "a pending run"
        );
        let claimed = claim(s, "w").await.unwrap();
        assert_eq!(claimed.run.run_id, first.run_id);
        s.append_events(&[event(thread, first.run_id, claimed.last_seq + 1)])
            .await
            .unwrap();
        assert_eq!(
            next(&mut wakeups).await,
            Wakeup::Logged {
                thread_id: thread,
                seq: claimed.last_seq + 1
            }
        );
        let second = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        assert_eq!(next(&mut wakeups).await, Wakeup::RunsQueued);
        s.cancel_runs(&alice, thread, &[first.run_id], CancelAction::Interrupt)
            .await
            .unwrap();
        assert_eq!(
            next(&mut wakeups).await,
            Wakeup::Cancel {
                run_id: first.run_id
            }
        );
        let ended = end(RunStatus::Interrupted, ThreadStatus::Interrupted);
        s.finish_run(first.thread_id, first.run_id, "w", ended)
            .await
            .unwrap();
        let mut told = vec![next(&mut wakeups).await, next(&mut wakeups).await];
        told.sort_by_key(|w| format!("{w:?}"));
        assert!(
            told.contains(&Wakeup::RunsQueued),
            "the run queued behind the one that ended: {told:?}"
        );
        assert!(
            told.iter()
                .any(|w| matches!(w, Wakeup::Logged { thread_id, .. } if *thread_id == thread)),
            "the end's event: {told:?}"
        );
        let resumed = claim(s, "w").await.unwrap();
        assert_eq!(resumed.run.run_id, second.run_id);

        // Writes queued together are committed in one group, whose lines name each thread's
        // last seq: after a thread's events, after another's end.
        let other = thread_of(s, &alice).await;
        let third = run_on(s, &alice, other, MultitaskStrategy::Enqueue).await;
        assert_eq!(next(&mut wakeups).await, Wakeup::RunsQueued);
        let started = claim(s, "w").await.unwrap();
        assert_eq!(started.run.run_id, third.run_id);
        let events = [
            event(other, third.run_id, started.last_seq + 1),
            event(other, third.run_id, started.last_seq + 2),
        ];
        let (logged, ended) = tokio::join!(
            s.append_events(&events),
            s.finish_run(
                thread,
                second.run_id,
                "w",
                end(RunStatus::Success, ThreadStatus::Idle)
            ),
        );
        logged.unwrap();
        ended.unwrap();
        let mut told = vec![next(&mut wakeups).await, next(&mut wakeups).await];
        told.sort_by_key(|w| format!("{w:?}"));
        let mut expected = vec![
            Wakeup::Logged {
                thread_id: other,
                seq: started.last_seq + 2,
            },
            Wakeup::Logged {
                thread_id: thread,
                seq: resumed.last_seq + 1,
            },
        ];
        expected.sort_by_key(|w| format!("{w:?}"));
        assert_eq!(told, expected);

        // A thread its TTL deletes ends its streams everywhere, as a deleted one does.
        let default = ThreadTtl {
            strategy: TtlStrategy::Delete,
            minutes: 1.0,
        };
        let later = Utc::now() + chrono::Duration::days(1);
        let swept = s
            .sweep_expired_threads(later, Some(default), 1000)
            .await
            .unwrap();
        assert_eq!(
            swept.deleted, 2,
            "the idle threads (the probe's and this one); the other's run is running"
        );
        let told = [next(&mut wakeups).await, next(&mut wakeups).await];
        assert!(
            told.iter()
                .all(|w| matches!(w, Wakeup::Logged { seq, .. } if *seq == i64::MAX)),
            "{told:?}"
        );
        assert!(
            told.contains(&Wakeup::Logged {
                thread_id: thread,
                seq: i64::MAX
            }),
            "{told:?}"
        );
    })
    .await;
}

/// Events queued for a run's log between two of its saves are logged in that order, whatever
/// the backend batches: a save queued after them never commits before them (its events would
/// take their seqs' place and they would be refused).
#[tokio::test]
async fn events_queued_between_saves_keep_their_place() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let seq = claim(s, "w").await.unwrap().last_seq;
        let first = s.queue_logged(LoggedSave {
            write: checkpoint_write(thread, &new_checkpoint_id()),
            events: vec![event(thread, run.run_id, seq + 1)],
        });
        let between = s.queue_events(vec![event(thread, run.run_id, seq + 2)]);
        let second = s.queue_logged(LoggedSave {
            write: checkpoint_write(thread, &new_checkpoint_id()),
            events: vec![event(thread, run.run_id, seq + 3)],
        });
        first.await.unwrap();
        between.await.unwrap();
        second.await.unwrap();
        let logged = s.read_events(thread, seq, None, 10).await.unwrap();
        assert_eq!(seqs(&logged), vec![seq + 1, seq + 2, seq + 3]);
    })
    .await;
}

/// A write whose connection was cut (PostgreSQL restarted, the network failed) fails, and the
/// writes after it are stored: the writer connects again rather than failing every write from
/// then on.
#[tokio::test]
async fn writes_are_stored_again_once_the_database_connections_were_cut() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let thread = thread_of(s, &alice).await;
        let run = run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await;
        let seq = claim(s, "w").await.unwrap().last_seq;
        s.queue_events(vec![event(thread, run.run_id, seq + 1)])
            .await
            .expect("a write before the cut");
        db.cut_connections().await;
        let mut next = seq + 2;
        // The first write after the cut may go to the cut connection and fail.
        if s.queue_events(vec![event(thread, run.run_id, next)])
            .await
            .is_ok()
        {
            next += 1;
        }
        s.queue_events(vec![event(thread, run.run_id, next)])
            .await
            .expect("a write after the cut");
        let logged = s.read_events(thread, seq, None, 10).await.unwrap();
        assert_eq!(seqs(&logged).last(), Some(&next));
    })
    .await;
}

/// `attempt`'s answer, or after a failure its second answer: the first use of a connection cut
/// under it may fail, not the next.
async fn twice_if_failed<T, F>(attempt: impl Fn() -> F) -> StorageResult<T>
where
    F: std::future::Future<Output = StorageResult<T>>,
{
    match attempt().await {
        Ok(answer) => Ok(answer),
        Err(_) => attempt().await,
    }
}

/// Threads and runs are created again once the connections were cut (PostgreSQL restarted):
/// the first creation after the cut may find its connection dead and fail, not the next.
#[tokio::test]
async fn threads_and_runs_are_created_again_once_the_database_connections_were_cut() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        // Connections used before the cut, so that the cut finds them.
        let before = thread_of(s, &alice).await;
        run_on(s, &alice, before, MultitaskStrategy::Enqueue).await;
        db.cut_connections().await;
        let thread = twice_if_failed(|| s.create_thread(&alice, new_thread(json!({}))))
            .await
            .expect("a thread created after the cut")
            .thread_id;
        let run =
            twice_if_failed(|| s.create_run(&alice, new_run(thread, MultitaskStrategy::Reject)))
                .await
                .expect("a run created after the cut")
                .run;
        assert_eq!(
            run_status(s, &alice, thread, run.run_id).await,
            RunStatus::Pending
        );
    })
    .await;
}

/// A thread's active runs, looked up at every run's creation and end, are found through an
/// index of the active runs alone: ended runs (and, on PostgreSQL, the entries their ends
/// left behind until vacuum) are never read.
#[tokio::test]
async fn a_threads_active_runs_are_found_without_reading_ended_ones() {
    for_each_backend(|db| async move {
        let sql = "SELECT run_id, status FROM runs WHERE thread_id = $1 \
                   AND status IN ('pending', 'running') ORDER BY created_at";
        let plan = db.query_plan(sql, &["t"]).await;
        match db.backend() {
            Backend::Sqlite => assert!(plan.contains("SEARCH runs USING INDEX"), "{plan}"),
            Backend::Postgres => assert!(plan.contains("runs_active_by_thread"), "{plan}"),
        }
    })
    .await;
}

/// Ends queued together (applied by one PostgreSQL writer group, its plain ends in one
/// statement) end each run as if ended alone: a thread with a run queued behind stays busy and
/// its next run becomes claimable, a failed run puts its thread in error, an interrupted one
/// keeps its interrupts, a run cancelled with `rollback` leaves nothing behind, an end its
/// worker no longer holds fails without failing the others, and every end logs its end event
/// last.
#[tokio::test]
async fn ends_queued_together_end_each_run_as_if_alone() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = fresh_user();
        let queued = thread_of(s, &alice).await;
        let (failed, interrupted, rolled_back, lost) = (
            thread_of(s, &alice).await,
            thread_of(s, &alice).await,
            thread_of(s, &alice).await,
            thread_of(s, &alice).await,
        );
        let first = run_on(s, &alice, queued, MultitaskStrategy::Enqueue).await;
        let behind = run_on(s, &alice, queued, MultitaskStrategy::Enqueue).await;
        let mut runs = vec![first.clone()];
        for thread in [failed, interrupted, rolled_back, lost] {
            runs.push(run_on(s, &alice, thread, MultitaskStrategy::Enqueue).await);
        }
        for _ in &runs {
            claim(s, "w").await.expect("a run to claim");
        }
        s.cancel_runs(
            &alice,
            rolled_back,
            &[runs[3].run_id],
            CancelAction::Rollback,
        )
        .await
        .unwrap();

        let failure = json!({"error": "ValueError", "message": "boom"});
        let interrupts = obj(json!({"task-1": [{"id": "i1", "value": "approve?"}]}));
        let ends = [
            ("w", end(RunStatus::Success, ThreadStatus::Idle)),
            (
                "w",
                RunEnd {
                    error: Some(failure.clone()),
                    ..end(RunStatus::Error, ThreadStatus::Error)
                },
            ),
            (
                "w",
                RunEnd {
                    thread_interrupts: interrupts.clone(),
                    ..end(RunStatus::Interrupted, ThreadStatus::Interrupted)
                },
            ),
            ("w", end(RunStatus::Interrupted, ThreadStatus::Idle)),
            ("someone else", end(RunStatus::Success, ThreadStatus::Idle)),
        ];
        // The plain ends together, then the others.
        let mut ends = runs
            .iter()
            .zip(ends)
            .map(|(run, (worker, end))| s.finish_run(run.thread_id, run.run_id, worker, end));
        let plain = futures::future::join_all(ends.by_ref().take(3)).await;
        let others = futures::future::join_all(ends).await;
        let [done, failed_run, interrupted_run]: [_; 3] = plain.try_into().unwrap();
        let [rolled_back_run, lost_run]: [_; 2] = others.try_into().unwrap();
        assert_eq!(done.unwrap().unwrap().status, RunStatus::Success);
        assert_eq!(failed_run.unwrap().unwrap().error, Some(failure.clone()));
        assert_eq!(
            interrupted_run.unwrap().unwrap().status,
            RunStatus::Interrupted
        );
        assert!(rolled_back_run.unwrap().is_none(), "a rolled-back run");
        assert_not_found(lost_run, "an end by a worker that does not hold the run");

        let t = s.get_thread(&alice, queued).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Busy, "a run is queued behind");
        assert_eq!(t.values, Some(json!({"done": "success"})));
        let next = claim(s, "w").await.expect("the queued run can start now");
        assert_eq!(next.run.run_id, behind.run_id);

        let t = s.get_thread(&alice, failed).await.unwrap();
        assert_eq!((t.status, t.error), (ThreadStatus::Error, Some(failure)));
        let t = s.get_thread(&alice, interrupted).await.unwrap();
        assert_eq!(t.status, ThreadStatus::Interrupted);
        assert_eq!(t.interrupts, interrupts);
        assert_eq!(
            thread_status(s, &alice, rolled_back).await,
            ThreadStatus::Idle
        );
        assert_not_found(
            s.get_run(&alice, rolled_back, runs[3].run_id).await,
            "a rolled-back run",
        );
        assert_eq!(
            run_status(s, &alice, lost, runs[4].run_id).await,
            RunStatus::Running
        );
        for (thread, run) in [
            (queued, &runs[0]),
            (failed, &runs[1]),
            (interrupted, &runs[2]),
        ] {
            let logged = s
                .read_events(thread, 0, Some(run.run_id), 100)
                .await
                .unwrap();
            let last = logged.last().expect("the run's events");
            assert_eq!(last.event, RUN_END_EVENT, "{thread}");
        }
    })
    .await;
}

/// Runs created at once on one idle thread (each in one statement on PostgreSQL, as long as
/// the thread stays idle) behave as if created one after the other: with `reject`, one is
/// created and the others refused; with `enqueue`, all are created and one starts.
#[tokio::test]
async fn runs_created_at_once_on_an_idle_thread_start_one() {
    for_each_backend(|db| async move {
        let alice = fresh_user();
        for strategy in [MultitaskStrategy::Reject, MultitaskStrategy::Enqueue] {
            let thread = thread_of(db.storage(), &alice).await;
            let creations = (0..6).map(|i| {
                let (s, alice) = (db.storage_arc(), alice.clone());
                tokio::spawn(async move {
                    let new = NewRun {
                        claim: Some(Claim {
                            worker_id: format!("w{i}"),
                            lease: LEASE,
                        }),
                        ..new_run(thread, strategy)
                    };
                    s.create_run(&alice, new).await
                })
            });
            let results: Vec<_> = futures::future::join_all(creations)
                .await
                .into_iter()
                .map(|joined| joined.unwrap())
                .collect();
            let created: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            let started = created.iter().filter(|c| c.claimed.is_some()).count();
            assert_eq!(started, 1, "{strategy:?}: {results:?}");
            match strategy {
                MultitaskStrategy::Reject => {
                    assert_eq!(created.len(), 1, "{results:?}");
                    for refused in results.iter().filter(|r| r.is_err()) {
                        assert!(
                            matches!(refused, Err(StorageError::Conflict(_))),
                            "{refused:?}"
                        );
                    }
                }
                _ => {
                    assert_eq!(created.len(), 6, "{results:?}");
                    let pending = created
                        .iter()
                        .filter(|c| c.run.status == RunStatus::Pending)
                        .count();
                    assert_eq!(pending, 5);
                }
            }
        }
    })
    .await;
}

/// A run is made from its assistant as read, which may be a copy another process has since
/// updated or deleted (`assistant_for_run`): its creation is refused then, writes nothing,
/// and the next read is the assistant as stored. Refused both on an idle thread (the
/// one-statement creation) and on a busy one (the transaction).
#[tokio::test]
async fn a_run_made_from_an_assistant_changed_since_is_refused() {
    for_each_backend_alone(|db| async move {
        let s = db.storage();
        let other = spindle_storage::connect(db.url()).await.unwrap();
        let alice = fresh_user();
        let id = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("g", "a", json!({}))),
            )
            .await
            .unwrap()
            .assistant_id;
        let run_from = |thread, assistant: &Assistant| NewRun {
            assistant_id: assistant.assistant_id,
            assistant_read: Some(AssistantRead::of(assistant)),
            ..new_run(thread, MultitaskStrategy::Enqueue)
        };
        let patch = || AssistantPatch {
            name: Some("renamed".into()),
            ..AssistantPatch::default()
        };
        let thread = thread_of(s, &alice).await;
        let assert_refused = |result: StorageResult<CreatedRun>| {
            assert!(
                matches!(result, Err(StorageError::AssistantChanged)),
                "{result:?}"
            )
        };
        let runs_stored = || async {
            let runs = s.list_runs(&alice, thread, RunFilter::default(), all());
            runs.await.unwrap().len()
        };

        // Idle thread: refused, nothing written.
        let read = s.assistant_for_run(&alice, id).await.unwrap();
        other.update_assistant(&alice, id, patch()).await.unwrap();
        assert_refused(s.create_run(&alice, run_from(thread, &read)).await);
        assert_eq!(runs_stored().await, 0, "a refused run is not stored");
        assert_eq!(
            s.get_thread(&alice, thread).await.unwrap().status,
            ThreadStatus::Idle
        );

        // Read again: the assistant as stored, from which the run is created.
        let read = s.assistant_for_run(&alice, id).await.unwrap();
        assert_eq!(read.version, 2);
        s.create_run(&alice, run_from(thread, &read)).await.unwrap();

        // Busy thread (the run above is pending): refused too, the first run alone stored.
        other.update_assistant(&alice, id, patch()).await.unwrap();
        assert_refused(s.create_run(&alice, run_from(thread, &read)).await);
        assert_eq!(runs_stored().await, 1);

        // This process's own update is seen at once.
        assert_eq!(s.assistant_for_run(&alice, id).await.unwrap().version, 3);
        s.update_assistant(&alice, id, patch()).await.unwrap();
        assert_eq!(s.assistant_for_run(&alice, id).await.unwrap().version, 4);

        // Deleted elsewhere: refused, then not found.
        let read = s.assistant_for_run(&alice, id).await.unwrap();
        other.delete_assistant(&alice, id, false).await.unwrap();
        let idle = thread_of(s, &alice).await;
        assert_refused(s.create_run(&alice, run_from(idle, &read)).await);
        assert_not_found(s.assistant_for_run(&alice, id).await, "a deleted assistant");
    })
    .await;
}
