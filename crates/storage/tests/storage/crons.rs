//! Crons: their records, and due times handed out once, also to concurrent schedulers.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use spindle_storage::test_util::for_each_backend;
use spindle_storage::*;
use uuid::Uuid;

use crate::common::*;

fn fields(next: Option<DateTime<Utc>>) -> CronFields {
    CronFields {
        schedule: "* * * * *".into(),
        timezone: None,
        payload: obj(json!({"input": {"n": 1}})),
        metadata: obj(json!({"team": "a"})),
        on_run_completed: None,
        end_time: None,
        enabled: true,
        next_run_date: next,
    }
}

async fn assistant(s: &dyn Storage) -> ResourceId {
    let new = new_assistant(crate::common::fields("echo", "a", json!({})));
    s.create_assistant(Owner::System, new)
        .await
        .unwrap()
        .assistant_id
}

/// A new cron of `assistant_id`, on `thread_id` or on a new thread per firing.
fn new_cron(
    assistant_id: ResourceId,
    thread_id: Option<ResourceId>,
    fields: CronFields,
) -> NewCron {
    NewCron {
        cron_id: Uuid::new_v4(),
        assistant_id,
        thread_id,
        fields,
    }
}

fn every_second(_: &Cron, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    Some(after + Duration::seconds(1))
}

#[tokio::test]
async fn crons_are_created_read_updated_searched_and_deleted() {
    for_each_backend(|db| async move {
        let (s, me) = (db.storage(), Scope::local());
        let assistant_id = assistant(s).await;
        let thread = s.create_thread(&me, new_thread(json!({}))).await.unwrap();
        let bound = s
            .create_cron(
                &me,
                new_cron(assistant_id, Some(thread.thread_id), fields(None)),
            )
            .await
            .unwrap();
        assert_eq!(bound.thread_id, Some(thread.thread_id));
        assert_eq!(bound.user_id.as_deref(), Some(Scope::LOCAL_USER));
        let mut free_fields = fields(None);
        free_fields.on_run_completed = Some(OnRunCompleted::Keep);
        free_fields.metadata = obj(json!({"team": "b"}));
        let free = s
            .create_cron(&me, new_cron(assistant_id, None, free_fields))
            .await
            .unwrap();
        assert_eq!(s.get_cron(&me, free.cron_id).await.unwrap(), free);

        // A thread of another user is not found.
        let other = Scope::new("other");
        let refused = s
            .create_cron(
                &other,
                new_cron(assistant_id, Some(thread.thread_id), fields(None)),
            )
            .await;
        assert!(matches!(refused, Err(StorageError::NotFound(_))));
        assert!(matches!(
            s.get_cron(&other, free.cron_id).await,
            Err(StorageError::NotFound(_))
        ));

        let mut changed = free.fields.clone();
        changed.enabled = false;
        changed.end_time = Some(Utc::now());
        let updated = s
            .update_cron(&me, free.cron_id, changed.clone())
            .await
            .unwrap();
        assert_eq!(
            updated.fields,
            CronFields {
                end_time: updated.fields.end_time,
                ..changed
            }
        );
        assert!(updated.updated_at >= free.updated_at);

        let search = |filter: CronFilter| CronSearch {
            filter,
            sort_by: CronSortBy::CreatedAt,
            sort_order: SortOrder::Asc,
            page: all(),
        };
        let ids = |crons: Vec<Cron>| crons.into_iter().map(|c| c.cron_id).collect::<Vec<_>>();
        assert_eq!(
            ids(s
                .search_crons(&me, search(CronFilter::default()))
                .await
                .unwrap()),
            [bound.cron_id, free.cron_id]
        );
        let by_thread = CronFilter {
            thread_id: Some(thread.thread_id),
            ..Default::default()
        };
        assert_eq!(
            ids(s
                .search_crons(&me, search(by_thread.clone()))
                .await
                .unwrap()),
            [bound.cron_id]
        );
        let disabled = CronFilter {
            enabled: Some(false),
            ..Default::default()
        };
        assert_eq!(
            ids(s.search_crons(&me, search(disabled)).await.unwrap()),
            [free.cron_id]
        );
        let team_b = CronFilter {
            metadata: Some(obj(json!({"team": "b"}))),
            ..Default::default()
        };
        assert_eq!(s.count_crons(&me, team_b).await.unwrap(), 1);
        // A condition (a custom-auth handler's filter) on the metadata: team b, or none.
        let team_b_or_x = CronFilter {
            condition: Some(MetadataCondition::Any(vec![
                MetadataCondition::Contains(json!({"team": "b"})),
                MetadataCondition::Contains(json!({"team": "x"})),
            ])),
            ..Default::default()
        };
        assert_eq!(s.count_crons(&me, team_b_or_x.clone()).await.unwrap(), 1);
        let nobody = CronFilter {
            condition: Some(MetadataCondition::Any(vec![])),
            ..Default::default()
        };
        assert_eq!(s.count_crons(&me, nobody).await.unwrap(), 0);
        assert_eq!(
            s.count_crons(&other, CronFilter::default()).await.unwrap(),
            0
        );

        s.delete_cron(&me, free.cron_id).await.unwrap();
        assert!(matches!(
            s.delete_cron(&me, free.cron_id).await,
            Err(StorageError::NotFound(_))
        ));
        // A thread's crons go with it.
        s.delete_thread(&me, thread.thread_id).await.unwrap();
        assert_eq!(s.count_crons(&me, CronFilter::default()).await.unwrap(), 0);
    })
    .await;
}

