//! The HTTP API in process: requests through the router against a SQLite database in a temp
//! folder, checking what clients rely on (statuses, bodies, headers).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use spindle_execution::{default_assistant_id, GraphRegistry, HubMessage};
use spindle_server::{app, AppState};
use spindle_storage::{AssistantFields, IfExists, NewAssistant, Owner};
use tower::ServiceExt;

struct TestApp {
    router: axum::Router,
    state: AppState,
    _dir: tempfile::TempDir,
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
}

async fn test_app() -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("test.db").to_string_lossy().into_owned();
    let storage = spindle_storage::connect(&url).await.unwrap();
    let mut registry = GraphRegistry::new();
    for (id, graph) in spindle_graph::examples::all() {
        registry.insert(id, graph);
    }
    for id in ["echo", "nested"] {
        let mut metadata = serde_json::Map::new();
        metadata.insert("created_by".into(), json!("system"));
        storage
            .create_assistant(
                Owner::System,
                NewAssistant {
                    assistant_id: default_assistant_id(id),
                    fields: AssistantFields {
                        graph_id: id.into(),
                        name: id.into(),
                        description: None,
                        config: Default::default(),
                        context: Default::default(),
                        metadata,
                    },
                    if_exists: IfExists::DoNothing,
                },
            )
            .await
            .unwrap();
    }
    let state = AppState::new(storage, Arc::new(registry));
    TestApp {
        router: app(state.clone()),
        state,
        _dir: dir,
    }
}

