use serde_json::json;
use spindle_storage::test_util::{for_each_backend, TestDb};
use spindle_storage::*;

use crate::common::*;

#[tokio::test]
async fn create_makes_an_idle_thread_and_respects_if_exists() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = Scope::new("alice");
        let new = new_thread(json!({"topic": "t", "n": 1}));
        let id = new.thread_id;

        let created = s.create_thread(&alice, new.clone()).await.unwrap();
        assert_eq!(created.thread_id, id);
        assert_eq!(created.user_id.as_deref(), Some("alice"));
        assert_eq!(created.status, ThreadStatus::Idle);
        assert_eq!(created.metadata, obj(json!({"topic": "t", "n": 1})));
        assert!(created.config.is_empty());
        assert_eq!(created.values, None);
        assert!(created.interrupts.is_empty());
        assert_eq!(created.error, None);
        assert_eq!(created.created_at, created.updated_at);
        assert_eq!(created.created_at, created.state_updated_at);
        assert_eq!(s.get_thread(&alice, id).await.unwrap(), created);

        let other = NewThread {
            metadata: obj(json!({"other": true})),
            ..new.clone()
        };
        assert_conflict(
            s.create_thread(&alice, other.clone()).await,
            "create with an existing id",
        );
        let kept = s
            .create_thread(
                &alice,
                NewThread {
                    if_exists: IfExists::DoNothing,
                    ..other.clone()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            kept, created,
            "do_nothing returns the existing thread unchanged"
        );
        assert_eq!(s.get_thread(&alice, id).await.unwrap(), created);

        let bob = Scope::new("bob");
        assert_conflict(
            s.create_thread(
                &bob,
                NewThread {
                    if_exists: IfExists::DoNothing,
                    ..other
                },
            )
            .await,
            "bob's do_nothing on alice's id",
        );
        assert_not_found(s.get_thread(&bob, id).await, "bob gets alice's thread");
        assert_eq!(s.get_thread(&alice, id).await.unwrap(), created);
    })
    .await;
}

#[tokio::test]
async fn get_and_delete_of_missing_or_foreign_threads_are_not_found() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let (alice, bob) = (Scope::new("alice"), Scope::new("bob"));
        assert_not_found(
            s.get_thread(&alice, ResourceId::generate()).await,
            "get missing",
        );
        assert_not_found(
            s.delete_thread(&alice, ResourceId::generate()).await,
            "delete missing",
        );

        let thread = s
            .create_thread(&alice, new_thread(json!({})))
            .await
            .unwrap();
        let id = thread.thread_id;
        assert_not_found(s.delete_thread(&bob, id).await, "bob deletes alice's");
        assert_not_found(
            s.update_thread(&bob, id, obj(json!({"x": 1}))).await,
            "bob updates alice's",
        );
        assert_not_found(
            s.copy_thread(&bob, id, ResourceId::generate()).await,
            "bob copies alice's",
        );
        assert_eq!(s.count_threads(&bob, Default::default()).await.unwrap(), 0);
        assert_eq!(
            s.get_thread(&alice, id).await.unwrap(),
            thread,
            "alice's survived bob"
        );

        s.delete_thread(&alice, id).await.unwrap();
        assert_not_found(s.get_thread(&alice, id).await, "get after delete");
        assert_not_found(s.delete_thread(&alice, id).await, "delete twice");
        assert_not_found(
            s.update_thread(&alice, id, JsonObject::new()).await,
            "update after delete",
        );
        assert_eq!(
            s.count_threads(&alice, Default::default()).await.unwrap(),
            0
        );
    })
    .await;
}

