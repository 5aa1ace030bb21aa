use serde_json::json;
use spindle_storage::test_util::for_each_backend;
use spindle_storage::*;

use crate::common::*;

#[tokio::test]
async fn create_starts_at_version_one_and_respects_if_exists() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let alice = Scope::new("alice");
        let mut f = fields("echo", "first", json!({"k": 1}));
        f.description = Some("desc".into());
        f.config = obj(json!({"configurable": {"model": "m"}}));
        f.context = obj(json!({"lang": "en"}));
        let new = new_assistant(f.clone());
        let id = new.assistant_id;

        let created = s
            .create_assistant(Owner::User(&alice), new.clone())
            .await
            .unwrap();
        assert_eq!(created.assistant_id, id);
        assert_eq!(created.version, 1);
        assert_eq!(created.user_id.as_deref(), Some("alice"));
        assert_eq!(created.fields, f);
        assert_eq!(created.created_at, created.updated_at);

        // What create returned is what was stored.
        assert_eq!(s.get_assistant(&alice, id).await.unwrap(), created);

        let other = NewAssistant {
            fields: fields("other", "second", json!({"k": 2})),
            ..new.clone()
        };
        assert_conflict(
            s.create_assistant(Owner::User(&alice), other.clone()).await,
            "create with an existing id",
        );
        let kept = s
            .create_assistant(
                Owner::User(&alice),
                NewAssistant {
                    if_exists: IfExists::DoNothing,
                    ..other.clone()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            kept, created,
            "do_nothing returns the existing assistant unchanged"
        );
        assert_eq!(s.get_assistant(&alice, id).await.unwrap(), created);
        let versions = s
            .list_assistant_versions(&alice, id, None, all())
            .await
            .unwrap();
        assert_eq!(versions.len(), 1, "neither conflict wrote a version");
        assert_eq!(versions[0].version, 1);
        assert_eq!(versions[0].fields, f);

        // Another user's assistant is not returned by do_nothing: the id is simply taken.
        let bob = Scope::new("bob");
        assert_conflict(
            s.create_assistant(
                Owner::User(&bob),
                NewAssistant {
                    if_exists: IfExists::DoNothing,
                    ..other
                },
            )
            .await,
            "bob's do_nothing on alice's id",
        );
    })
    .await;
}

#[tokio::test]
async fn get_of_a_missing_assistant_is_not_found() {
    for_each_backend(|db| async move {
        assert_not_found(
            db.storage()
                .get_assistant(&Scope::local(), ResourceId::generate())
                .await,
            "get missing",
        );
    })
    .await;
}

#[tokio::test]
async fn scopes_isolate_users_and_share_system_assistants() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let (alice, bob) = (Scope::new("alice"), Scope::new("bob"));
        let private = s
            .create_assistant(
                Owner::User(&alice),
                new_assistant(fields("echo", "private", json!({}))),
            )
            .await
            .unwrap();
        let shared = s
            .create_assistant(
                Owner::System,
                new_assistant(fields("echo", "shared", json!({}))),
            )
            .await
            .unwrap();
        assert_eq!(shared.user_id, None);
        let id = private.assistant_id;

        assert_not_found(s.get_assistant(&bob, id).await, "bob gets alice's");
        assert_not_found(
            s.update_assistant(&bob, id, AssistantPatch::default())
                .await,
            "bob updates alice's",
        );
        assert_not_found(
            s.set_latest_assistant_version(&bob, id, 1).await,
            "bob pins alice's",
        );
        assert_not_found(
            s.list_assistant_versions(&bob, id, None, all()).await,
            "bob lists alice's versions",
        );
        assert_not_found(
            s.delete_assistant(&bob, id, false).await,
            "bob deletes alice's",
        );
        assert_eq!(
            s.get_assistant(&alice, id).await.unwrap(),
            private,
            "alice's survived bob"
        );

        for user in [&alice, &bob] {
            assert_eq!(
                s.get_assistant(user, shared.assistant_id).await.unwrap(),
                shared
            );
        }
        let seen_by_bob = s
            .search_assistants(&bob, assistant_search(Default::default()))
            .await
            .unwrap();
        assert_eq!(
            ids_of_assistants(&seen_by_bob.items),
            vec![shared.assistant_id]
        );
        assert_eq!(seen_by_bob.total, 1);
        let seen_by_alice = s
            .search_assistants(&alice, assistant_search(Default::default()))
            .await
            .unwrap();
        assert_eq!(
            sorted(ids_of_assistants(&seen_by_alice.items)),
            sorted(vec![id, shared.assistant_id])
        );
        assert_eq!(
            s.count_assistants(&bob, Default::default()).await.unwrap(),
            1
        );
        assert_eq!(
            s.count_assistants(&alice, Default::default())
                .await
                .unwrap(),
            2
        );
    })
    .await;
}