impl TestApp {
    async fn call(&self, method: Method, uri: &str, body: Option<&str>) -> Reply {
        let mut request = Request::builder().method(method).uri(uri);
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(
                body.map(|b| Body::from(b.to_owned()))
                    .unwrap_or_else(Body::empty),
            )
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    /// A request with exactly these headers and body (no content type added).
    async fn raw(&self, method: Method, uri: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Body::from(body.to_owned())).unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn post(&self, uri: &str, body: Value) -> Reply {
        self.call(Method::POST, uri, Some(&body.to_string())).await
    }

    async fn patch(&self, uri: &str, body: Value) -> Reply {
        self.call(Method::PATCH, uri, Some(&body.to_string())).await
    }

    async fn get(&self, uri: &str) -> Reply {
        self.call(Method::GET, uri, None).await
    }
}

fn first_loc(reply: &Reply) -> Value {
    reply.body["detail"][0]["loc"].clone()
}

#[tokio::test]
async fn assistant_update_creates_versions_and_set_latest_pins_one() {
    let app = test_app().await;
    let created = app
        .post(
            "/assistants",
            json!({"graph_id": "echo", "config": {"tags": ["a"]}, "metadata": {"k": 1}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::OK);
    assert_eq!(created.body["name"], "Untitled");
    assert_eq!(created.body["version"], 1);
    let id = created.body["assistant_id"].as_str().unwrap().to_owned();

    let v2 = app
        .patch(
            &format!("/assistants/{id}"),
            json!({"config": {"tags": ["b"]}, "metadata": {"m": 2}}),
        )
        .await;
    assert_eq!(v2.body["version"], 2);
    assert_eq!(
        v2.body["metadata"],
        json!({"k": 1, "m": 2}),
        "metadata is merged"
    );
    assert_eq!(v2.body["config"], json!({"tags": ["b"]}));

    let v3 = app
        .patch(&format!("/assistants/{id}"), json!({"config": {}}))
        .await;
    assert_eq!(v3.body["version"], 3);
    assert_eq!(v3.body["config"], json!({}), "an empty config clears it");

    let pinned = app
        .post(&format!("/assistants/{id}/latest"), json!({"version": 1}))
        .await;
    assert_eq!(pinned.status, StatusCode::OK);
    assert_eq!(pinned.body["version"], 1);
    assert_eq!(pinned.body["config"], json!({"tags": ["a"]}));
    let fetched = app.get(&format!("/assistants/{id}")).await;
    assert_eq!(
        fetched.body["config"],
        json!({"tags": ["a"]}),
        "runs use the pinned version"
    );

    let versions = app
        .post(&format!("/assistants/{id}/versions"), json!({}))
        .await;
    let numbers: Vec<i64> = versions
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, vec![3, 2, 1]);

    let missing = app
        .post(&format!("/assistants/{id}/latest"), json!({"version": 9}))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn assistant_null_name_is_refused_and_null_description_clears() {
    let app = test_app().await;
    let created = app
        .post(
            "/assistants",
            json!({"graph_id": "echo", "description": "d"}),
        )
        .await;
    let id = created.body["assistant_id"].as_str().unwrap().to_owned();

    let refused = app
        .patch(&format!("/assistants/{id}"), json!({"name": null}))
        .await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(first_loc(&refused), json!(["body", "name"]));
    let refused = app
        .patch(&format!("/assistants/{id}"), json!({"graph_id": null}))
        .await;
    assert_eq!(first_loc(&refused), json!(["body", "graph_id"]));
    assert_eq!(
        app.get(&format!("/assistants/{id}")).await.body["version"],
        1,
        "a refused update changes nothing"
    );

    let cleared = app
        .patch(&format!("/assistants/{id}"), json!({"description": null}))
        .await;
    assert_eq!(cleared.body["description"], Value::Null);
}

#[tokio::test]
async fn graph_id_is_accepted_as_assistant_id() {
    let app = test_app().await;
    let by_graph = app.get("/assistants/echo").await;
    assert_eq!(by_graph.status, StatusCode::OK);
    assert_eq!(
        by_graph.body["assistant_id"],
        default_assistant_id("echo").to_string()
    );
    assert_eq!(by_graph.body["metadata"], json!({"created_by": "system"}));

    let schemas = app.get("/assistants/echo/schemas").await;
    assert_eq!(schemas.status, StatusCode::OK);
    assert_eq!(schemas.body["graph_id"], "echo");
    assert!(schemas.body["state_schema"].is_object());

    let drawn = app.get("/assistants/echo/graph").await;
    let ids: Vec<&str> = drawn.body["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"__start__") && ids.contains(&"respond") && ids.contains(&"__end__"),
        "{ids:?}"
    );

    let subgraphs = app.get("/assistants/nested/subgraphs").await;
    assert!(subgraphs.body.get("child").is_some(), "{}", subgraphs.body);

    // Neither a graph's id nor an assistant's: not found, whatever its form.
    for unknown in ["not-a-graph", "not%20an%20id"] {
        let bad = app.get(&format!("/assistants/{unknown}")).await;
        assert_eq!(bad.status, StatusCode::NOT_FOUND, "{unknown}");
    }

    let bad_xray = app.get("/assistants/echo/graph?xray=0").await;
    assert_eq!(first_loc(&bad_xray), json!(["query", "xray"]));
}

#[tokio::test]
async fn unknown_graph_is_not_found_and_duplicate_id_conflicts() {
    let app = test_app().await;
    let unknown = app.post("/assistants", json!({"graph_id": "nope"})).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["error"], "not_found");
    assert!(unknown.body["message"].as_str().unwrap().contains("nope"));

    let id = uuid::Uuid::new_v4().to_string();
    let body = json!({"graph_id": "echo", "assistant_id": id, "name": "first"});
    assert_eq!(
        app.post("/assistants", body.clone()).await.status,
        StatusCode::OK
    );
    let again = app.post("/assistants", body).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.body["error"], "conflict");
    let kept = app
        .post("/assistants", json!({"graph_id": "echo", "assistant_id": id, "name": "second", "if_exists": "do_nothing"}))
        .await;
    assert_eq!(kept.status, StatusCode::OK);
    assert_eq!(kept.body["name"], "first");
}

#[tokio::test]
async fn thread_search_pages_with_a_real_total() {
    let app = test_app().await;
    for i in 0..5 {
        app.post("/threads", json!({"metadata": {"batch": "x", "i": i}}))
            .await;
    }
    app.post("/threads", json!({"metadata": {"batch": "y"}}))
        .await;

    let page = app
        .post("/threads/search", json!({"metadata": {"batch": "x"}, "limit": 2, "offset": 2, "sort_by": "created_at", "sort_order": "asc"}))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.headers["x-pagination-total"], "5");
    assert_eq!(page.headers["x-pagination-next"], "4");
    let items = page.body.as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["metadata"]["i"], 2);

    let selected = app
        .post(
            "/threads/search",
            json!({"select": ["thread_id", "status"], "limit": 1}),
        )
        .await;
    let keys: Vec<&String> = selected.body[0].as_object().unwrap().keys().collect();
    assert_eq!(keys, vec!["thread_id", "status"]);

    let count = app
        .post("/threads/count", json!({"metadata": {"batch": "x"}}))
        .await;
    assert_eq!(count.body, json!(5));
}

