//! Protocol v2 commands on a thread (`POST /threads/{id}/commands`, and the WebSocket):
//! `run.start`, `input.respond`, `agent.getTree`, `state.get`, `state.listCheckpoints`,
//! `state.fork`. Each answers `{type: success, id, result, meta}` or `{type: error, id,
//! error, message}` with the protocol's error codes.
//!
//! Runs are created by `routes::runs::start_run`, like every run, with what the reference
//! sets on a protocol run: every stream mode the events are derived from, subgraphs,
//! `if_not_exists=create`, and the v2 marker in `configurable`.

use serde_json::{json, Map, Value};
use spindle_graph::checkpoint::ListFilter;
use spindle_storage::ResourceId;
use spindle_storage::{Scope, StorageError, ThreadStatus};
use uuid::Uuid;

use super::{split_name, V2_CONFIG_KEY, V2_STREAM_MODES};
use crate::auth::AuthUser;
use crate::error::{ApiError, ErrorCode};
use crate::extract::{Validate, Violations};
use crate::routes::runs::{start_run, RunCreate};
use crate::routes::state::{read_history, read_state, HistoryAsk, StateAt};
use crate::state::AppState;
use crate::wire::whole_number;
use spindle_execution::Stateless;

/// Most checkpoints one `state.listCheckpoints` answers.
const MAX_CHECKPOINTS: usize = 100;

/// A protocol failure: its code and message.
#[derive(Debug)]
pub struct Failure {
    pub code: &'static str,
    pub message: String,
}

fn fail(code: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}

impl From<ApiError> for Failure {
    fn from(err: ApiError) -> Self {
        let code = match err.code() {
            ErrorCode::Validation | ErrorCode::InvalidRequest | ErrorCode::NotFound => {
                "invalid_argument"
            }
            _ => "unknown_error",
        };
        fail(code, err.message())
    }
}

impl From<StorageError> for Failure {
    fn from(err: StorageError) -> Self {
        ApiError::from(err).into()
    }
}

/// A command's id and method, checked before anything runs: the id must be an unsigned
/// integer and the method a string. The refusal is the protocol's error answer.
pub fn parse(command: &Value) -> Result<(u64, &str, Map<String, Value>), Value> {
    // A whole number, `2.0` included (as JSON Schema's `integer`).
    let id = command
        .get("id")
        .and_then(whole_number)
        .and_then(|id| u64::try_from(id).ok());
    let method = command.get("method").and_then(Value::as_str);
    let (Some(id), Some(method)) = (id, method) else {
        let id = command.get("id").filter(|i| i.is_u64()).cloned();
        return Err(error(
            id,
            &fail(
                "invalid_argument",
                "Protocol commands must include an integer id and string method.",
            ),
        ));
    };
    match command.get("params") {
        None | Some(Value::Null) => Ok((id, method, Map::new())),
        Some(Value::Object(params)) => Ok((id, method, params.clone())),
        Some(_) => Err(error(
            Some(json!(id)),
            &fail("invalid_argument", "params must be an object"),
        )),
    }
}

/// The error answer of a command.
pub fn error(id: Option<Value>, failure: &Failure) -> Value {
    json!({"type": "error", "id": id, "error": failure.code, "message": failure.message})
}

/// The success answer of a command. `applied_through_seq` is the last seq of the thread's
/// event stream this connection was sent (0 over HTTP, where the command and the stream are
/// separate connections): the official client takes it as its resume cursor, so anything
/// higher could make it skip events it never received.
pub fn success(id: u64, result: Value, applied_through_seq: i64) -> Value {
    json!({"type": "success", "id": id, "result": result,
           "meta": {"applied_through_seq": applied_through_seq.max(0)}})
}

