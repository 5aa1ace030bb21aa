//! From a stored run to the engine's inputs: what to run, with which settings.
//!
//! The server writes a run's request into `kwargs` when it creates it; this module reads it
//! back. Keeping both directions next to each other keeps them in step.

use serde_json::{json, Map, Value};
use spindle_graph::node::Goto;
use spindle_graph::pregel::parse_stream_modes;
use spindle_graph::{Durability, NodeSet, RunConfig, RunInput};
use spindle_storage::{Assistant, Run};
use uuid::Uuid;

/// Keys of `kwargs`, as the run routes write them.
pub mod keys {
    pub const INPUT: &str = "input";
    pub const COMMAND: &str = "command";
    pub const CONFIG: &str = "config";
    pub const CONTEXT: &str = "context";
    pub const STREAM_MODE: &str = "stream_mode";
    pub const STREAM_SUBGRAPHS: &str = "stream_subgraphs";
    pub const INTERRUPT_BEFORE: &str = "interrupt_before";
    pub const INTERRUPT_AFTER: &str = "interrupt_after";
    pub const CHECKPOINT_ID: &str = "checkpoint_id";
    pub const DURABILITY: &str = "durability";
    pub const WEBHOOK: &str = "webhook";
    pub const ON_DISCONNECT: &str = "on_disconnect";
    pub const TEMPORARY: &str = "temporary";
    /// Who started the run (LangGraph's `MinimalUserDict`), set by the server, never a client.
    pub const AUTH_USER: &str = "langgraph_auth_user";
}

/// Whether a run is a later attempt, and how far the earlier ones got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// The first attempt.
    No,
    /// A later attempt, and the thread's latest checkpoint is this run's.
    FromItsCheckpoint,
    /// A later attempt, but no checkpoint of this run was saved: its input never was.
    BeforeItsCheckpoint,
}

/// How far an earlier attempt of `run_id` got, from the metadata of the thread's latest
/// checkpoint (runs of a thread take turns, so only this run can have written it since).
pub fn resumed(attempt: i32, run_id: Uuid, latest: Option<&Value>) -> Resumed {
    let run_id = run_id.to_string();
    match latest.and_then(|m| m.get("run_id")).and_then(Value::as_str) {
        _ if attempt <= 1 => Resumed::No,
        Some(id) if id == run_id => Resumed::FromItsCheckpoint,
        _ => Resumed::BeforeItsCheckpoint,
    }
}

/// What the run starts from. A run claimed again after its worker died continues from its
/// last checkpoint instead of feeding its input a second time; one that died before its
/// first checkpoint was saved starts over with its input.
pub fn run_input(kwargs: &Map<String, Value>, resumed: Resumed) -> RunInput {
    if resumed == Resumed::FromItsCheckpoint {
        return RunInput::Continue;
    }
    if let Some(command) = kwargs.get(keys::COMMAND).filter(|c| !c.is_null()) {
        return command_input(command);
    }
    match kwargs.get(keys::INPUT) {
        Some(Value::Null) | None => RunInput::Continue,
        Some(input) => RunInput::Values(input.clone()),
    }
}

/// LangGraph's `Command`: `{resume?, update?, goto?}`, `goto` being a node, a list of nodes,
/// or `Send`s (`{node, arg}`).
fn command_input(command: &Value) -> RunInput {
    let goto = match command.get("goto") {
        Some(Value::String(node)) => vec![Goto::Node(node.clone())],
        Some(Value::Array(items)) => items.iter().filter_map(goto_of).collect(),
        Some(item @ Value::Object(_)) => goto_of(item).into_iter().collect(),
        _ => Vec::new(),
    };
    RunInput::Command {
        resume: command.get("resume").cloned(),
        update: command.get("update").filter(|u| !u.is_null()).cloned(),
        goto,
    }
}

/// A `goto` item of a command: a node name or a `Send` (`{node, arg}`).
pub fn goto_of(item: &Value) -> Option<Goto> {
    match item {
        Value::String(node) => Some(Goto::Node(node.clone())),
        Value::Object(send) => Some(Goto::Send {
            node: send.get("node")?.as_str()?.to_owned(),
            arg: send.get("arg").cloned().unwrap_or(Value::Null),
        }),
        _ => None,
    }
}