#[tokio::test]
async fn updates_write_new_versions() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = Scope::local();
        let mut f = fields(
            "echo",
            "v1",
            json!({"a": 1, "keep": true, "nested": {"x": 1, "y": 2}}),
        );
        f.description = Some("first".into());
        f.config = obj(json!({"configurable": {"model": "a", "temperature": 0}}));
        f.context = obj(json!({"lang": "en"}));
        let created = s
            .create_assistant(Owner::User(&user), new_assistant(f.clone()))
            .await
            .unwrap();
        let id = created.assistant_id;

        let v2 = s
            .update_assistant(
                &user,
                id,
                AssistantPatch {
                    name: Some("v2".into()),
                    metadata: Some(obj(json!({"a": 2, "new": "n", "nested": {"x": 9}}))),
                    config: Some(obj(json!({"configurable": {"model": "b"}}))),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(v2.version, 2);
        assert_eq!(v2.fields.name, "v2");
        assert_eq!(v2.fields.graph_id, "echo", "unpatched fields are kept");
        assert_eq!(v2.fields.description.as_deref(), Some("first"));
        assert_eq!(v2.fields.context, f.context);
        assert_eq!(
            v2.fields.metadata,
            obj(json!({"a": 2, "keep": true, "new": "n", "nested": {"x": 9}})),
            "metadata is merged key by key"
        );
        assert_eq!(
            v2.fields.config,
            obj(json!({"configurable": {"model": "b"}})),
            "config is replaced whole"
        );
        assert_eq!(v2.created_at, created.created_at);
        assert!(v2.updated_at >= created.updated_at);
        assert_eq!(s.get_assistant(&user, id).await.unwrap(), v2);

        let v3 = s
            .update_assistant(
                &user,
                id,
                AssistantPatch {
                    graph_id: Some("agent".into()),
                    description: Some(None),
                    config: Some(JsonObject::new()),
                    context: Some(obj(json!({"lang": "fr"}))),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(v3.version, 3);
        assert_eq!(v3.fields.graph_id, "agent");
        assert_eq!(
            v3.fields.description, None,
            "Some(None) clears the description"
        );
        assert!(v3.fields.config.is_empty(), "an empty config clears it");
        assert_eq!(v3.fields.context, obj(json!({"lang": "fr"})));
        assert_eq!(v3.fields.metadata, v2.fields.metadata);
        assert_eq!(s.get_assistant(&user, id).await.unwrap(), v3);

        let versions = s
            .list_assistant_versions(&user, id, None, all())
            .await
            .unwrap();
        assert_eq!(
            versions.iter().map(|v| v.version).collect::<Vec<_>>(),
            vec![3, 2, 1]
        );
        assert!(versions.iter().all(|v| v.assistant_id == id));
        assert_eq!(versions[0].fields, v3.fields);
        assert_eq!(versions[1].fields, v2.fields);
        assert_eq!(versions[2].fields, f);

        assert_not_found(
            s.update_assistant(&user, ResourceId::generate(), AssistantPatch::default())
                .await,
            "update missing",
        );
    })
    .await;
}

#[tokio::test]
async fn set_latest_pins_a_version() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = Scope::local();
        let mut f = fields("echo", "one", json!({"v": 1}));
        f.config = obj(json!({"c": 1}));
        let created = s
            .create_assistant(Owner::User(&user), new_assistant(f.clone()))
            .await
            .unwrap();
        let id = created.assistant_id;
        for n in 2..=3 {
            s.update_assistant(
                &user,
                id,
                AssistantPatch {
                    name: Some(format!("n{n}")),
                    graph_id: Some(format!("g{n}")),
                    config: Some(obj(json!({"c": n}))),
                    metadata: Some(obj(json!({"v": n}))),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        }

        let pinned = s.set_latest_assistant_version(&user, id, 1).await.unwrap();
        assert_eq!(pinned.version, 1);
        assert_eq!(
            pinned.fields, f,
            "the pinned version's fields become current"
        );
        assert_eq!(pinned.created_at, created.created_at);
        assert_eq!(s.get_assistant(&user, id).await.unwrap(), pinned);
        // Searches see the pinned fields too.
        let by_graph = s
            .search_assistants(
                &user,
                assistant_search(AssistantFilter {
                    graph_id: Some("echo".into()),
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
        assert_eq!(ids_of_assistants(&by_graph.items), vec![id]);

        let two = s.set_latest_assistant_version(&user, id, 2).await.unwrap();
        assert_eq!((two.version, two.fields.name.as_str()), (2, "n2"));
        assert_eq!(two.fields.metadata, obj(json!({"v": 2})));

        assert_not_found(
            s.set_latest_assistant_version(&user, id, 99).await,
            "unknown version",
        );
        assert_not_found(
            s.set_latest_assistant_version(&user, id, 0).await,
            "version 0",
        );
        assert_eq!(
            s.get_assistant(&user, id).await.unwrap(),
            two,
            "a failed pin changes nothing"
        );
        assert_not_found(
            s.set_latest_assistant_version(&user, ResourceId::generate(), 1)
                .await,
            "unknown assistant",
        );

        // The next update builds on the pinned version and still takes max + 1.
        let next = s
            .update_assistant(
                &user,
                id,
                AssistantPatch {
                    description: Some(Some("after pin".into())),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(next.version, 4);
        assert_eq!(next.fields.name, "n2");
        assert_eq!(next.fields.description.as_deref(), Some("after pin"));
        let versions = s
            .list_assistant_versions(&user, id, None, all())
            .await
            .unwrap();
        assert_eq!(
            versions.iter().map(|v| v.version).collect::<Vec<_>>(),
            vec![4, 3, 2, 1]
        );
    })
    .await;
}

#[tokio::test]
async fn concurrent_updates_each_get_their_own_version() {
    for_each_backend(|db| async move {
        let user = Scope::local();
        let id = db
            .storage()
            .create_assistant(
                Owner::User(&user),
                new_assistant(fields("echo", "busy", json!({}))),
            )
            .await
            .unwrap()
            .assistant_id;
        let updates: Vec<_> = (0..8)
            .map(|n| {
                let (storage, user) = (db.storage_arc(), user.clone());
                tokio::spawn(async move {
                    let patch = AssistantPatch {
                        metadata: Some(obj(json!({ format!("k{n}"): n }))),
                        ..Default::default()
                    };
                    storage
                        .update_assistant(&user, id, patch)
                        .await
                        .unwrap()
                        .version
                })
            })
            .collect();
        let mut versions = Vec::new();
        for update in updates {
            versions.push(update.await.unwrap());
        }
        versions.sort();
        assert_eq!(versions, (2..=9).collect::<Vec<i64>>());
        let current = db.storage().get_assistant(&user, id).await.unwrap();
        assert_eq!(current.version, 9);
        assert_eq!(
            current.fields.metadata.len(),
            8,
            "no update's merge was lost"
        );
    })
    .await;
}

#[tokio::test]
async fn versions_are_listed_newest_first_with_filter_and_paging() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = Scope::local();
        let created = s
            .create_assistant(
                Owner::User(&user),
                new_assistant(fields("echo", "a", json!({"stage": "draft", "n": 1}))),
            )
            .await
            .unwrap();
        let id = created.assistant_id;
        for (n, stage) in [(2, "draft"), (3, "live"), (4, "draft"), (5, "live")] {
            s.update_assistant(
                &user,
                id,
                AssistantPatch {
                    metadata: Some(obj(json!({"stage": stage, "n": n}))),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        }
        let user = &user;
        let versions = |metadata: Option<serde_json::Value>, limit, offset| {
            let metadata = metadata.map(obj);
            async move {
                s.list_assistant_versions(user, id, metadata, page(limit, offset))
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|v| v.version)
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(versions(None, 10, 0).await, vec![5, 4, 3, 2, 1]);
        assert_eq!(versions(None, 2, 0).await, vec![5, 4]);
        assert_eq!(versions(None, 2, 2).await, vec![3, 2]);
        assert_eq!(versions(None, 2, 4).await, vec![1]);
        assert_eq!(versions(None, 2, 5).await, Vec::<i64>::new());
        assert_eq!(
            versions(Some(json!({"stage": "draft"})), 10, 0).await,
            vec![4, 2, 1]
        );
        assert_eq!(
            versions(Some(json!({"stage": "draft"})), 1, 1).await,
            vec![2]
        );
        assert_eq!(
            versions(Some(json!({"stage": "live", "n": 3})), 10, 0).await,
            vec![3]
        );
        assert_eq!(
            versions(Some(json!({"stage": "gone"})), 10, 0).await,
            Vec::<i64>::new()
        );
        assert_eq!(versions(Some(json!({})), 10, 0).await, vec![5, 4, 3, 2, 1]);
        assert_not_found(
            s.list_assistant_versions(user, ResourceId::generate(), None, all())
                .await,
            "versions of a missing assistant",
        );
    })
    .await;
}

#[tokio::test]
async fn delete_removes_the_assistant_and_its_versions() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = Scope::local();
        let new = new_assistant(fields("echo", "doomed", json!({})));
        let id = new.assistant_id;
        s.create_assistant(Owner::User(&user), new.clone())
            .await
            .unwrap();
        s.update_assistant(&user, id, AssistantPatch::default())
            .await
            .unwrap();

        s.delete_assistant(&user, id, false).await.unwrap();
        assert_not_found(s.get_assistant(&user, id).await, "get after delete");
        assert_not_found(s.delete_assistant(&user, id, false).await, "delete twice");
        assert_not_found(
            s.list_assistant_versions(&user, id, None, all()).await,
            "versions after delete",
        );
        assert_eq!(
            s.count_assistants(&user, Default::default()).await.unwrap(),
            0
        );

        // The id is free again, and the old versions are gone with the old assistant.
        let again = s.create_assistant(Owner::User(&user), new).await.unwrap();
        assert_eq!(again.version, 1);
        let versions = s
            .list_assistant_versions(&user, id, None, all())
            .await
            .unwrap();
        assert_eq!(
            versions.iter().map(|v| v.version).collect::<Vec<_>>(),
            vec![1]
        );
        let next = s
            .update_assistant(&user, id, AssistantPatch::default())
            .await
            .unwrap();
        assert_eq!(next.version, 2);
    })
    .await;
}

/// Ids of what `filter` finds, in creation order, and checks that count agrees.
async fn find(s: &dyn Storage, user: &Scope, filter: AssistantFilter) -> Vec<ResourceId> {
    let found = s
        .search_assistants(user, assistant_search(filter.clone()))
        .await
        .unwrap();
    assert_eq!(found.total, found.items.len() as i64, "total of {filter:?}");
    assert_eq!(
        s.count_assistants(user, filter.clone()).await.unwrap(),
        found.total,
        "count of {filter:?}"
    );
    ids_of_assistants(&found.items)
}

#[tokio::test]
async fn search_filters_by_graph_name_and_metadata() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        let mut ids = Vec::new();
        for (graph, name, metadata) in [
            (
                "echo",
                "Alpha Bot",
                json!({"team": "red", "level": 3, "ratio": 0.5, "active": true,
                "tags": ["x", "y"], "owner": {"name": "ann", "org": {"id": 7}}, "gone": null}),
            ),
            (
                "echo",
                "beta",
                json!({"team": "blue", "level": 4, "active": false, "tags": ["y"]}),
            ),
            (
                "agent",
                "gamma_alpha",
                json!({"team": "red", "level": "3", "tags": [], "owner": {"name": "bo"}}),
            ),
            ("agent", "delta%", json!({})),
        ] {
            let a = s
                .create_assistant(
                    Owner::User(&user),
                    new_assistant(fields(graph, name, metadata)),
                )
                .await
                .unwrap();
            ids.push(a.assistant_id);
        }
        let [alpha, beta, gamma, delta] = ids[..] else {
            unreachable!()
        };
        let by_meta = |m: serde_json::Value| AssistantFilter {
            metadata: Some(obj(m)),
            ..Default::default()
        };
        let by_name = |n: &str| AssistantFilter {
            name: Some(n.into()),
            ..Default::default()
        };

        assert_eq!(
            find(s, &user, Default::default()).await,
            vec![alpha, beta, gamma, delta]
        );
        let echo = AssistantFilter {
            graph_id: Some("echo".into()),
            ..Default::default()
        };
        assert_eq!(find(s, &user, echo).await, vec![alpha, beta]);
        let nothing = AssistantFilter {
            graph_id: Some("ech".into()),
            ..Default::default()
        };
        assert_eq!(
            find(s, &user, nothing).await,
            Vec::<ResourceId>::new(),
            "graph_id matches exactly"
        );

        // Name: a case-insensitive substring, with no wildcard characters.
        assert_eq!(find(s, &user, by_name("alpha")).await, vec![alpha, gamma]);
        assert_eq!(find(s, &user, by_name("ALPHA B")).await, vec![alpha]);
        assert_eq!(find(s, &user, by_name("_")).await, vec![gamma]);
        assert_eq!(find(s, &user, by_name("%")).await, vec![delta]);
        assert_eq!(find(s, &user, by_name("a%")).await, vec![delta]);
        assert_eq!(
            find(s, &user, by_name("")).await,
            vec![alpha, beta, gamma, delta]
        );
        assert_eq!(
            find(s, &user, by_name("zeta")).await,
            Vec::<ResourceId>::new()
        );

        // Metadata: jsonb containment.
        for (filter, expected) in [
            (json!({}), vec![alpha, beta, gamma, delta]),
            (json!({"team": "red"}), vec![alpha, gamma]),
            (json!({"team": "red", "level": 3}), vec![alpha]),
            (json!({"level": 3}), vec![alpha]),
            (json!({"level": 3.0}), vec![alpha]),
            (json!({"level": "3"}), vec![gamma]),
            (json!({"ratio": 0.5}), vec![alpha]),
            (json!({"ratio": 0.25}), vec![]),
            (json!({"active": true}), vec![alpha]),
            (json!({"active": false}), vec![beta]),
            (json!({"active": 1}), vec![]),
            (json!({"gone": null}), vec![alpha]),
            (json!({"team": null}), vec![]),
            (json!({"missing": null}), vec![]),
            (json!({"tags": ["y"]}), vec![alpha, beta]),
            (json!({"tags": ["y", "x"]}), vec![alpha]),
            (json!({"tags": []}), vec![alpha, beta, gamma]),
            (json!({"tags": ["z"]}), vec![]),
            (json!({"tags": "y"}), vec![]),
            (json!({"owner": {}}), vec![alpha, gamma]),
            (json!({"owner": {"name": "ann"}}), vec![alpha]),
            (json!({"owner": {"org": {"id": 7}}}), vec![alpha]),
            (json!({"owner": {"org": {"id": 8}}}), vec![]),
            (json!({"owner": {"name": "ann", "org": {}}}), vec![alpha]),
            (json!({"owner": "ann"}), vec![]),
        ] {
            assert_eq!(
                find(s, &user, by_meta(filter.clone())).await,
                expected,
                "metadata {filter}"
            );
        }

        let combined = AssistantFilter {
            graph_id: Some("agent".into()),
            name: Some("ALPHA".into()),
            metadata: Some(obj(json!({"team": "red"}))),
            condition: None,
        };
        assert_eq!(find(s, &user, combined).await, vec![gamma]);
    })
    .await;
}