#[tokio::test]
async fn due_times_are_claimed_once_and_missed_ones_fire_once() {
    for_each_backend(|db| async move {
        let (s, me) = (db.storage(), Scope::local());
        let assistant_id = assistant(s).await;
        let now = Utc::now();
        let make = |next: Option<DateTime<Utc>>, enabled: bool, end: Option<DateTime<Utc>>| {
            let mut f = fields(next);
            f.enabled = enabled;
            f.end_time = end;
            new_cron(assistant_id, None, f)
        };
        // Due an hour ago (missed sixty times): fires once, next due after now.
        let missed = s
            .create_cron(&me, make(Some(now - Duration::hours(1)), true, None))
            .await
            .unwrap();
        let later = s
            .create_cron(&me, make(Some(now + Duration::hours(1)), true, None))
            .await
            .unwrap();
        let disabled = s
            .create_cron(&me, make(Some(now - Duration::seconds(5)), false, None))
            .await
            .unwrap();
        let ended = s
            .create_cron(
                &me,
                make(
                    Some(now - Duration::seconds(5)),
                    true,
                    Some(now - Duration::seconds(10)),
                ),
            )
            .await
            .unwrap();
        let fired = s.claim_due_crons(now, 100, &every_second).await.unwrap();
        assert_eq!(
            fired.iter().map(|f| f.cron.cron_id).collect::<Vec<_>>(),
            [missed.cron_id]
        );
        assert_eq!(fired[0].due, missed.fields.next_run_date.unwrap());
        let moved = s.get_cron(&me, missed.cron_id).await.unwrap();
        assert!(moved.fields.next_run_date.unwrap() > now);
        assert!(s
            .claim_due_crons(now, 100, &every_second)
            .await
            .unwrap()
            .is_empty());
        for untouched in [later, disabled, ended] {
            assert_eq!(
                s.get_cron(&me, untouched.cron_id)
                    .await
                    .unwrap()
                    .fields
                    .next_run_date,
                untouched.fields.next_run_date
            );
        }
        // The claimed firing is in flight until its run is made: next is the time another
        // scheduler would take it over; once it is released, the cron's next due time.
        // (PostgreSQL keeps microseconds.)
        let takeover = s.next_cron_due().await.unwrap().unwrap();
        let expected = now + Duration::from_std(FIRING_LEASE).unwrap();
        assert!(
            (takeover - expected).abs() < Duration::milliseconds(1),
            "{takeover}"
        );
        s.release_cron_firing(fired[0].id()).await.unwrap();
        assert_eq!(s.next_cron_due().await.unwrap(), moved.fields.next_run_date);
    })
    .await;
}

/// A cron without a thread whose first run was due a second before `now`.
async fn due_cron(s: &dyn Storage, me: &Scope, now: DateTime<Utc>) -> Cron {
    let assistant_id = assistant(s).await;
    let fields = fields(Some(now - Duration::seconds(1)));
    s.create_cron(me, new_cron(assistant_id, None, fields))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_firing_whose_scheduler_died_is_made_once_by_another() {
    for_each_backend(|db| async move {
        let (s, me) = (db.storage(), Scope::local());
        let now = Utc::now();
        let cron = due_cron(s, &me, now).await;
        // Claimed by a scheduler that dies before creating the run.
        let claimed = s.claim_due_crons(now, 10, &every_second).await.unwrap();
        assert_eq!(claimed.len(), 1);
        let firing = claimed[0].id();
        // While it is in flight, nobody else takes the cron, though its next time is due.
        let soon = now + Duration::seconds(10);
        assert!(s
            .claim_due_crons(soon, 10, &every_second)
            .await
            .unwrap()
            .is_empty());
        // Past the lease, another scheduler takes the same due time over.
        let later = now + Duration::from_std(FIRING_LEASE).unwrap() + Duration::seconds(1);
        let taken = s.claim_due_crons(later, 10, &every_second).await.unwrap();
        assert_eq!(taken.iter().map(|f| f.id()).collect::<Vec<_>>(), [firing]);

        let run_for = |thread_id: ResourceId| NewRun {
            run_id: Uuid::now_v7(),
            thread_id,
            assistant_id: cron.assistant_id,
            assistant_read: None,
            kwargs: obj(json!({"input": {}})),
            metadata: obj(json!({})),
            multitask_strategy: MultitaskStrategy::Enqueue,
            run_after: Utc::now(),
            if_thread_missing: IfThreadMissing::Create {
                metadata: obj(json!({})),
            },
            claim: None,
            cron_firing: Some(firing),
        };
        let made = s
            .create_run(&me, run_for(ResourceId::generate()))
            .await
            .unwrap();
        // The first scheduler, slow rather than dead, tries too: refused, and nothing of its
        // run is left (its thread included).
        let late_thread = ResourceId::generate();
        let refused = s.create_run(&me, run_for(late_thread)).await;
        assert!(
            matches!(refused, Err(StorageError::Conflict(_))),
            "{refused:?}"
        );
        assert!(s.get_thread(&me, late_thread).await.is_err());
        assert!(s.get_thread(&me, made.run.thread_id).await.is_ok());
        // The firing is over: what comes next is the cron's following due time.
        let next = s.claim_due_crons(later, 10, &every_second).await.unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].cron.cron_id, cron.cron_id);
        assert!(next[0].due > firing.due);
    })
    .await;
}