/// Merges `over` into `base` key by key, recursing into objects (`configurable` merges).
fn merge(base: &mut Map<String, Value>, over: &Map<String, Value>) {
    for (key, value) in over {
        match (base.get_mut(key), value) {
            (Some(Value::Object(b)), Value::Object(o)) => merge(b, o),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

fn object(value: Option<&Value>) -> Map<String, Value> {
    value
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The engine settings of a run: the assistant's config and context with the run's on top,
/// and the run's identity in `configurable`, as LangGraph nodes expect to find it.
pub fn run_config(run: &Run, assistant: &Assistant) -> RunConfig {
    let kwargs = &run.kwargs;
    let run_config = object(kwargs.get(keys::CONFIG));
    let mut config = assistant.fields.config.clone();
    merge(&mut config, &run_config);
    let mut context = assistant.fields.context.clone();
    match object(kwargs.get(keys::CONTEXT)) {
        // As LangGraph Platform does: a run that gives no context has its `configurable` as
        // context (clients written before context existed set only `configurable`).
        run_context if run_context.is_empty() => {
            merge(&mut context, &object(run_config.get("configurable")))
        }
        run_context => merge(&mut context, &run_context),
    }

    let user_id = run.user_id.clone().unwrap_or_default();
    let user = kwargs
        .get(keys::AUTH_USER)
        .filter(|user| user["identity"].as_str() == Some(user_id.as_str()))
        .cloned()
        .unwrap_or_else(|| auth_user(&user_id));
    let permissions = user.get("permissions").cloned().unwrap_or(json!([]));
    let identity = json!({
        "thread_id": run.thread_id.to_string(),
        "run_id": run.run_id.to_string(),
        "assistant_id": run.assistant_id.to_string(),
        "graph_id": assistant.fields.graph_id,
        "langgraph_auth_user_id": user_id,
        "langgraph_auth_user": user,
        "langgraph_auth_permissions": permissions,
        "run_attempt": run.attempt,
    });
    let configurable = config.entry("configurable").or_insert_with(|| json!({}));
    if let (Value::Object(c), Value::Object(id)) = (configurable, identity) {
        for (key, value) in &context {
            c.entry(key.clone()).or_insert(value.clone());
        }
        c.extend(id);
        // `user_id` is the client's to set (in config or context), as on LangGraph Platform;
        // the caller's identity is `langgraph_auth_user_id`, which a client cannot set.
        c.entry("user_id").or_insert(json!(user_id));
    }
    let mut metadata = object(kwargs.get(spindle_storage::INHERITED_METADATA));
    metadata.extend(object(config.get("metadata")));
    metadata.extend(run.metadata.clone());
    metadata.insert("run_id".into(), json!(run.run_id.to_string()));
    metadata.insert("assistant_id".into(), json!(run.assistant_id.to_string()));
    metadata.insert("graph_id".into(), json!(assistant.fields.graph_id));
    config.insert("metadata".into(), Value::Object(metadata));

    let recursion_limit = config
        .get("recursion_limit")
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .unwrap_or(25);
    RunConfig {
        thread_id: Some(run.thread_id.to_string()),
        checkpoint_id: kwargs
            .get(keys::CHECKPOINT_ID)
            .and_then(Value::as_str)
            .map(str::to_owned),
        config: Value::Object(config),
        context: Value::Object(context),
        stream_modes: stream_modes(kwargs),
        stream_subgraphs: kwargs
            .get(keys::STREAM_SUBGRAPHS)
            .and_then(Value::as_bool)
            .unwrap_or(false),
        recursion_limit,
        interrupt_before: kwargs
            .get(keys::INTERRUPT_BEFORE)
            .and_then(NodeSet::from_value),
        interrupt_after: kwargs
            .get(keys::INTERRUPT_AFTER)
            .and_then(NodeSet::from_value),
        durability: kwargs
            .get(keys::DURABILITY)
            .and_then(Value::as_str)
            .and_then(Durability::parse)
            .unwrap_or(Durability::Async),
        // Only its worker knows (from the claim).
        new_thread: false,
    }
}

/// The caller as LangGraph's `langgraph_auth_user` (its `MinimalUserDict` shape), for a run
/// that kept none (created before runs kept it). Without authentication every request is the
/// local user, who is not authenticated.
fn auth_user(user_id: &str) -> Value {
    json!({
        "identity": user_id,
        "display_name": user_id,
        "is_authenticated": user_id != spindle_storage::Scope::LOCAL_USER,
        "permissions": [],
    })
}

/// The modes the run streams; validated when the run was created.
fn stream_modes(kwargs: &Map<String, Value>) -> Vec<spindle_graph::stream::StreamMode> {
    let names = requested_stream_modes(kwargs);
    parse_stream_modes(&names).unwrap_or_default()
}

/// The stream modes a run asked for, by name (`values` when none).
pub fn requested_stream_modes(kwargs: &Map<String, Value>) -> Vec<String> {
    let names: Vec<String> = match kwargs.get(keys::STREAM_MODE) {
        Some(Value::String(mode)) => vec![mode.clone()],
        Some(Value::Array(modes)) => modes
            .iter()
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    if names.is_empty() {
        vec!["values".to_owned()]
    } else {
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_reads_resume_update_and_gotos() {
        let input =
            command_input(&json!({"resume": "yes", "goto": ["a", {"node": "b", "arg": 1}]}));
        match input {
            RunInput::Command {
                resume,
                update,
                goto,
            } => {
                assert_eq!(resume, Some(json!("yes")));
                assert_eq!(update, None);
                assert_eq!(goto.len(), 2);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_later_attempt_continues_only_from_a_checkpoint_of_its_own() {
        let mut kwargs = Map::new();
        kwargs.insert("input".into(), json!({"n": 1}));
        let input = RunInput::Values(json!({"n": 1}));
        assert_eq!(run_input(&kwargs, Resumed::No), input);
        assert_eq!(run_input(&kwargs, Resumed::BeforeItsCheckpoint), input);
        assert_eq!(
            run_input(&kwargs, Resumed::FromItsCheckpoint),
            RunInput::Continue
        );
    }

    #[test]
    fn a_checkpoint_is_the_runs_by_its_metadata() {
        let run_id = Uuid::now_v7();
        let metadata = json!({"run_id": run_id.to_string(), "step": 0});
        assert_eq!(
            resumed(2, run_id, Some(&metadata)),
            Resumed::FromItsCheckpoint
        );
        let other = json!({"run_id": Uuid::now_v7().to_string()});
        assert_eq!(
            resumed(2, run_id, Some(&other)),
            Resumed::BeforeItsCheckpoint
        );
        assert_eq!(resumed(2, run_id, None), Resumed::BeforeItsCheckpoint);
        assert_eq!(resumed(1, run_id, Some(&metadata)), Resumed::No);
    }

    /// A run without `context` gets its `configurable` as context; one with `context` keeps
    /// it; the assistant's context is beneath both.
    #[test]
    fn a_runs_configurable_is_its_context_when_it_gives_none() {
        let now = chrono::Utc::now();
        let assistant = Assistant {
            assistant_id: Uuid::now_v7().into(),
            user_id: None,
            version: 1,
            fields: spindle_storage::AssistantFields {
                graph_id: "g".into(),
                name: "g".into(),
                description: None,
                config: Map::new(),
                context: json!({"base": 1}).as_object().cloned().unwrap(),
                metadata: Map::new(),
            },
            created_at: now,
            updated_at: now,
        };
        let mut run = Run {
            run_id: Uuid::now_v7(),
            thread_id: Uuid::now_v7().into(),
            assistant_id: assistant.assistant_id,
            user_id: None,
            status: spindle_storage::RunStatus::Running,
            kwargs: Map::new(),
            metadata: Map::new(),
            multitask_strategy: Default::default(),
            attempt: 1,
            run_after: now,
            cancel: None,
            error: None,
            output: None,
            created_at: now,
            updated_at: now,
            started_at: None,
            ended_at: None,
        };
        run.kwargs
            .insert("config".into(), json!({"configurable": {"model": "x"}}));
        let settings = run_config(&run, &assistant);
        assert_eq!(settings.context, json!({"base": 1, "model": "x"}));

        run.kwargs.insert("context".into(), json!({"model": "y"}));
        let settings = run_config(&run, &assistant);
        assert_eq!(settings.context, json!({"base": 1, "model": "y"}));
    }

    #[test]
    fn configurable_merges_deeply() {
        let mut base = json!({"configurable": {"a": 1, "b": 1}, "tags": ["x"]})
            .as_object()
            .cloned()
            .unwrap();
        merge(
            &mut base,
            json!({"configurable": {"b": 2}}).as_object().unwrap(),
        );
        assert_eq!(
            Value::Object(base),
            json!({"configurable": {"a": 1, "b": 2}, "tags": ["x"]})
        );
    }
}