#[tokio::test]
async fn thread_lifecycle_follows_the_interface() {
    let app = test_app().await;
    let id = uuid::Uuid::new_v4().to_string();
    let created = app
        .post("/threads", json!({"thread_id": id, "metadata": {"a": 1}}))
        .await;
    assert_eq!(created.body["status"], "idle");
    assert_eq!(created.body["values"], Value::Null);
    assert_eq!(
        app.post("/threads", json!({"thread_id": id})).await.status,
        StatusCode::CONFLICT
    );

    let patched = app
        .patch(&format!("/threads/{id}"), json!({"metadata": {"b": null}}))
        .await;
    assert_eq!(patched.body["metadata"], json!({"a": 1, "b": null}));

    let copy = app.post(&format!("/threads/{id}/copy"), json!({})).await;
    assert_eq!(copy.status, StatusCode::OK);
    assert_ne!(copy.body["thread_id"], json!(id));
    assert_eq!(copy.body["metadata"], json!({"a": 1, "b": null}));

    let deleted = app
        .call(Method::DELETE, &format!("/threads/{id}"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.body, json!({}));
    let gone = app.get(&format!("/threads/{id}")).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.body["error"], "not_found");
}

#[tokio::test]
async fn bad_input_names_the_field() {
    let app = test_app().await;
    let cases: [(&str, &str, Value); 7] = [
        (
            "/threads",
            r#"{"metadata": 5}"#,
            json!(["body", "metadata"]),
        ),
        (
            "/threads",
            r#"{"if_exists": "bogus"}"#,
            json!(["body", "if_exists"]),
        ),
        (
            "/threads",
            r#"{"thread_id": "not an id"}"#,
            json!(["body", "thread_id"]),
        ),
        (
            "/threads/search",
            r#"{"limit": 1001}"#,
            json!(["body", "limit"]),
        ),
        (
            "/threads/search",
            r#"{"offset": -1}"#,
            json!(["body", "offset"]),
        ),
        (
            "/threads/search",
            r#"{"select": ["thread_id", "bogus"]}"#,
            json!(["body", "select", 1]),
        ),
        (
            "/assistants",
            r#"{"name": "x"}"#,
            json!(["body", "graph_id"]),
        ),
    ];
    for (uri, body, loc) in cases {
        let reply = app.call(Method::POST, uri, Some(body)).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{uri} {body}"
        );
        assert_eq!(first_loc(&reply), loc, "{uri} {body}: {}", reply.body);
        assert!(reply.body["detail"][0]["msg"].is_string());
        assert!(reply.body["detail"][0]["type"].is_string());
    }
    let malformed = app.call(Method::POST, "/threads", Some("{not json")).await;
    assert_eq!(malformed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(malformed.body["detail"][0]["type"], "json_invalid");

    // Run ids are always Spindle's UUIDs; thread ids may be a client's own (an unknown one,
    // of any form, is not found).
    let bad_path = app.get("/threads/some-thread/runs/not-a-uuid").await;
    assert_eq!(first_loc(&bad_path), json!(["path", "run_id"]));
    for unknown in ["not-a-uuid", "not%20an%20id"] {
        let missing = app.get(&format!("/threads/{unknown}")).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND, "{unknown}");
    }
    let bad_query = app
        .call(
            Method::DELETE,
            "/assistants/echo?delete_threads=maybe",
            None,
        )
        .await;
    assert_eq!(first_loc(&bad_query), json!(["query", "delete_threads"]));
}