/// Runs one command of the methods every transport serves.
pub async fn run(
    state: &AppState,
    caller: &AuthUser,
    thread_id: ResourceId,
    method: &str,
    params: &Map<String, Value>,
) -> Result<Value, Failure> {
    let scope = &caller.scope();
    let action = crate::auth::actions::of_command(method);
    let value = || {
        let mut value = params.clone();
        value.insert("thread_id".into(), json!(thread_id.to_string()));
        Value::Object(value)
    };
    if let Err(why) = crate::auth::allows(state, caller, action, value).await {
        return Err(fail("permission_denied", format!("{method}: {why}")));
    }
    match method {
        "run.start" => run_start(state, caller, thread_id, params).await,
        "input.respond" => input_respond(state, caller, thread_id, params).await,
        "agent.getTree" => agent_tree(state, scope, thread_id, params).await,
        "state.get" => state_get(state, scope, thread_id, params).await,
        "state.listCheckpoints" => list_checkpoints(state, scope, thread_id, params).await,
        "state.fork" => state_fork(state, caller, thread_id, params).await,
        "subscription.subscribe" | "subscription.unsubscribe" | "subscription.reconnect" => {
            Err(fail(
                "not_supported",
                format!("{method} needs the WebSocket at /threads/{{thread_id}}/stream/events; over HTTP the stream's body is the subscription"),
            ))
        }
        "input.inject" => Err(fail("not_supported", "input.inject is not supported")),
        other => Err(fail(
            "unknown_command",
            format!("Unknown protocol command: {other}"),
        )),
    }
}

fn object(params: &Map<String, Value>, key: &str) -> Result<Option<Map<String, Value>>, Failure> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o.clone())),
        Some(_) => Err(fail("invalid_argument", format!("{key} must be an object"))),
    }
}

/// A v2 run's request: the protocol's settings over what the command gave.
struct RunAsk {
    assistant_id: String,
    input: Option<Value>,
    command: Option<Value>,
    config: Option<Map<String, Value>>,
    metadata: Option<Map<String, Value>>,
    checkpoint_id: Option<String>,
    multitask_strategy: Option<Value>,
}

async fn create_run(
    state: &AppState,
    caller: &AuthUser,
    thread_id: ResourceId,
    ask: RunAsk,
) -> Result<Uuid, Failure> {
    let mut config = ask.config.unwrap_or_default();
    let configurable = config.entry("configurable").or_insert_with(|| json!({}));
    if !configurable.is_object() {
        return Err(fail(
            "invalid_argument",
            "config.configurable must be an object",
        ));
    }
    configurable[V2_CONFIG_KEY] = json!(true);
    let body = json!({
        "assistant_id": ask.assistant_id,
        "input": ask.input,
        "command": ask.command,
        "config": config,
        "metadata": ask.metadata,
        "checkpoint_id": ask.checkpoint_id,
        "stream_mode": V2_STREAM_MODES,
        "stream_subgraphs": true,
        "stream_resumable": true,
        "if_not_exists": "create",
        "multitask_strategy": ask.multitask_strategy.unwrap_or(json!("enqueue")),
        "on_disconnect": "continue",
    });
    let body: RunCreate = serde_json::from_value(body)
        .map_err(|e| fail("invalid_argument", format!("invalid run parameters: {e}")))?;
    let mut violations = Violations::new("params");
    body.validate(&mut violations);
    violations.into_result()?;
    let started = start_run(state, caller, thread_id, &body, Stateless::No, None).await?;
    Ok(started.run.run_id)
}

async fn run_start(
    state: &AppState,
    caller: &AuthUser,
    thread_id: ResourceId,
    params: &Map<String, Value>,
) -> Result<Value, Failure> {
    let scope = &caller.scope();
    let assistant_id = params
        .get("assistant_id")
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| fail("invalid_argument", "run.start requires an assistant_id."))?;
    let config = object(params, "config")?;
    // A fork target arrives as `config.configurable.checkpoint_id`, as the official clients
    // send it.
    let checkpoint_id = config
        .as_ref()
        .and_then(|c| c.get("configurable"))
        .and_then(|c| c.get("checkpoint_id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(id) = &checkpoint_id {
        Uuid::parse_str(id).map_err(|_| {
            fail(
                "invalid_argument",
                "config.configurable.checkpoint_id must be a UUID",
            )
        })?;
    }
    let input = params.get("input").filter(|i| !i.is_null()).cloned();
    // Input answering an interrupt resumes it, as the reference does.
    let (input, command) = match input {
        Some(value) if awaits_input(state, scope, thread_id).await? => {
            (None, Some(json!({"resume": value})))
        }
        other => (other, None),
    };
    let multitask_strategy = params
        .get("multitask_strategy")
        .or_else(|| params.get("multitaskStrategy"))
        .cloned();
    let run_id = create_run(
        state,
        caller,
        thread_id,
        RunAsk {
            assistant_id: assistant_id.to_owned(),
            input,
            command,
            config,
            metadata: object(params, "metadata")?,
            checkpoint_id,
            multitask_strategy,
        },
    )
    .await?;
    Ok(json!({"run_id": run_id.to_string()}))
}