#[tokio::test]
async fn update_merges_metadata_shallowly() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = Scope::local();
        let created = s
            .create_thread(
                &user,
                new_thread(json!({"a": 1, "keep": "k", "nested": {"x": 1, "y": 2}, "nulled": "v"})),
            )
            .await
            .unwrap();
        let id = created.thread_id;

        let updated = s
            .update_thread(
                &user,
                id,
                obj(json!({"a": 2, "nested": {"x": 9}, "nulled": null, "added": [1, 2]})),
            )
            .await
            .unwrap();
        let expected = obj(json!({
            "a": 2, "keep": "k", "nested": {"x": 9}, "nulled": null, "added": [1, 2],
        }));
        assert_eq!(
            updated.metadata, expected,
            "shallow merge: nested replaced whole, null kept"
        );
        assert_eq!(updated.created_at, created.created_at);
        assert!(updated.updated_at >= created.updated_at);
        assert_eq!(updated.status, ThreadStatus::Idle);
        assert_eq!(
            s.get_thread(&user, id).await.unwrap(),
            updated,
            "update returns what it stored"
        );

        let unchanged = s.update_thread(&user, id, JsonObject::new()).await.unwrap();
        assert_eq!(
            unchanged.metadata, expected,
            "an empty patch changes no metadata"
        );

        // The null that was kept is a value: containment finds it.
        let found = s
            .search_threads(
                &user,
                thread_search(ThreadFilter {
                    metadata: Some(obj(json!({"nulled": null, "nested": {"x": 9}}))),
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
        assert_eq!(ids_of_threads(&found.items), vec![id]);
    })
    .await;
}

/// Ids of what `filter` finds, in creation order, and checks that count agrees.
async fn find(s: &dyn Storage, user: &Scope, filter: ThreadFilter) -> Vec<ResourceId> {
    let found = s
        .search_threads(user, thread_search(filter.clone()))
        .await
        .unwrap();
    assert_eq!(found.total, found.items.len() as i64, "total of {filter:?}");
    assert_eq!(
        s.count_threads(user, filter.clone()).await.unwrap(),
        found.total,
        "count of {filter:?}"
    );
    ids_of_threads(&found.items)
}

/// Four threads of `user`: [plain idle, busy with values, interrupted with values, error
/// without values].
async fn seed(db: &TestDb, user: &Scope) -> [ResourceId; 4] {
    let s = db.storage();
    let mut ids = Vec::new();
    for metadata in [
        json!({"kind": "chat", "n": 1, "flag": true, "tags": ["a", "b"], "user": {"id": 1, "name": "ann"}}),
        json!({"kind": "chat", "n": 2, "flag": false, "tags": ["b"], "none": null}),
        json!({"kind": "task", "n": 2.5, "user": {"id": 2}}),
        json!({}),
    ] {
        ids.push(
            s.create_thread(user, new_thread(metadata))
                .await
                .unwrap()
                .thread_id,
        );
    }
    db.set_thread_state(
        ids[1],
        ThreadStatus::Busy,
        Some(json!({"messages": [{"role": "user", "content": "hi"}], "count": 1, "done": false})),
    )
    .await;
    db.set_thread_state(
        ids[2],
        ThreadStatus::Interrupted,
        Some(json!({"messages": [], "count": 2, "nested": {"k": null}})),
    )
    .await;
    db.set_thread_state(ids[3], ThreadStatus::Error, None).await;
    [ids[0], ids[1], ids[2], ids[3]]
}