#[tokio::test]
async fn openapi_lists_every_served_route() {
    let app = test_app().await;
    let doc = app.get("/openapi.json").await;
    assert_eq!(doc.status, StatusCode::OK);
    let paths = doc.body["paths"].as_object().unwrap();
    for path in [
        "/ok",
        "/health",
        "/live",
        "/ready",
        "/info",
        "/openapi.json",
        "/docs",
        "/assistants",
        "/assistants/search",
        "/assistants/count",
        "/assistants/{assistant_id}",
        "/assistants/{assistant_id}/graph",
        "/assistants/{assistant_id}/schemas",
        "/assistants/{assistant_id}/subgraphs",
        "/assistants/{assistant_id}/subgraphs/{namespace}",
        "/assistants/{assistant_id}/versions",
        "/assistants/{assistant_id}/latest",
        "/threads",
        "/threads/search",
        "/threads/count",
        "/threads/{thread_id}",
        "/threads/{thread_id}/copy",
        "/threads/prune",
        "/threads/{thread_id}/state",
        "/threads/{thread_id}/state/{checkpoint_id}",
        "/threads/{thread_id}/state/checkpoint",
        "/threads/{thread_id}/history",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} missing from /openapi.json"
        );
    }
    let docs = app.get("/docs/").await;
    assert_eq!(docs.status, StatusCode::OK);
    let html = docs.body.as_str().unwrap_or_default();
    assert!(
        !html.contains("https://") && !html.contains("http://"),
        "the docs page loads nothing from elsewhere"
    );
}

#[tokio::test]
async fn state_updates_build_history_on_a_thread_of_a_named_graph() {
    let app = test_app().await;
    let thread = app
        .post("/threads", json!({"metadata": {"graph_id": "chain"}}))
        .await;
    let tid = thread.body["thread_id"].as_str().unwrap().to_owned();
    let empty = app.get(&format!("/threads/{tid}/state")).await;
    assert_eq!(empty.body["checkpoint"], Value::Null);
    assert_eq!(empty.body["values"], json!({}));

    let first = app
        .post(
            &format!("/threads/{tid}/state"),
            json!({"values": {"n": 1}, "as_node": "a"}),
        )
        .await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    let cid = first.body["checkpoint"]["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    app.post(
        &format!("/threads/{tid}/state"),
        json!({"values": {"n": 2}, "as_node": "b"}),
    )
    .await;

    let state = app.get(&format!("/threads/{tid}/state")).await;
    assert_eq!(state.body["values"], json!({"n": 2}));
    assert_eq!(state.body["next"], json!(["c"]));
    assert_eq!(state.body["parent_checkpoint_id"], json!(cid));
    let thread = app.get(&format!("/threads/{tid}")).await;
    assert_eq!(thread.body["status"], "interrupted");
    assert_eq!(thread.body["values"], json!({"n": 2}));

    let history = app
        .post(&format!("/threads/{tid}/history"), json!({"limit": 10}))
        .await;
    let steps: Vec<&Value> = history
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["metadata"]["step"])
        .collect();
    assert_eq!(steps, [&json!(1), &json!(0)]);
    let older = app
        .post(
            &format!("/threads/{tid}/history"),
            json!({"limit": 10, "before": state.body["checkpoint_id"]}),
        )
        .await;
    assert_eq!(older.body.as_array().unwrap().len(), 1);
    let at = app.get(&format!("/threads/{tid}/state/{cid}")).await;
    assert_eq!(at.body["values"], json!({"n": 1}));

    let bad = app
        .post(
            &format!("/threads/{tid}/state"),
            json!({"values": {"n": 3}, "as_node": "__end__"}),
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(first_loc(&bad), json!(["body", "as_node"]));
    let bad = app
        .post(&format!("/threads/{tid}/history"), json!({"limit": 1001}))
        .await;
    assert_eq!(first_loc(&bad), json!(["body", "limit"]));
}

#[tokio::test]
async fn system_routes_answer() {
    let app = test_app().await;
    assert_eq!(app.get("/ok").await.body, json!({"ok": true}));
    assert_eq!(app.get("/ready").await.status, StatusCode::OK);
    let info = app.get("/info").await;
    assert_eq!(info.body["flags"]["assistants"], true);
    assert!(info.body["version"].is_string());
    assert_eq!(app.get("/nope").await.status, StatusCode::NOT_FOUND);
}

/// The interface's `{error, message, details}`, served as JSON.
fn assert_error_body(reply: &Reply, status: StatusCode, error: &str) {
    assert_eq!(reply.status, status, "{:?}", reply.body);
    assert_eq!(reply.headers["content-type"], "application/json");
    assert_eq!(reply.body["error"], error, "{:?}", reply.body);
    assert!(reply.body["message"].is_string(), "{:?}", reply.body);
    assert!(reply.body["details"].is_object(), "{:?}", reply.body);
}