/// Whether the thread waits for input, so that input given now is the answer to its
/// interrupt: it is interrupted, or its run in flight has already asked (`input.requested`).
/// A client that saw the question may answer before the run's end is committed, while the
/// thread still reads `busy`; the question was logged before any client could see it, so it
/// decides, with no race. The resume is queued behind the run, which then ends interrupted.
async fn awaits_input(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
) -> Result<bool, Failure> {
    let status = match state.storage.get_thread(scope, thread_id).await {
        Ok(thread) => thread.status,
        Err(StorageError::NotFound(_)) => return Ok(false),
        Err(err) => return Err(err.into()),
    };
    if status != ThreadStatus::Busy {
        return Ok(status == ThreadStatus::Interrupted);
    }
    let running = state
        .storage
        .list_runs(
            scope,
            thread_id,
            spindle_storage::RunFilter {
                status: Some(spindle_storage::RunStatus::Running),
            },
            crate::wire::page(Some(1), None),
        )
        .await?;
    match running.first() {
        Some(run) => asked_for_input(state, thread_id, run.run_id).await,
        // The run ended since the thread was read: its end says.
        None => Ok(matches!(
            state.storage.get_thread(scope, thread_id).await,
            Ok(thread) if thread.status == ThreadStatus::Interrupted
        )),
    }
}

/// Whether a run's logged events ask for input (its own `input.requested`, or a plain run's
/// interrupt, which the protocol shows as one).
async fn asked_for_input(
    state: &AppState,
    thread_id: ResourceId,
    run_id: Uuid,
) -> Result<bool, Failure> {
    const PAGE: i64 = 500;
    let mut after = 0;
    loop {
        let events = state
            .storage
            .read_events(thread_id, after, Some(run_id), PAGE)
            .await?;
        let asked = events.iter().any(|event| {
            super::envelope::envelope(event, false)
                .is_some_and(|e| e["method"] == "input.requested")
        });
        match events.last() {
            _ if asked => return Ok(true),
            Some(last) if events.len() as i64 == PAGE => after = last.seq,
            _ => return Ok(false),
        }
    }
}

/// `(interrupt_id, response)` pairs of `input.respond`: one, or a `responses` list.
fn responses(params: &Map<String, Value>) -> Result<Vec<(String, Value)>, Failure> {
    let entry = |e: &Map<String, Value>| -> Result<(String, Value), Failure> {
        let id = e
            .get("interrupt_id")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                fail(
                    "invalid_argument",
                    "input.respond requires an interrupt_id.",
                )
            })?;
        match e.get("namespace") {
            None | Some(Value::Null) => {}
            Some(Value::Array(parts)) if parts.iter().all(Value::is_string) => {}
            Some(_) => {
                return Err(fail(
                    "invalid_argument",
                    "input.respond requires namespace to be a list of strings.",
                ))
            }
        }
        Ok((
            id.to_owned(),
            e.get("response").cloned().unwrap_or(Value::Null),
        ))
    };
    match params.get("responses") {
        Some(Value::Array(list)) if list.is_empty() => Err(fail(
            "invalid_argument",
            "input.respond requires at least one response.",
        )),
        Some(Value::Array(list)) => list
            .iter()
            .map(|item| match item {
                Value::Object(e) => entry(e),
                _ => Err(fail(
                    "invalid_argument",
                    "input.respond responses entries must be objects.",
                )),
            })
            .collect(),
        Some(_) => Err(fail("invalid_argument", "responses must be a list")),
        None => Ok(vec![entry(params)?]),
    }
}

