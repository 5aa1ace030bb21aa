//! A conformance suite for [`Checkpointer`] implementations: the database savers of the
//! server crate run it to prove they behave like the in-memory one the engine is tested with.
//!
//! ```no_run
//! # async fn demo(saver: &dyn spindle_graph::checkpoint::Checkpointer) {
//! spindle_graph::checkpoint::conformance::check(saver).await.expect("conforms");
//! # }
//! ```

use serde_json::{json, Value};

use super::blob::FULL_EVERY;
use super::{
    new_checkpoint_id, BlobValue, ChannelBlob, Checkpoint, Checkpointer, ListFilter, PendingWrite,
};

fn checkpoint(versions: &[(&str, u64)]) -> Checkpoint {
    Checkpoint {
        v: 1,
        id: new_checkpoint_id(),
        ts: super::now_rfc3339(),
        channel_values: Default::default(),
        channel_versions: versions.iter().map(|(c, v)| (c.to_string(), *v)).collect(),
        versions_seen: Default::default(),
        updated_channels: Vec::new(),
        delta_depths: Default::default(),
    }
}

fn fail(what: &str, got: impl std::fmt::Debug) -> String {
    format!("{what}; got {got:?}")
}

/// Run every check against `saver`, using thread ids prefixed `conformance-`. Returns the
/// first failure, described.
pub async fn check(saver: &dyn Checkpointer) -> Result<(), String> {
    let t = format!("conformance-{}", uuid::Uuid::new_v4());
    let e = |x: super::CheckpointError| x.to_string();

    // A delta chain: full list, then appends and upserts, plus a value-less trigger channel.
    let c1 = checkpoint(&[("messages", 1), ("n", 1), ("branch:to:a", 1)]);
    let blobs1 = vec![
        ChannelBlob {
            channel: "messages".into(),
            version: 1,
            value: BlobValue::Full {
                value: json!([{"id": "m1", "content": "a"}]),
            },
        },
        ChannelBlob {
            channel: "n".into(),
            version: 1,
            value: BlobValue::Full { value: json!(1) },
        },
    ];
    saver
        .put(
            &t,
            "",
            &c1,
            &json!({"source": "input", "step": -1, "user": "ann"}),
            None,
            &blobs1,
        )
        .await
        .map_err(e)?;
    let c2 = checkpoint(&[("messages", 2), ("n", 1)]);
    let blobs2 = vec![ChannelBlob {
        channel: "messages".into(),
        version: 2,
        value: BlobValue::Upsert {
            base: 1,
            depth: 1,
            items: vec![
                json!({"id": "m1", "content": "A"}),
                json!({"id": "m2", "content": "b"}),
            ],
            removed: vec![],
        },
    }];
    saver
        .put(
            &t,
            "",
            &c2,
            &json!({"source": "loop", "step": 0}),
            Some(&c1.id),
            &blobs2,
        )
        .await
        .map_err(e)?;
    let c3 = checkpoint(&[("messages", 3), ("n", 3)]);
    let blobs3 = vec![
        ChannelBlob {
            channel: "messages".into(),
            version: 3,
            value: BlobValue::Upsert {
                base: 2,
                depth: 2,
                items: vec![json!({"id": "m3", "content": "c"})],
                removed: vec!["m2".into()],
            },
        },
        ChannelBlob {
            channel: "n".into(),
            version: 3,
            value: BlobValue::Full { value: json!(3) },
        },
    ];
    saver
        .put(
            &t,
            "",
            &c3,
            &json!({"source": "loop", "step": 1}),
            Some(&c2.id),
            &blobs3,
        )
        .await
        .map_err(e)?;

    let latest = saver
        .get_tuple(&t, "", None)
        .await
        .map_err(e)?
        .ok_or("get_tuple(None) found nothing")?;
    if latest.checkpoint.id != c3.id {
        return Err(fail(
            "get_tuple(None) must return the newest checkpoint",
            &latest.checkpoint.id,
        ));
    }
    let want = json!([{"id": "m1", "content": "A"}, {"id": "m3", "content": "c"}]);
    if latest.checkpoint.channel_values.get("messages") != Some(&want) {
        return Err(fail(
            "delta blobs must rebuild the list",
            latest.checkpoint.channel_values.get("messages"),
        ));
    }
    if latest.checkpoint.channel_values.get("n") != Some(&json!(3)) {
        return Err(fail(
            "full blobs must load",
            latest.checkpoint.channel_values.get("n"),
        ));
    }
    if latest.parent_id.as_deref() != Some(c2.id.as_str()) {
        return Err(fail("parent id must be kept", &latest.parent_id));
    }
    let first = saver
        .get_tuple(&t, "", Some(&c1.id))
        .await
        .map_err(e)?
        .ok_or("get_tuple(id) found nothing")?;
    if first.checkpoint.channel_values.get("messages")
        != Some(&json!([{"id": "m1", "content": "a"}]))
    {
        return Err(fail(
            "an old checkpoint must keep its own values",
            &first.checkpoint.channel_values,
        ));
    }
    if first.checkpoint.channel_versions.get("branch:to:a") != Some(&1) {
        return Err(fail(
            "trigger channel versions must be kept (they have no blobs)",
            &first.checkpoint.channel_versions,
        ));
    }
    if first.metadata["user"] != "ann" {
        return Err(fail("metadata must be kept as given", &first.metadata));
    }

    // Pending writes belong to one checkpoint.
    let w = vec![
        PendingWrite {
            task_id: "task1".into(),
            channel: "n".into(),
            value: json!(5),
        },
        PendingWrite {
            task_id: "task1".into(),
            channel: "__done__".into(),
            value: Value::Null,
        },
    ];
    saver.put_writes(&t, "", &c3.id, &w).await.map_err(e)?;
    let with_writes = saver
        .get_tuple(&t, "", Some(&c3.id))
        .await
        .map_err(e)?
        .ok_or("checkpoint vanished")?;
    if with_writes.pending_writes != w {
        return Err(fail(
            "pending writes must come back in order",
            &with_writes.pending_writes,
        ));
    }
    let other = saver
        .get_tuple(&t, "", Some(&c2.id))
        .await
        .map_err(e)?
        .ok_or("checkpoint vanished")?;
    if !other.pending_writes.is_empty() {
        return Err(fail(
            "writes of one checkpoint must not show on another",
            &other.pending_writes,
        ));
    }

    // Namespaces are separate.
    let sub = checkpoint(&[("x", 1)]);
    saver
        .put(
            &t,
            "child:abc",
            &sub,
            &json!({"source": "loop", "step": 0, "parents": {"": c3.id}}),
            None,
            &[ChannelBlob {
                channel: "x".into(),
                version: 1,
                value: BlobValue::Full {
                    value: json!("sub"),
                },
            }],
        )
        .await
        .map_err(e)?;
    let root = saver
        .get_tuple(&t, "", None)
        .await
        .map_err(e)?
        .ok_or("root vanished")?;
    if root.checkpoint.id != c3.id {
        return Err("a subgraph checkpoint must not become the root's latest".into());
    }

    // Listing: newest first, before, limit, metadata filter, namespaces.
    let ids =
        |v: Vec<super::CheckpointTuple>| v.into_iter().map(|t| t.checkpoint.id).collect::<Vec<_>>();
    let all_root = ids(saver
        .list(&t, Some(""), &ListFilter::default())
        .await
        .map_err(e)?);
    if all_root != vec![c3.id.clone(), c2.id.clone(), c1.id.clone()] {
        return Err(fail("list must be newest first", all_root));
    }
    let before = ids(saver
        .list(
            &t,
            Some(""),
            &ListFilter {
                before: Some(c3.id.clone()),
                limit: Some(1),
                metadata: None,
            },
        )
        .await
        .map_err(e)?);
    if before != vec![c2.id.clone()] {
        return Err(fail("list must honour before and limit", before));
    }
    let filtered = ids(saver
        .list(
            &t,
            Some(""),
            &ListFilter {
                metadata: Some(json!({"source": "loop", "step": 0})),
                ..Default::default()
            },
        )
        .await
        .map_err(e)?);
    if filtered != vec![c2.id.clone()] {
        return Err(fail("list must filter on metadata", filtered));
    }
    let everywhere = saver
        .list(&t, None, &ListFilter::default())
        .await
        .map_err(e)?;
    if everywhere.len() != 4 {
        return Err(fail(
            "list without a namespace must cover every namespace",
            everywhere.len(),
        ));
    }

    // A long delta chain still loads (savers must follow `base` links, FULL_EVERY deep).
    let mut prev = c3.id.clone();
    for i in 0..u64::from(FULL_EVERY) - 3 {
        let v = 4 + i;
        let c = checkpoint(&[("messages", v)]);
        let b = ChannelBlob {
            channel: "messages".into(),
            version: v,
            value: BlobValue::Append {
                base: v - 1,
                depth: 3 + i as u32,
                items: vec![json!({"id": format!("x{v}")})],
            },
        };
        saver
            .put(
                &t,
                "",
                &c,
                &json!({"source": "loop", "step": v}),
                Some(&prev),
                &[b],
            )
            .await
            .map_err(e)?;
        prev = c.id;
    }
    let long = saver
        .get_tuple(&t, "", None)
        .await
        .map_err(e)?
        .ok_or("latest vanished")?;
    let n = long
        .checkpoint
        .channel_values
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::len);
    if n != Some(2 + usize::try_from(FULL_EVERY).unwrap_or(64) - 3) {
        return Err(fail("a long delta chain must load whole", n));
    }

    // Copy and delete.
    let copy = format!("{t}-copy");
    saver.copy_thread(&t, &copy).await.map_err(e)?;
    let copied = saver
        .get_tuple(&copy, "", Some(&c3.id))
        .await
        .map_err(e)?
        .ok_or("copy has no checkpoints")?;
    if copied.checkpoint.channel_values.get("messages") != Some(&want) || copied.pending_writes != w
    {
        return Err("a copied thread must have the same checkpoints, values and writes".into());
    }
    saver.delete_thread(&t).await.map_err(e)?;
    if saver.get_tuple(&t, "", None).await.map_err(e)?.is_some()
        || saver
            .get_tuple(&t, "child:abc", None)
            .await
            .map_err(e)?
            .is_some()
    {
        return Err("delete_thread must remove every namespace".into());
    }
    if saver.get_tuple(&copy, "", None).await.map_err(e)?.is_none() {
        return Err("deleting a thread must not touch its copy".into());
    }
    saver.delete_thread(&copy).await.map_err(e)?;
    Ok(())
}