#[tokio::test]
async fn bodies_must_be_json_objects() {
    let app = test_app().await;
    let id = "0190f3a4-0000-7000-8000-000000000001";
    // An array where an object is due: serde alone would read it by field position.
    let array = app.post("/threads", json!([id, {"k": "v"}])).await;
    assert_eq!(array.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(array.body["detail"][0]["type"], "dict_type");
    assert_eq!(first_loc(&array), json!(["body"]));
    // A body that is not JSON by its type is 415: a browser sends such bodies cross-site
    // without asking first.
    let body = json!({"thread_id": id}).to_string();
    for headers in [&[("content-type", "text/plain")][..], &[]] {
        let reply = app.raw(Method::POST, "/threads", headers, &body).await;
        assert_error_body(
            &reply,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        );
    }
    let empty_form = [("content-type", "application/x-www-form-urlencoded")];
    let reply = app.raw(Method::POST, "/threads", &empty_form, "").await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        app.get(&format!("/threads/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
    // JSON types with parameters or a +json suffix, and bodyless POSTs, pass.
    let json_utf8 = [("content-type", "application/json; charset=utf-8")];
    let reply = app.raw(Method::POST, "/threads", &json_utf8, &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let copy = app
        .raw(Method::POST, &format!("/threads/{id}/copy"), &[], "")
        .await;
    assert_eq!(copy.status, StatusCode::OK, "{:?}", copy.body);
}

#[tokio::test]
async fn errors_made_before_a_handler_are_json() {
    let app = test_app().await;
    let undecodable = app.get("/threads/%ff%fe").await;
    assert_eq!(undecodable.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(first_loc(&undecodable), json!(["path", "thread_id"]));
    let not_allowed = app.raw(Method::PUT, "/threads", &[], "").await;
    assert_error_body(
        &not_allowed,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    let unknown = app.get("/no/such/route").await;
    assert_error_body(&unknown, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn openapi_documents_the_run_fields_and_refused_media_types() {
    let app = test_app().await;
    let doc = app.get("/openapi.json").await.body;
    let run = &doc["components"]["schemas"]["RunOut"]["properties"];
    for field in [
        "input",
        "output",
        "error_message",
        "config",
        "context",
        "kwargs",
    ] {
        assert!(run.get(field).is_some(), "RunOut lacks {field}");
    }
    let responses = |path: &str, method: &str| doc["paths"][path][method]["responses"].clone();
    assert!(responses("/threads", "post").get("415").is_some());
    assert!(responses("/runs/crons", "post").get("415").is_some());
    assert!(
        responses("/threads/{thread_id}/runs/{run_id}/cancel", "post")
            .get("415")
            .is_none()
    );
}

/// A client that reads the thread's state when it sees the run's terminal `lifecycle` event
/// (as the official clients' `thread.output` does) finds the run's final state: the events
/// that tell of a run's end reach live followers only once the end is committed.
#[tokio::test]
async fn the_state_read_on_a_runs_terminal_event_is_final() {
    let app = test_app().await;
    let stop = tokio_util::sync::CancellationToken::new();
    app.state.workers.start(stop.clone());
    for _ in 0..20 {
        let thread = app.post("/threads", json!({})).await;
        let thread_id = thread.body["thread_id"].as_str().unwrap().to_owned();
        let mut events = app.state.hub.subscribe(thread_id.parse().unwrap());
        let run = app
            .post(
                &format!("/threads/{thread_id}/runs"),
                json!({"assistant_id": "echo", "input": {"messages": [{"type": "human", "content": "hi"}]}}),
            )
            .await;
        assert_eq!(run.status, StatusCode::OK, "{:?}", run.body);
        loop {
            let message = tokio::time::timeout(std::time::Duration::from_secs(10), events.recv())
                .await
                .expect("the run ends within 10 s")
                .expect("the hub stays open");
            let HubMessage::Event(event) = message else {
                continue;
            };
            if event.event == "lifecycle" && event.data["event"] == "completed" {
                break;
            }
        }
        let state = app.get(&format!("/threads/{thread_id}")).await;
        assert_eq!(state.body["status"], "idle", "{:?}", state.body);
        let run_id = run.body["run_id"].as_str().unwrap();
        let run = app
            .get(&format!("/threads/{thread_id}/runs/{run_id}"))
            .await;
        assert_eq!(run.body["status"], "success", "{:?}", run.body);
    }
    stop.cancel();
}