async fn input_respond(
    state: &AppState,
    caller: &AuthUser,
    thread_id: ResourceId,
    params: &Map<String, Value>,
) -> Result<Value, Failure> {
    let scope = &caller.scope();
    let answers = responses(params)?;
    let thread = settled_thread(state, scope, thread_id).await?;
    let pending: Vec<&str> = thread
        .interrupts
        .values()
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(|i| i.get("id").and_then(Value::as_str))
        .collect();
    for (id, _) in &answers {
        if !pending.contains(&id.as_str()) {
            return Err(fail(
                "no_such_interrupt",
                format!("Unknown or already-consumed interrupt: {id}"),
            ));
        }
    }
    let assistant_id = thread_assistant(state, scope, &thread)
        .await?
        .ok_or_else(|| fail("no_such_run", "No interrupted run is bound to this thread."))?;
    let resume: Map<String, Value> = answers.into_iter().collect();
    let mut command = json!({"resume": resume});
    for key in ["update", "goto"] {
        if let Some(value) = params.get(key).filter(|v| !v.is_null()) {
            command[key] = value.clone();
        }
    }
    create_run(
        state,
        caller,
        thread_id,
        RunAsk {
            assistant_id,
            input: None,
            command: Some(command),
            config: object(params, "config")?,
            metadata: object(params, "metadata")?,
            checkpoint_id: None,
            multitask_strategy: None,
        },
    )
    .await?;
    Ok(json!({}))
}

