//! Request bodies that work, given to each operation of the OpenAPI document as its body's
//! `example`: `/docs` ("Try it out") fills its editor with them. Without them Swagger UI made
//! one up from the schema, such as `"offset": 9007199254740991` (its sample of an `int64`) or
//! an assistant id no server has.
//!
//! They run the graph `agent`: one of the example graphs, and the id LangGraph's templates
//! give theirs. Ids in paths (and `thread_ids` of a prune) are the caller's to fill in. The
//! e2e suite sends every one of them to a server (`test_openapi.py`).

use serde_json::{json, Value};

/// A run's body: the `agent` graph, one user message.
fn run() -> Value {
    json!({
        "assistant_id": "agent",
        "input": {"messages": [{"role": "user", "content": "What is 2 + 3?"}]},
    })
}

/// A cron's body: the run, every Monday at 9:00 UTC.
fn cron() -> Value {
    let mut cron = run();
    cron["schedule"] = json!("0 9 * * 1");
    cron
}

/// The example body of the operation `method path` (`method` in capitals), if it takes one.
pub(crate) fn request_example(method: &str, path: &str) -> Option<Value> {
    let example = match (method, path) {
        ("POST", "/assistants") => json!({
            "graph_id": "agent",
            "name": "Adder",
            "description": "Adds two numbers with a tool",
            "config": {},
            "metadata": {"team": "docs"},
        }),
        ("POST", "/assistants/search") => json!({"graph_id": "agent", "limit": 10, "offset": 0}),
        ("POST", "/assistants/count") => json!({"graph_id": "agent"}),
        ("PATCH", "/assistants/{assistant_id}") => {
            json!({"name": "Adder, renamed", "metadata": {"team": "docs"}})
        }
        ("POST", "/assistants/{assistant_id}/latest") => json!({"version": 1}),
        ("POST", "/assistants/{assistant_id}/versions") => json!({"limit": 10, "offset": 0}),
        ("POST", "/threads") => json!({"metadata": {"user": "alice"}}),
        ("POST", "/threads/search") => json!({
            "metadata": {"user": "alice"},
            "status": "idle",
            "limit": 10,
            "offset": 0,
        }),
        ("POST", "/threads/count") => json!({"metadata": {"user": "alice"}}),
        ("POST", "/threads/prune") => json!({
            "thread_ids": ["6f1b5a52-3b6a-4a8c-9a37-6a0c1e0b2f11"],
            "strategy": "keep_latest",
        }),
        ("PATCH", "/threads/{thread_id}") => json!({"metadata": {"user": "alice"}}),
        ("POST", "/threads/{thread_id}/copy") => json!({}),
        ("POST", "/threads/{thread_id}/history") => json!({"limit": 10}),
        ("POST", "/threads/{thread_id}/state") => json!({
            "values": {"messages": [{"role": "user", "content": "And 4 + 5?"}]},
        }),
        ("POST", "/threads/{thread_id}/state/checkpoint") => {
            json!({"checkpoint": {"checkpoint_ns": ""}, "subgraphs": false})
        }
        ("POST", "/threads/{thread_id}/commands") => {
            json!({"id": 1, "method": "state.get", "params": {}})
        }
        ("POST", "/threads/{thread_id}/stream/events") => {
            json!({"channels": ["values", "messages", "lifecycle"]})
        }
        ("POST", "/runs" | "/runs/wait" | "/threads/{thread_id}/runs")
        | ("POST", "/threads/{thread_id}/runs/wait") => run(),
        ("POST", "/runs/stream" | "/threads/{thread_id}/runs/stream") => {
            let mut run = run();
            run["stream_mode"] = json!(["values", "messages-tuple"]);
            run
        }
        ("POST", "/runs/batch") => json!([run(), run()]),
        ("POST", "/runs/cancel") => json!({"status": "pending"}),
        ("POST", "/runs/crons" | "/threads/{thread_id}/runs/crons") => cron(),
        ("PATCH", "/runs/crons/{cron_id}") => json!({"schedule": "30 9 * * 1", "enabled": true}),
        ("POST", "/runs/crons/search") => {
            json!({"assistant_id": "agent", "limit": 10, "offset": 0})
        }
        ("POST", "/runs/crons/count") => json!({"assistant_id": "agent"}),
        ("PUT", "/store/items") => json!({
            "namespace": ["users", "alice"],
            "key": "preferences",
            "value": {"theme": "dark"},
        }),
        ("DELETE", "/store/items") => {
            json!({"namespace": ["users", "alice"], "key": "preferences"})
        }
        ("POST", "/store/items/search") => json!({
            "namespace_prefix": ["users"],
            "filter": {"theme": "dark"},
            "limit": 10,
            "offset": 0,
        }),
        ("POST", "/store/namespaces") => {
            json!({"prefix": ["users"], "max_depth": 2, "limit": 100, "offset": 0})
        }
        _ => return None,
    };
    Some(example)
}