#[tokio::test]
async fn search_sorts_and_pages() {
    for_each_backend(|db| async move {
        let s = db.storage();
        let user = fresh_user();
        // Names and graph ids repeat so that the id tie-break matters; all lowercase ASCII so
        // that the expected order does not depend on the database's collation.
        for (graph, name) in [
            ("b", "kilo"),
            ("a", "alfa"),
            ("c", "kilo"),
            ("a", "zulu"),
            ("b", "echo"),
        ] {
            s.create_assistant(
                Owner::User(&user),
                new_assistant(fields(graph, name, json!({}))),
            )
            .await
            .unwrap();
        }
        // Touch two, so updated_at is not creation order.
        let everything = s
            .search_assistants(&user, assistant_search(Default::default()))
            .await
            .unwrap();
        for a in [&everything.items[3], &everything.items[0]] {
            s.update_assistant(&user, a.assistant_id, AssistantPatch::default())
                .await
                .unwrap();
        }
        let current = s
            .search_assistants(&user, assistant_search(Default::default()))
            .await
            .unwrap()
            .items;
        assert_eq!(current.len(), 5);

        for sort_by in [
            AssistantSortBy::AssistantId,
            AssistantSortBy::GraphId,
            AssistantSortBy::Name,
            AssistantSortBy::CreatedAt,
            AssistantSortBy::UpdatedAt,
        ] {
            let mut expected = current.clone();
            expected.sort_by(|a, b| {
                match sort_by {
                    AssistantSortBy::AssistantId => std::cmp::Ordering::Equal,
                    AssistantSortBy::GraphId => a.fields.graph_id.cmp(&b.fields.graph_id),
                    AssistantSortBy::Name => a.fields.name.cmp(&b.fields.name),
                    AssistantSortBy::CreatedAt => a.created_at.cmp(&b.created_at),
                    AssistantSortBy::UpdatedAt => a.updated_at.cmp(&b.updated_at),
                }
                .then(a.assistant_id.cmp(&b.assistant_id))
            });
            let ascending = ids_of_assistants(&expected);
            let descending: Vec<ResourceId> = ascending.iter().rev().copied().collect();
            for (sort_order, expected) in
                [(SortOrder::Asc, &ascending), (SortOrder::Desc, &descending)]
            {
                let search = |limit, offset| AssistantSearch {
                    filter: Default::default(),
                    sort_by,
                    sort_order,
                    page: page(limit, offset),
                };
                let full = s.search_assistants(&user, search(100, 0)).await.unwrap();
                assert_eq!(
                    &ids_of_assistants(&full.items),
                    expected,
                    "{sort_by:?} {sort_order:?}"
                );
                assert_eq!(full.total, 5);
                let first = s.search_assistants(&user, search(2, 0)).await.unwrap();
                assert_eq!(
                    ids_of_assistants(&first.items),
                    expected[..2],
                    "{sort_by:?} {sort_order:?} page 1"
                );
                assert_eq!(first.total, 5, "total counts every match, not the page");
                let second = s.search_assistants(&user, search(2, 2)).await.unwrap();
                assert_eq!(
                    ids_of_assistants(&second.items),
                    expected[2..4],
                    "{sort_by:?} {sort_order:?} page 2"
                );
                let last = s.search_assistants(&user, search(2, 4)).await.unwrap();
                assert_eq!(
                    ids_of_assistants(&last.items),
                    expected[4..],
                    "{sort_by:?} {sort_order:?} page 3"
                );
                let beyond = s.search_assistants(&user, search(2, 10)).await.unwrap();
                assert!(beyond.items.is_empty());
                assert_eq!(beyond.total, 5);
            }
        }

        // Total follows the filter, not the page.
        let filtered = s
            .search_assistants(
                &user,
                AssistantSearch {
                    filter: AssistantFilter {
                        name: Some("kilo".into()),
                        ..Default::default()
                    },
                    sort_by: AssistantSortBy::Name,
                    sort_order: SortOrder::Asc,
                    page: page(1, 0),
                },
            )
            .await
            .unwrap();
        assert_eq!((filtered.items.len(), filtered.total), (1, 2));
    })
    .await;
}