/// How long `input.respond` waits for the thread's run to end before it judges the
/// interrupts. Live events reach streams before the run's end is committed, so a client that
/// answers the moment it sees `input.requested` may be a few milliseconds early.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// The thread once no run of it is in flight; refused if one still is after [`SETTLE`].
async fn settled_thread(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
) -> Result<spindle_storage::Thread, Failure> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let thread = match state.storage.get_thread(scope, thread_id).await {
            Ok(thread) => thread,
            Err(StorageError::NotFound(_)) => {
                return Err(fail(
                    "no_such_run",
                    "No interrupted run is bound to this thread.",
                ))
            }
            Err(err) => return Err(err.into()),
        };
        if thread.status != ThreadStatus::Busy {
            return Ok(thread);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(fail(
                "no_such_interrupt",
                "The thread has a run in flight; no interrupt is waiting for input.",
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The assistant the thread's runs use: its metadata's `assistant_id` (set when a run
/// created it), else the one of its latest run.
async fn thread_assistant(
    state: &AppState,
    scope: &Scope,
    thread: &spindle_storage::Thread,
) -> Result<Option<String>, Failure> {
    if let Some(id) = thread.metadata.get("assistant_id").and_then(Value::as_str) {
        return Ok(Some(id.to_owned()));
    }
    Ok(latest_run(state, scope, thread.thread_id)
        .await?
        .map(|run| run.assistant_id.to_string()))
}

async fn latest_run(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
) -> Result<Option<spindle_storage::Run>, Failure> {
    let runs = state
        .storage
        .list_runs(
            scope,
            thread_id,
            spindle_storage::RunFilter::default(),
            crate::wire::page(Some(1), None),
        )
        .await?;
    Ok(runs.into_iter().next())
}

/// The tree of a run's namespaces with their lifecycle status, read from the event log.
async fn agent_tree(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
    params: &Map<String, Value>,
) -> Result<Value, Failure> {
    let run = match params.get("run_id").and_then(Value::as_str) {
        Some(id) => {
            let id = Uuid::parse_str(id)
                .map_err(|_| fail("invalid_argument", "run_id must be a UUID"))?;
            match state.storage.get_run(scope, thread_id, id).await {
                Ok(run) => run,
                Err(StorageError::NotFound(_)) => {
                    return Err(fail("no_such_run", format!("No run {id} on this thread.")))
                }
                Err(err) => return Err(err.into()),
            }
        }
        None => latest_run(state, scope, thread_id)
            .await?
            .ok_or_else(|| fail("no_such_run", "No run is bound to this thread."))?,
    };
    let mut tree = TreeNode::new(Vec::new());
    tree.status = super::normalize::lifecycle_status(run.status, ThreadStatus::Idle).to_owned();
    let mut after = 0;
    loop {
        let events = state
            .storage
            .read_events(thread_id, after, Some(run.run_id), 500)
            .await?;
        for event in &events {
            after = event.seq;
            let (method, ns) = split_name(&event.event);
            let node = tree.at(&ns);
            if method == "lifecycle" {
                if let Some(status) = event.data.get("event").and_then(Value::as_str) {
                    node.status = status.to_owned();
                }
                if let Some(name) = event.data.get("graph_name").and_then(Value::as_str) {
                    node.graph_name = name.to_owned();
                }
            }
        }
        if events.len() < 500 {
            break;
        }
    }
    if tree.graph_name.is_empty() {
        tree.graph_name = state
            .storage
            .get_assistant(scope, run.assistant_id)
            .await
            .map(|a| a.fields.graph_id)
            .unwrap_or_default();
    }
    Ok(json!({"tree": tree.to_json()}))
}

/// A namespace of the agent tree.
struct TreeNode {
    namespace: Vec<String>,
    status: String,
    graph_name: String,
    children: Vec<TreeNode>,
}

impl TreeNode {
    fn new(namespace: Vec<String>) -> Self {
        let graph_name = namespace
            .last()
            .map(|s| s.split(':').next().unwrap_or_default().to_owned())
            .unwrap_or_default();
        Self {
            namespace,
            status: "started".into(),
            graph_name,
            children: Vec::new(),
        }
    }

    /// The node of a namespace, created (with its ancestors) when first seen.
    fn at(&mut self, ns: &[String]) -> &mut TreeNode {
        let mut node = self;
        for depth in 1..=ns.len() {
            let path = &ns[..depth];
            let index = match node.children.iter().position(|c| c.namespace == path) {
                Some(index) => index,
                None => {
                    node.children.push(TreeNode::new(path.to_vec()));
                    node.children.len() - 1
                }
            };
            node = &mut node.children[index];
        }
        node
    }

    fn to_json(&self) -> Value {
        let mut out = json!({"namespace": self.namespace, "status": self.status, "graph_name": self.graph_name});
        if !self.children.is_empty() {
            out["children"] = self.children.iter().map(TreeNode::to_json).collect();
        }
        out
    }
}

fn root_namespace(params: &Map<String, Value>) -> Result<(), Failure> {
    match params.get("namespace") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(parts)) if parts.is_empty() => Ok(()),
        Some(Value::Array(parts)) if parts.iter().all(Value::is_string) => Err(fail(
            "no_such_namespace",
            "state commands read the root graph's state (namespace [])",
        )),
        Some(_) => Err(fail(
            "invalid_argument",
            "namespace must be a list of strings",
        )),
    }
}

async fn state_get(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
    params: &Map<String, Value>,
) -> Result<Value, Failure> {
    root_namespace(params)?;
    let at = StateAt {
        checkpoint_ns: "",
        checkpoint_id: None,
        subgraphs: false,
    };
    let json = read_state(state, scope, thread_id, at).await?;
    if json["checkpoint"].is_null() {
        return Ok(json!({"values": {}}));
    }
    let mut values = json["values"].clone();
    if let (Some(Value::Array(keys)), Some(all)) = (params.get("keys"), values.as_object()) {
        let picked: Map<String, Value> = all
            .iter()
            .filter(|(k, _)| keys.iter().any(|want| want.as_str() == Some(k.as_str())))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        values = Value::Object(picked);
    }
    Ok(json!({"values": values, "checkpoint": checkpoint_ref(&json["checkpoint"])}))
}

fn checkpoint_ref(checkpoint: &Value) -> Value {
    let mut out = json!({"id": checkpoint["checkpoint_id"]});
    if let Some(ns) = checkpoint["checkpoint_ns"]
        .as_str()
        .filter(|ns| !ns.is_empty())
    {
        out["ns"] = json!(ns);
    }
    out
}

async fn list_checkpoints(
    state: &AppState,
    scope: &Scope,
    thread_id: ResourceId,
    params: &Map<String, Value>,
) -> Result<Value, Failure> {
    root_namespace(params)?;
    let limit = match params.get("limit") {
        None | Some(Value::Null) => 10,
        Some(n) => match n.as_u64() {
            Some(n) if n >= 1 => (n as usize).min(MAX_CHECKPOINTS),
            _ => return Err(fail("invalid_argument", "limit must be a positive integer")),
        },
    };
    let before = match params.get("before") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => return Err(fail("invalid_argument", "before must be a checkpoint id")),
    };
    let ask = HistoryAsk {
        checkpoint_ns: String::new(),
        only: None,
        filter: ListFilter {
            before,
            limit: Some(limit),
            metadata: None,
        },
        subgraphs: false,
    };
    let history = read_history(state, scope, thread_id, ask).await?;
    let checkpoints: Vec<Value> = history
        .iter()
        .map(|json| {
            let mut out = json!({
                "id": json["checkpoint"]["checkpoint_id"],
                "timestamp": json["created_at"],
                "step": json["metadata"]["step"].as_i64().unwrap_or(0),
                "metadata": json["metadata"],
            });
            if let Some(node) = json["metadata"]["writes"]
                .as_object()
                .and_then(|w| w.keys().next())
            {
                out["node_name"] = json!(node);
            }
            out
        })
        .collect();
    Ok(json!({"checkpoints": checkpoints}))
}

async fn state_fork(
    state: &AppState,
    caller: &AuthUser,
    thread_id: ResourceId,
    params: &Map<String, Value>,
) -> Result<Value, Failure> {
    let scope = &caller.scope();
    let checkpoint_id = params
        .get("checkpoint_id")
        .and_then(Value::as_str)
        .ok_or_else(|| fail("invalid_argument", "state.fork requires a checkpoint_id."))?;
    let thread = state.storage.get_thread(scope, thread_id).await?;
    let at = StateAt {
        checkpoint_ns: "",
        checkpoint_id: Some(checkpoint_id),
        subgraphs: false,
    };
    // A checkpoint the thread does not have reads as an empty state, with no time.
    let found = read_state(state, scope, thread_id, at)
        .await
        .is_ok_and(|json| !json["created_at"].is_null());
    if !found || Uuid::parse_str(checkpoint_id).is_err() {
        return Err(fail(
            "no_such_checkpoint",
            format!("No checkpoint {checkpoint_id} on this thread."),
        ));
    }
    let assistant_id = thread_assistant(state, scope, &thread)
        .await?
        .ok_or_else(|| fail("no_such_run", "No run is bound to this thread."))?;
    let run_id = create_run(
        state,
        caller,
        thread_id,
        RunAsk {
            assistant_id,
            input: params.get("input").filter(|i| !i.is_null()).cloned(),
            command: None,
            config: object(params, "config")?,
            metadata: None,
            checkpoint_id: Some(checkpoint_id.to_owned()),
            multitask_strategy: None,
        },
    )
    .await?;
    Ok(json!({"run_id": run_id.to_string(), "thread_id": thread_id.to_string()}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_needs_an_integer_id_and_a_method() {
        let err = parse(&json!({"id": "x", "method": "run.start"})).unwrap_err();
        assert_eq!(err["error"], "invalid_argument");
        assert_eq!(err["id"], Value::Null);
        let err = parse(&json!({"id": 3, "method": "run.start", "params": 1})).unwrap_err();
        assert_eq!(err["id"], 3);
        let command = json!({"id": 4, "method": "state.get"});
        let (id, method, params) = parse(&command).unwrap();
        assert_eq!((id, method, params.len()), (4, "state.get", 0));
    }

    #[test]
    fn responses_come_one_or_many() {
        let one = json!({"interrupt_id": "a", "response": 1, "namespace": []});
        assert_eq!(
            responses(one.as_object().unwrap()).unwrap(),
            vec![("a".to_string(), json!(1))]
        );
        let many = json!({"responses": [{"interrupt_id": "a", "response": 1}, {"interrupt_id": "b", "response": 2}]});
        assert_eq!(responses(many.as_object().unwrap()).unwrap().len(), 2);
        let empty = json!({"responses": []});
        assert_eq!(
            responses(empty.as_object().unwrap()).unwrap_err().code,
            "invalid_argument"
        );
        let bad_ns = json!({"interrupt_id": "a", "namespace": "x"});
        assert!(responses(bad_ns.as_object().unwrap()).is_err());
    }

    #[test]
    fn the_tree_grows_from_namespaces() {
        let mut tree = TreeNode::new(Vec::new());
        tree.at(&["child:1".into(), "grand:2".into()]).status = "completed".into();
        let json = tree.to_json();
        assert_eq!(json["children"][0]["namespace"], json!(["child:1"]));
        assert_eq!(json["children"][0]["graph_name"], "child");
        assert_eq!(json["children"][0]["children"][0]["status"], "completed");
    }
}