#[tokio::test]
async fn search_filters_by_ids_status_metadata_and_values() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let [idle, busy, interrupted, error] = seed(&db, &user).await;
        let foreign = s
            .create_thread(&fresh_user(), new_thread(json!({"kind": "chat"})))
            .await
            .unwrap();

        let got = s.get_thread(&user, busy).await.unwrap();
        assert_eq!(got.status, ThreadStatus::Busy);
        assert_eq!(got.values.as_ref().unwrap()["count"], json!(1));

        assert_eq!(
            find(s, &user, Default::default()).await,
            vec![idle, busy, interrupted, error]
        );

        let by_ids = |ids: Vec<ResourceId>| ThreadFilter {
            ids: Some(ids),
            ..Default::default()
        };
        assert_eq!(
            find(s, &user, by_ids(vec![error, idle])).await,
            vec![idle, error]
        );
        assert_eq!(
            find(s, &user, by_ids(vec![])).await,
            Vec::<ResourceId>::new(),
            "an empty id list matches nothing"
        );
        assert_eq!(
            find(s, &user, by_ids(vec![ResourceId::generate()])).await,
            Vec::<ResourceId>::new()
        );
        assert_eq!(
            find(s, &user, by_ids(vec![foreign.thread_id, busy])).await,
            vec![busy],
            "another user's id is not found"
        );

        for (status, expected) in [
            (ThreadStatus::Idle, vec![idle]),
            (ThreadStatus::Busy, vec![busy]),
            (ThreadStatus::Interrupted, vec![interrupted]),
            (ThreadStatus::Error, vec![error]),
        ] {
            let filter = ThreadFilter {
                status: Some(status),
                ..Default::default()
            };
            assert_eq!(find(s, &user, filter).await, expected, "status {status:?}");
        }

        for (metadata, expected) in [
            (json!({}), vec![idle, busy, interrupted, error]),
            (json!({"kind": "chat"}), vec![idle, busy]),
            (json!({"kind": "chat", "n": 2}), vec![busy]),
            (json!({"n": 2.5}), vec![interrupted]),
            (json!({"n": 1.0}), vec![idle]),
            (json!({"n": "1"}), vec![]),
            (json!({"flag": true}), vec![idle]),
            (json!({"flag": false}), vec![busy]),
            (json!({"none": null}), vec![busy]),
            (json!({"kind": null}), vec![]),
            (json!({"tags": ["b"]}), vec![idle, busy]),
            (json!({"tags": ["a", "b"]}), vec![idle]),
            (json!({"tags": ["c"]}), vec![]),
            (json!({"user": {"id": 2}}), vec![interrupted]),
            (json!({"user": {"name": "ann"}}), vec![idle]),
            (json!({"user": {}}), vec![idle, interrupted]),
        ] {
            let filter = ThreadFilter {
                metadata: Some(obj(metadata.clone())),
                ..Default::default()
            };
            assert_eq!(
                find(s, &user, filter).await,
                expected,
                "metadata {metadata}"
            );
        }

        // Threads without values (NULL) are simply not matched.
        for (values, expected) in [
            (json!({}), vec![busy, interrupted]),
            (json!({"count": 1}), vec![busy]),
            (json!({"done": false}), vec![busy]),
            (json!({"messages": []}), vec![busy, interrupted]),
            (json!({"messages": [{"role": "user"}]}), vec![busy]),
            (json!({"nested": {"k": null}}), vec![interrupted]),
            (json!({"missing": 1}), vec![]),
        ] {
            let filter = ThreadFilter {
                values: Some(obj(values.clone())),
                ..Default::default()
            };
            assert_eq!(find(s, &user, filter).await, expected, "values {values}");
        }

        let combined = ThreadFilter {
            ids: Some(vec![idle, busy, interrupted]),
            status: Some(ThreadStatus::Busy),
            metadata: Some(obj(json!({"kind": "chat"}))),
            values: Some(obj(json!({"count": 1}))),
            condition: None,
        };
        assert_eq!(find(s, &user, combined).await, vec![busy]);

        // A condition (a custom-auth handler's filter) applies besides the client's metadata.
        let any_of = |wanted: [serde_json::Value; 2]| {
            MetadataCondition::Any(
                wanted
                    .into_iter()
                    .map(MetadataCondition::Contains)
                    .collect(),
            )
        };
        for (condition, metadata, expected) in [
            (
                any_of([json!({"n": 2}), json!({"flag": true})]),
                None,
                vec![idle, busy],
            ),
            (
                any_of([json!({"n": 2}), json!({"flag": true})]),
                Some(json!({"flag": true})),
                vec![idle],
            ),
            (
                MetadataCondition::All(vec![
                    any_of([json!({"n": 2}), json!({"flag": true})]),
                    MetadataCondition::Contains(json!({"tags": ["a"]})),
                ]),
                None,
                vec![idle],
            ),
            (MetadataCondition::Any(vec![]), None, vec![]),
        ] {
            let filter = ThreadFilter {
                metadata: metadata.map(obj),
                condition: Some(condition.clone()),
                ..Default::default()
            };
            assert_eq!(
                find(s, &user, filter.clone()).await,
                expected,
                "{condition:?}"
            );
            let count = s.count_threads(&user, filter).await.unwrap();
            assert_eq!(count, expected.len() as i64, "{condition:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn search_sorts_and_pages() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let mut ids = seed(&db, &user).await.to_vec();
        for _ in 0..2 {
            ids.push(
                s.create_thread(&user, new_thread(json!({})))
                    .await
                    .unwrap()
                    .thread_id,
            );
        }
        // updated_at and state_updated_at in an order of their own.
        s.update_thread(&user, ids[0], obj(json!({"touched": 1})))
            .await
            .unwrap();
        db.set_thread_state(ids[4], ThreadStatus::Idle, None).await;
        s.update_thread(&user, ids[2], obj(json!({"touched": 2})))
            .await
            .unwrap();
        let current = s
            .search_threads(&user, thread_search(Default::default()))
            .await
            .unwrap()
            .items;
        assert_eq!(ids_of_threads(&current), ids);

        for sort_by in [
            ThreadSortBy::ThreadId,
            ThreadSortBy::Status,
            ThreadSortBy::CreatedAt,
            ThreadSortBy::UpdatedAt,
            ThreadSortBy::StateUpdatedAt,
        ] {
            let mut expected = current.clone();
            expected.sort_by(|a, b| {
                match sort_by {
                    ThreadSortBy::ThreadId => std::cmp::Ordering::Equal,
                    ThreadSortBy::Status => a.status.as_str().cmp(b.status.as_str()),
                    ThreadSortBy::CreatedAt => a.created_at.cmp(&b.created_at),
                    ThreadSortBy::UpdatedAt => a.updated_at.cmp(&b.updated_at),
                    ThreadSortBy::StateUpdatedAt => a.state_updated_at.cmp(&b.state_updated_at),
                }
                .then(a.thread_id.cmp(&b.thread_id))
            });
            let ascending = ids_of_threads(&expected);
            let descending: Vec<ResourceId> = ascending.iter().rev().copied().collect();
            for (sort_order, expected) in
                [(SortOrder::Asc, &ascending), (SortOrder::Desc, &descending)]
            {
                let search = |limit, offset| ThreadSearch {
                    filter: Default::default(),
                    sort_by,
                    sort_order,
                    page: page(limit, offset),
                };
                let full = s.search_threads(&user, search(100, 0)).await.unwrap();
                assert_eq!(
                    &ids_of_threads(&full.items),
                    expected,
                    "{sort_by:?} {sort_order:?}"
                );
                assert_eq!(full.total, 6);
                for offset in [0, 2, 4] {
                    let part = s.search_threads(&user, search(2, offset)).await.unwrap();
                    let offset = offset as usize;
                    assert_eq!(
                        ids_of_threads(&part.items),
                        expected[offset..offset + 2],
                        "{sort_by:?} {sort_order:?} offset {offset}"
                    );
                    assert_eq!(part.total, 6, "total counts every match, not the page");
                }
                let beyond = s.search_threads(&user, search(5, 6)).await.unwrap();
                assert!(beyond.items.is_empty());
                assert_eq!(beyond.total, 6);
            }
        }

        let filtered = s
            .search_threads(
                &user,
                ThreadSearch {
                    filter: ThreadFilter {
                        metadata: Some(obj(json!({"kind": "chat"}))),
                        ..Default::default()
                    },
                    sort_by: ThreadSortBy::CreatedAt,
                    sort_order: SortOrder::Desc,
                    page: page(1, 1),
                },
            )
            .await
            .unwrap();
        assert_eq!(
            (ids_of_threads(&filtered.items), filtered.total),
            (vec![ids[0]], 2)
        );
    })
    .await;
}