#[tokio::test]
async fn disabling_a_cron_drops_its_firing_in_flight() {
    for_each_backend(|db| async move {
        let (s, me) = (db.storage(), Scope::local());
        let now = Utc::now();
        let cron = due_cron(s, &me, now).await;
        let claimed = s.claim_due_crons(now, 10, &every_second).await.unwrap();
        let firing = claimed[0].id();
        // Disabled after the claim, before (or without) the run: the firing is not made,
        // neither by its scheduler nor by one that takes over after the lease.
        s.update_cron(
            &me,
            cron.cron_id,
            CronFields {
                enabled: false,
                ..cron.fields.clone()
            },
        )
        .await
        .unwrap();
        let later = now + Duration::from_std(FIRING_LEASE).unwrap() + Duration::seconds(1);
        assert!(s
            .claim_due_crons(later, 10, &every_second)
            .await
            .unwrap()
            .is_empty());
        let run = NewRun {
            run_id: Uuid::now_v7(),
            thread_id: ResourceId::generate(),
            assistant_id: cron.assistant_id,
            assistant_read: None,
            kwargs: obj(json!({"input": {}})),
            metadata: obj(json!({})),
            multitask_strategy: MultitaskStrategy::Enqueue,
            run_after: Utc::now(),
            if_thread_missing: IfThreadMissing::Create {
                metadata: obj(json!({})),
            },
            claim: None,
            cron_firing: Some(firing),
        };
        let refused = s.create_run(&me, run).await;
        assert!(
            matches!(refused, Err(StorageError::Conflict(_))),
            "{refused:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn concurrent_schedulers_never_take_the_same_due_time() {
    for_each_backend(|db| async move {
        // One process serves a SQLite file; several processes share PostgreSQL.
        if db.backend() == Backend::Sqlite {
            return;
        }
        // A second storage on the same database, as a second server process has.
        let other: Arc<dyn Storage> = connect(db.url()).await.unwrap();
        let s = db.storage_arc();
        let me = Scope::local();
        let assistant_id = assistant(s.as_ref()).await;
        let start = Utc::now() - Duration::seconds(30);
        let mut ids = Vec::new();
        for _ in 0..20 {
            let cron = s
                .create_cron(&me, new_cron(assistant_id, None, fields(Some(start))))
                .await
                .unwrap();
            ids.push(cron.cron_id);
        }
        // Ten rounds: each store claims at the same "now"; every cron is due once per round.
        let mut fired: Vec<(Uuid, DateTime<Utc>)> = Vec::new();
        for round in 0..10 {
            let now = start + Duration::seconds(round * 2 + 1);
            let (a, b) = tokio::join!(
                s.claim_due_crons(now, 7, &every_second),
                other.claim_due_crons(now, 7, &every_second)
            );
            let mut taken: Vec<CronFiring> = a.unwrap();
            taken.extend(b.unwrap());
            // Whatever is left due is taken by a later claim of the same round.
            loop {
                let rest = s.claim_due_crons(now, 100, &every_second).await.unwrap();
                if rest.is_empty() {
                    break;
                }
                taken.extend(rest);
            }
            assert_eq!(taken.len(), 20, "round {round}: every cron fires once");
            for firing in &taken {
                // As a scheduler does once the firing's run exists.
                s.release_cron_firing(firing.id()).await.unwrap();
            }
            fired.extend(taken.into_iter().map(|f| (f.cron.cron_id, f.due)));
        }
        let mut unique = fired.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            fired.len(),
            "no due time was handed out twice"
        );
    })
    .await;
}