#[tokio::test]
async fn copy_makes_a_new_idle_thread_with_the_same_metadata() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = Scope::local();
        let source = s
            .create_thread(
                &user,
                new_thread(json!({"topic": "t", "nested": {"a": [1]}})),
            )
            .await
            .unwrap();
        db.set_thread_state(
            source.thread_id,
            ThreadStatus::Busy,
            Some(json!({"count": 3})),
        )
        .await;
        let source = s.get_thread(&user, source.thread_id).await.unwrap();

        let new_id = ResourceId::generate();
        let copy = s
            .copy_thread(&user, source.thread_id, new_id)
            .await
            .unwrap();
        assert_eq!(copy.thread_id, new_id);
        assert_ne!(copy.thread_id, source.thread_id);
        assert_eq!(copy.user_id, source.user_id);
        assert_eq!(copy.metadata, source.metadata);
        assert_eq!(copy.status, ThreadStatus::Idle);
        assert!(copy.interrupts.is_empty());
        assert_eq!(copy.error, None);
        assert!(copy.created_at >= source.created_at);
        assert_eq!(s.get_thread(&user, new_id).await.unwrap(), copy);
        assert_eq!(
            s.get_thread(&user, source.thread_id).await.unwrap(),
            source,
            "the source is untouched"
        );
        assert_eq!(s.count_threads(&user, Default::default()).await.unwrap(), 2);

        // The copy is its own thread.
        s.update_thread(&user, new_id, obj(json!({"topic": "changed"})))
            .await
            .unwrap();
        assert_eq!(
            s.get_thread(&user, source.thread_id)
                .await
                .unwrap()
                .metadata,
            source.metadata
        );
        s.delete_thread(&user, source.thread_id).await.unwrap();
        assert_eq!(
            s.get_thread(&user, new_id).await.unwrap().metadata["topic"],
            json!("changed")
        );

        assert_conflict(
            s.copy_thread(&user, new_id, new_id).await,
            "copy onto an id that is taken",
        );
        assert_not_found(
            s.copy_thread(&user, ResourceId::generate(), ResourceId::generate())
                .await,
            "copy missing",
        );
        assert_not_found(
            s.copy_thread(&user, source.thread_id, ResourceId::generate())
                .await,
            "copy deleted",
        );
    })
    .await;
}

#[tokio::test]
async fn metadata_filters_take_any_key() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = Scope::local();
        let metadata = json!({
            "q\"uote": {"in": ["a", {"b\\s": true}]},
            "back\\slash": 1,
            "dot.ted": 2,
            "[0]": 3,
            "$": 4,
            "": 5,
            "sp ace": 6,
            "ünï": 7,
            "it's": 8,
            "line\nbreak": 9,
        });
        let thread = s
            .create_thread(&user, new_thread(metadata.clone()))
            .await
            .unwrap();
        s.create_thread(&user, new_thread(json!({"other": 1})))
            .await
            .unwrap();
        for (key, value) in metadata.as_object().unwrap() {
            let filter = ThreadFilter {
                metadata: Some(obj(json!({ key.clone(): value.clone() }))),
                ..Default::default()
            };
            assert_eq!(
                find(s, &user, filter).await,
                vec![thread.thread_id],
                "key {key:?}"
            );
            let filter = ThreadFilter {
                metadata: Some(obj(json!({ key.clone(): "something else" }))),
                ..Default::default()
            };
            assert_eq!(
                find(s, &user, filter).await,
                Vec::<ResourceId>::new(),
                "key {key:?}, other value"
            );
        }
        let deep = ThreadFilter {
            metadata: Some(obj(json!({"q\"uote": {"in": [{"b\\s": true}]}}))),
            ..Default::default()
        };
        assert_eq!(find(s, &user, deep).await, vec![thread.thread_id]);
    })
    .await;
}
