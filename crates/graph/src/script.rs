//! Sandboxed user logic in Rhai.
//!
//! Why Rhai rather than QuickJS: it is pure Rust (no C toolchain, no `unsafe` FFI surface to
//! audit), it has no file, network or process access unless the host registers it, and it
//! enforces limits natively (operation count, call depth, string/array/map sizes) with a
//! progress hook that lets a script be stopped on cancellation or when its time is up. Its
//! values map one to one onto JSON through `serde`.
//!
//! Host API available to scripts (see `crate::spec` for where scripts appear):
//! - variables `state` (the node input), `config` (`#{configurable: ...}`), `context`;
//! - `ai(text)`, `human(text)`, `system(text)`, `tool_message(content, tool_call_id, name)`,
//!   `ai_tool_calls(text, calls)` build messages; `text(message)` reads one's text;
//! - `send(node, arg)` makes a `Send`; `command(update, goto)` returns an update with a goto;
//! - `interrupt(value)` returns the resume value (or pauses the run);
//! - `raise(class, message)` fails the node with that error class;
//! - `emit(value)` writes a `custom` stream event; `sleep(ms)` waits (cancellable);
//! - `store_get(namespace, key)`, `store_put(namespace, key, value)`,
//!   `store_search(prefix, filter, limit)` reach the long-term store;
//! - `call_model(name, messages)` (or `call_model(name, messages, #{stream, tools})`) calls a
//!   model declared in the graph file, its tokens streamed as a model node's are;
//!   `call_tool(name, args)` calls a declared tool (node and route scripts);
//! - `now()` (ISO 8601, UTC) and `now_ms()` read the clock; `to_json(value)` and
//!   `from_json(text)` convert;
//! - constants `START` and `END` (node names), `remaining_steps` and `is_last_step`
//!   (LangGraph's `RemainingSteps` and `IsLastStep`).
//!
//! Calls that stream into the run or show in it below the node (a model, a tool) are made by
//! the task's own side: a script on a blocking thread sends them as a [`TaskRequest`] to
//! [`Script::eval`], which makes them with the task's context and sends the answer back.
//!
//! A script's failure says where it happened, beside its message (`NodeError::Failed`'s
//! `location`): the graph file's line and column when the graph file told the script where its
//! text starts ([`ScriptOrigin`]), else the script's own line (`script line 3, column 9`); the
//! engine puts the graph and the node (or route, tool) before it. A failure on `()`, which a
//! state key never written reads as, says so in its message.
//!
//! Scripts that never wait (no `sleep`, store, model or tool call) run inline on the async thread:
//! they are bounded by the operation limit and a thread hop would cost more than the script.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rhai::{Dynamic, Engine, EvalAltResult, Map as RMap, Position, Scope, AST};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::context::{interrupt_id, RunShared, TaskContext};
use crate::messages::{ai_message, coerce_message, message_text, tool_message};
use crate::model::{ChatModel, ModelRegistry, ToolSchema};
use crate::node::{Command, CommandGraph, Goto, Interrupt, NodeError};
use crate::tools::Tool;

/// Limits applied to every script run.
#[derive(Debug, Clone, Copy)]
pub struct ScriptLimits {
    /// Maximum Rhai operations per run.
    pub max_operations: u64,
    /// Wall-clock time per run, sleeps excluded.
    pub max_duration: Duration,
    /// Maximum size of one string, array or map.
    pub max_size: usize,
}

impl Default for ScriptLimits {
    fn default() -> Self {
        ScriptLimits {
            max_operations: 5_000_000,
            max_duration: Duration::from_secs(10),
            max_size: 1 << 20,
        }
    }
}

/// What a graph file declares that its scripts may call.
#[derive(Clone, Default)]
pub struct ScriptResources {
    /// The models (`call_model`).
    pub models: Option<Arc<ModelRegistry>>,
    /// The tools (`call_tool`). Tools' own scripts have none, so no tool holds itself.
    pub tools: Option<Arc<HashMap<String, Arc<Tool>>>>,
}

/// A call a script on a blocking thread asks its task to make (see the module's docs).
enum TaskRequest {
    Model {
        model: Arc<dyn ChatModel>,
        messages: Vec<Value>,
        tools: Vec<ToolSchema>,
        stream: bool,
        answer: oneshot::Sender<Result<Value, NodeError>>,
    },
    Tool {
        tool: Arc<Tool>,
        args: Value,
        answer: oneshot::Sender<Result<Value, NodeError>>,
    },
}

impl TaskRequest {
    /// Make the call with the task's context and send its answer back. Boxed: a tool's
    /// script may itself ask its task for calls.
    fn serve(self, ctx: &TaskContext) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move { self.serve_now(ctx).await })
    }

    async fn serve_now(self, ctx: &TaskContext) {
        match self {
            TaskRequest::Model {
                model,
                messages,
                tools,
                stream,
                answer,
            } => {
                let streaming = stream.then_some(ctx);
                let reply =
                    crate::nodes::traced_invoke(&model, &messages, &tools, streaming, ctx).await;
                let _ = answer.send(reply);
            }
            TaskRequest::Tool { tool, args, answer } => {
                let call_id = format!("call_{}", uuid::Uuid::new_v4().simple());
                let _ =
                    answer.send(crate::tools::announced_call(&tool, &args, &call_id, ctx).await);
            }
        }
    }
}

/// What the host functions need while a script runs on this thread.
struct Host {
    run: Arc<RunShared>,
    graph_ns: Vec<String>,
    task_ns: String,
    /// Resume values from interrupt number `resume_base` on.
    resume: Vec<Value>,
    resume_base: usize,
    counter: AtomicUsize,
    resources: ScriptResources,
    runtime: Option<tokio::runtime::Handle>,
    /// Where calls only the task can make go (scripts on a blocking thread).
    requests: Option<mpsc::UnboundedSender<TaskRequest>>,
    deadline: Instant,
    /// Custom events written by an inline script, sent when it returns.
    held_custom: std::sync::Mutex<Vec<Value>>,
}

thread_local! {
    static HOST: RefCell<Option<Arc<Host>>> = const { RefCell::new(None) };
}

fn with_host<T>(
    f: impl FnOnce(&Host) -> Result<T, Box<EvalAltResult>>,
) -> Result<T, Box<EvalAltResult>> {
    let host = HOST.with(|h| h.borrow().clone());
    match host {
        Some(h) => f(&h),
        None => Err("this function is only available while a graph runs".into()),
    }
}

fn to_dyn(v: &Value) -> Dynamic {
    rhai::serde::to_dynamic(v).unwrap_or(Dynamic::UNIT)
}

/// Convert a script value to JSON. Rhai's `()` becomes `null`.
pub fn from_dyn(d: &Dynamic) -> Value {
    if d.is_unit() {
        return Value::Null;
    }
    rhai::serde::from_dynamic::<Value>(d).unwrap_or(Value::Null)
}

fn throw_map(key: &str, payload: Value) -> Box<EvalAltResult> {
    let mut m = RMap::new();
    m.insert(key.into(), to_dyn(&payload));
    EvalAltResult::ErrorRuntime(Dynamic::from_map(m), Position::NONE).into()
}

/// An error a script raises (`raise`, or a call that failed): `#{error, message}` to a
/// `catch`, the node's error with that class when not caught.
fn raise_error(class: &str, message: &str) -> Box<EvalAltResult> {
    let error = json!({"error": class, "message": message, RAISED: true});
    EvalAltResult::ErrorRuntime(to_dyn(&error), Position::NONE).into()
}

/// Marks a raised error's map.
const RAISED: &str = "__raised__";

fn block_on<F: std::future::Future>(host: &Host, fut: F) -> Result<F::Output, Box<EvalAltResult>> {
    match &host.runtime {
        Some(h) => Ok(h.block_on(fut)),
        None => Err("this function needs the script to run on a blocking thread".into()),
    }
}

fn ns_list(d: &Dynamic) -> Vec<String> {
    match from_dyn(d) {
        Value::Array(items) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| i.to_string())
            })
            .collect(),
        Value::String(s) => s.split('.').map(str::to_string).collect(),
        _ => Vec::new(),
    }
}

fn build_engine(limits: ScriptLimits) -> Engine {
    let mut engine = Engine::new();
    engine.set_max_operations(limits.max_operations);
    engine.set_max_call_levels(64);
    engine.set_max_expr_depths(128, 64);
    engine.set_max_string_size(limits.max_size);
    engine.set_max_array_size(limits.max_size);
    engine.set_max_map_size(limits.max_size);
    engine.on_progress(|ops| {
        // Checked every 1024 operations: cheap, and bounds how long a runaway script lives.
        if ops % 1024 != 0 {
            return None;
        }
        HOST.with(|h| {
            h.borrow().as_ref().and_then(|host| {
                if host.run.cancel.is_cancelled() {
                    Some(Dynamic::from("cancelled"))
                } else if Instant::now() > host.deadline {
                    Some(Dynamic::from("timeout"))
                } else {
                    None
                }
            })
        })
    });
    engine.on_print(|_| {});
    engine.on_debug(|_, _, _| {});

    engine.register_fn("ai", |text: &str| to_dyn(&ai_message(text, vec![], None)));
    engine.register_fn("ai_tool_calls", |text: &str, calls: rhai::Array| {
        let calls: Vec<Value> = calls.iter().map(from_dyn).collect();
        let msg = coerce_message(&json!({"type": "ai", "content": text, "tool_calls": calls}))
            .unwrap_or(Value::Null);
        to_dyn(&msg)
    });
    engine.register_fn("human", |text: &str| {
        to_dyn(&coerce_message(&json!({"type": "human", "content": text})).unwrap_or(Value::Null))
    });
    engine.register_fn("system", |text: &str| {
        to_dyn(&coerce_message(&json!({"type": "system", "content": text})).unwrap_or(Value::Null))
    });
    engine.register_fn("tool_message", |content: Dynamic, id: &str, name: &str| {
        let content = match from_dyn(&content) {
            Value::String(s) => s,
            other => other.to_string(),
        };
        to_dyn(&tool_message(content, id, name, false))
    });
    engine.register_fn("text", |m: Dynamic| message_text(&from_dyn(&m)));
    engine.register_fn("send", |node: &str, arg: Dynamic| {
        to_dyn(&json!({"__send__": {"node": node, "arg": from_dyn(&arg)}}))
    });
    engine.register_fn("command", |update: Dynamic, goto: Dynamic| {
        to_dyn(&json!({"__command__": {"update": from_dyn(&update), "goto": from_dyn(&goto)}}))
    });
    engine.register_fn("command_parent", |update: Dynamic, goto: Dynamic| {
        to_dyn(&json!({"__command__": {"update": from_dyn(&update), "goto": from_dyn(&goto), "graph": "parent"}}))
    });
    engine.register_fn(
        "raise",
        |class: &str, message: &str| -> Result<Dynamic, Box<EvalAltResult>> {
            Err(raise_error(class, message))
        },
    );
    engine.register_fn(
        "interrupt",
        |value: Dynamic| -> Result<Dynamic, Box<EvalAltResult>> {
            with_host(|host| {
                let idx = host.counter.fetch_add(1, Ordering::SeqCst);
                if let Some(v) = host.resume.get(idx - host.resume_base) {
                    return Ok(to_dyn(v));
                }
                Err(throw_map(
                    "__interrupt__",
                    json!({"id": interrupt_id(&host.task_ns, idx), "value": from_dyn(&value)}),
                ))
            })
        },
    );
    engine.register_fn("emit", |value: Dynamic| -> Result<(), Box<EvalAltResult>> {
        with_host(|host| {
            let v = from_dyn(&value);
            if host.runtime.is_some() {
                host.run
                    .emit_blocking(&host.graph_ns, crate::stream::StreamMode::Custom, v);
            } else if host
                .run
                .wants(crate::stream::StreamMode::Custom, &host.graph_ns)
            {
                // Inline scripts cannot wait for a full sink; their events are sent, in
                // order, as soon as the script returns.
                if let Ok(mut held) = host.held_custom.lock() {
                    held.push(v);
                }
            }
            Ok(())
        })
    });
    engine.register_fn("sleep", |ms: i64| -> Result<(), Box<EvalAltResult>> {
        with_host(|host| {
            let d = Duration::from_millis(ms.max(0) as u64);
            let cancel = host.run.cancel.clone();
            let cancelled = block_on(host, async move {
                tokio::select! {
                    _ = cancel.cancelled() => true,
                    _ = tokio::time::sleep(d) => false,
                }
            })?;
            if cancelled {
                Err(throw_map("__cancelled__", Value::Null))
            } else {
                Ok(())
            }
        })
    });
    engine.register_fn(
        "store_get",
        |ns: Dynamic, key: &str| -> Result<Dynamic, Box<EvalAltResult>> {
            with_host(|host| {
                let store = host.run.store.clone().ok_or("no store is configured")?;
                let ns = ns_list(&ns);
                let v = block_on(host, async move { store.get(&ns, key).await })?;
                v.map(|v| to_dyn(&v.unwrap_or(Value::Null)))
                    .map_err(Into::into)
            })
        },
    );
    engine.register_fn(
        "store_put",
        |ns: Dynamic, key: &str, value: Dynamic| -> Result<(), Box<EvalAltResult>> {
            with_host(|host| {
                let store = host.run.store.clone().ok_or("no store is configured")?;
                let ns = ns_list(&ns);
                let v = from_dyn(&value);
                let v = if v.is_null() { None } else { Some(v) };
                block_on(host, async move { store.put(&ns, key, v).await })?.map_err(Into::into)
            })
        },
    );
    engine.register_fn(
        "store_search",
        |prefix: Dynamic, filter: Dynamic, limit: i64| -> Result<Dynamic, Box<EvalAltResult>> {
            with_host(|host| {
                let store = host.run.store.clone().ok_or("no store is configured")?;
                let prefix = ns_list(&prefix);
                let filter = from_dyn(&filter);
                let limit = limit.max(0) as usize;
                let items = block_on(host, async move {
                    store
                        .search(
                            &prefix,
                            if filter.is_null() {
                                None
                            } else {
                                Some(&filter)
                            },
                            limit,
                        )
                        .await
                })?;
                items.map(|i| to_dyn(&Value::Array(i))).map_err(Into::into)
            })
        },
    );
    register_calls(&mut engine);
    register_clock_and_json(&mut engine);
    engine
}

/// `call_model` and `call_tool`: made by the task (see [`TaskRequest`]).
fn register_calls(engine: &mut Engine) {
    fn call_model(
        name: &str,
        messages: Dynamic,
        options: Dynamic,
    ) -> Result<Dynamic, Box<EvalAltResult>> {
        with_host(|host| {
            let models = host
                .resources
                .models
                .clone()
                .ok_or("no models are declared")?;
            let model = models.get(name).ok_or_else(|| {
                format!(
                    "unknown model `{name}`; declared: {}",
                    models.names().join(", ")
                )
            })?;
            let messages = match from_dyn(&messages) {
                Value::Array(a) => a,
                other => vec![other],
            };
            let options = from_dyn(&options);
            let stream = options
                .get("stream")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let tools = match options.get("tools") {
                None | Some(Value::Null) => Vec::new(),
                Some(names) => tool_schemas(host, names)?,
            };
            let reply = ask_task(host, |answer| TaskRequest::Model {
                model,
                messages,
                tools,
                stream,
                answer,
            })?;
            Ok(to_dyn(&reply))
        })
    }
    engine.register_fn("call_model", |name: &str, messages: Dynamic| {
        call_model(name, messages, Dynamic::UNIT)
    });
    engine.register_fn("call_model", call_model);
    engine.register_fn(
        "call_tool",
        |name: &str, args: Dynamic| -> Result<Dynamic, Box<EvalAltResult>> {
            with_host(|host| {
                let tool = find_tool(host, name)?;
                let args = from_dyn(&args);
                let message = ask_task(host, |answer| TaskRequest::Tool { tool, args, answer })?;
                Ok(to_dyn(&message["content"]))
            })
        },
    );
}

fn find_tool(host: &Host, name: &str) -> Result<Arc<Tool>, Box<EvalAltResult>> {
    let tools = host
        .resources
        .tools
        .as_ref()
        .ok_or("call_tool is for node and route scripts; a tool cannot call another")?;
    tools.get(name).cloned().ok_or_else(|| {
        let mut known: Vec<&str> = tools.keys().map(String::as_str).collect();
        known.sort_unstable();
        format!("unknown tool `{name}`; declared: {}", known.join(", ")).into()
    })
}

/// The schemas of the tools `names` lists, offered to a model a script calls.
fn tool_schemas(host: &Host, names: &Value) -> Result<Vec<ToolSchema>, Box<EvalAltResult>> {
    let Value::Array(names) = names else {
        return Err("`tools` must be a list of tool names".into());
    };
    names
        .iter()
        .map(|n| {
            let name = n.as_str().ok_or("`tools` must be a list of tool names")?;
            Ok(find_tool(host, name)?.schema.clone())
        })
        .collect()
}

/// Hand a call to the task and wait for its answer; the call's failure becomes the script's
/// (a raised class stays catchable with `try`/`catch`).
fn ask_task(
    host: &Host,
    request: impl FnOnce(oneshot::Sender<Result<Value, NodeError>>) -> TaskRequest,
) -> Result<Value, Box<EvalAltResult>> {
    let requests = host
        .requests
        .as_ref()
        .ok_or("this function needs the script to run on a blocking thread")?;
    let (answer, answered) = oneshot::channel();
    requests
        .send(request(answer))
        .map_err(|_| "the task is gone")?;
    match answered.blocking_recv() {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(raised(e)),
        Err(_) => Err("the task is gone".into()),
    }
}

/// A node error raised inside a script, so that the script's own failure maps back to it.
fn raised(e: NodeError) -> Box<EvalAltResult> {
    match e {
        NodeError::Failed { class, message, .. } => raise_error(&class, &message),
        NodeError::Cancelled => throw_map("__cancelled__", Value::Null),
        NodeError::Interrupted(mut list) if list.len() == 1 => {
            let i = list.remove(0);
            throw_map("__interrupt__", json!({"id": i.id, "value": i.value}))
        }
        other => other.to_string().into(),
    }
}

/// `now()`, `now_ms()`, `to_json(value)`, `from_json(text)`.
fn register_clock_and_json(engine: &mut Engine) {
    engine.register_fn("now", || {
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    });
    engine.register_fn("now_ms", || chrono::Utc::now().timestamp_millis());
    engine.register_fn("to_json", |v: Dynamic| from_dyn(&v).to_string());
    engine.register_fn(
        "from_json",
        |text: &str| -> Result<Dynamic, Box<EvalAltResult>> {
            serde_json::from_str::<Value>(text)
                .map(|v| to_dyn(&v))
                .map_err(|e| format!("from_json: {e}").into())
        },
    );
}

/// A compiled script with the engine that runs it.
pub struct Script {
    engine: Arc<Engine>,
    ast: AST,
    needs_thread: bool,
    limits: ScriptLimits,
    resources: ScriptResources,
    origin: Option<ScriptOrigin>,
}

/// Where a script's text sits in its graph file, so that its errors can name the file's line
/// and column rather than the script's.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptOrigin {
    /// The graph file, as it was named when loaded.
    pub file: String,
    /// The file's line (1-based) that holds the script's first line.
    pub line: usize,
    /// The file's column (1-based) of the script's first character.
    pub column: usize,
    /// Columns before the text of each later line (a block scalar's indentation).
    pub indent: usize,
}

impl ScriptOrigin {
    /// `line L, column C of FILE` for a position in the script.
    fn describe(&self, line: usize, column: usize) -> String {
        let file_column = if line == 1 {
            self.column + column.saturating_sub(1)
        } else {
            self.indent + column
        };
        format!(
            "line {}, column {file_column} of {}",
            self.line + line - 1,
            self.file
        )
    }
}

/// Where in a script something happened, in the file's terms when `origin` is known, else in
/// the script's own (said so).
fn describe_position(origin: Option<&ScriptOrigin>, line: usize, column: usize) -> String {
    match origin {
        Some(o) => o.describe(line, column),
        None => format!("script line {line}, column {column}"),
    }
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script").finish_non_exhaustive()
    }
}

/// A syntax error: message and 1-based line and column within the script.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptSyntaxError {
    /// What is wrong.
    pub message: String,
    /// Line in the script, when known.
    pub line: Option<usize>,
    /// Column in that line, when known.
    pub column: Option<usize>,
}

impl ScriptSyntaxError {
    /// The error with where it is: in the file's terms when `origin` is known.
    pub fn describe(&self, origin: Option<&ScriptOrigin>) -> String {
        match (self.line, self.column) {
            (Some(l), Some(c)) => format!("{} ({})", self.message, describe_position(origin, l, c)),
            (Some(l), None) => format!("{} (script line {l})", self.message),
            _ => self.message.clone(),
        }
    }
}

impl Script {
    /// Compile source code. Fails with the line of the first syntax error.
    pub fn compile(
        source: &str,
        limits: ScriptLimits,
        resources: ScriptResources,
    ) -> Result<Script, ScriptSyntaxError> {
        let engine = build_engine(limits);
        let ast = engine.compile(source).map_err(|e| ScriptSyntaxError {
            message: e.0.to_string(),
            line: e.1.line(),
            column: e.1.position(),
        })?;
        let needs_thread = ["sleep", "store_", "call_model", "call_tool"]
            .iter()
            .any(|f| source.contains(f));
        Ok(Script {
            engine: Arc::new(engine),
            ast,
            needs_thread,
            limits,
            resources,
            origin: None,
        })
    }

    /// Tell the script where its text sits in its graph file, for its errors.
    pub fn with_origin(mut self, origin: Option<ScriptOrigin>) -> Script {
        self.origin = origin;
        self
    }

    /// Run with `vars` in scope and the task's context, returning the script's value as JSON.
    pub async fn eval(
        &self,
        vars: &[(&str, Value)],
        ctx: &TaskContext,
    ) -> Result<Value, NodeError> {
        self.eval_keeping(vars, None, ctx).await
    }

    /// Like [`Script::eval`], but a script that ends without a value (`()`) answers the
    /// variable `kept` as the script left it: `update.answer = text(reply);` changes `update`.
    pub async fn eval_keeping(
        &self,
        vars: &[(&str, Value)],
        kept: Option<&str>,
        ctx: &TaskContext,
    ) -> Result<Value, NodeError> {
        let start = ctx.interrupt_counter.load(Ordering::SeqCst);
        // Only a script on a blocking thread asks its task for calls; an inline one (the
        // common, fast case) has no channel to make.
        let (requests, asked) = match self.needs_thread {
            true => {
                let (tx, rx) = mpsc::unbounded_channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let host = Arc::new(Host {
            run: ctx.run.clone(),
            graph_ns: ctx.graph_ns.clone(),
            task_ns: ctx.task_checkpoint_ns(),
            resume: ctx
                .resume
                .get(start..)
                .map(<[Value]>::to_vec)
                .unwrap_or_default(),
            resume_base: start,
            counter: AtomicUsize::new(start),
            resources: self.resources.clone(),
            runtime: self.needs_thread.then(tokio::runtime::Handle::current),
            requests,
            deadline: Instant::now() + self.limits.max_duration,
            held_custom: Default::default(),
        });
        let mut scope = task_scope(ctx);
        for (name, v) in vars {
            scope.push(name.to_string(), to_dyn(v));
        }
        let kept = kept.map(str::to_string);
        let result = if let Some(mut asked) = asked {
            let engine = self.engine.clone();
            let ast = self.ast.clone();
            let h2 = host.clone();
            let mut job = tokio::task::spawn_blocking(move || {
                HOST.with(|slot| *slot.borrow_mut() = Some(h2));
                let r = run_ast(&engine, &mut scope, &ast, kept.as_deref());
                HOST.with(|slot| *slot.borrow_mut() = None);
                r
            });
            // Serve the script's calls until it returns.
            let joined = loop {
                tokio::select! {
                    joined = &mut job => break joined,
                    Some(request) = asked.recv() => request.serve(ctx).await,
                }
            };
            joined
                .map_err(|e| NodeError::new("ScriptError", format!("script thread failed: {e}")))?
        } else {
            HOST.with(|slot| *slot.borrow_mut() = Some(host.clone()));
            let r = run_ast(&self.engine, &mut scope, &self.ast, kept.as_deref());
            HOST.with(|slot| *slot.borrow_mut() = None);
            r
        };
        ctx.interrupt_counter
            .store(host.counter.load(Ordering::SeqCst), Ordering::SeqCst);
        let held = host
            .held_custom
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default();
        for v in held {
            ctx.write_custom(v).await;
        }
        result.map_err(|e| self.node_error(e))
    }

    /// Run without a task (custom reducers): host functions that need a run fail.
    pub(crate) fn eval_detached(&self, vars: &[(&str, Value)]) -> Result<Dynamic, String> {
        let mut scope = Scope::new();
        for (name, v) in vars {
            scope.push(name.to_string(), to_dyn(v));
        }
        self.engine
            .eval_ast_with_scope::<Dynamic>(&mut scope, &self.ast)
            .map_err(|e| self.located(e.to_string(), &e))
    }

    /// A script's failure as the node's error: raised classes, interrupts and cancels as
    /// they are, anything else a `ScriptError` that says where it happened.
    fn node_error(&self, e: EvalAltResult) -> NodeError {
        match e {
            EvalAltResult::ErrorRuntime(ref d, _) => {
                let v = from_dyn(d);
                if v.get(RAISED).is_some() {
                    let message = v["message"].as_str().unwrap_or_default().to_string();
                    return self.failure(v["error"].as_str().unwrap_or("Error"), message, &e);
                }
                if let Some(i) = v.get("__interrupt__") {
                    return NodeError::Interrupted(vec![Interrupt {
                        id: i["id"].as_str().unwrap_or_default().to_string(),
                        value: i["value"].clone(),
                    }]);
                }
                if v.get("__cancelled__").is_some() {
                    return NodeError::Cancelled;
                }
                let msg = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                self.failure("ScriptError", msg, &e)
            }
            EvalAltResult::ErrorTerminated(reason, _) => {
                if reason.to_string().contains("cancelled") {
                    NodeError::Cancelled
                } else {
                    NodeError::new("TimeoutError", "the script ran past its time limit")
                }
            }
            EvalAltResult::ErrorTooManyOperations(_) => {
                NodeError::new("ScriptError", "the script ran past its operation limit")
            }
            other => self.failure("ScriptError", other.to_string(), &other),
        }
    }

    /// `message` preceded by where `e` happened (for errors that are only text: a route's).
    fn located(&self, message: String, e: &EvalAltResult) -> String {
        let message = self.cleaned(message, e);
        match self.position(e) {
            Some(place) => format!("{place}: {message}"),
            None => message,
        }
    }

    /// A node's failure: `class` and `message` as clients read them, where it happened beside.
    fn failure(&self, class: &str, message: String, e: &EvalAltResult) -> NodeError {
        NodeError::Failed {
            class: class.to_string(),
            message: self.cleaned(message, e),
            location: self.position(e),
        }
    }

    /// `message` without Rhai's own position, and followed by a hint when the error is a key
    /// never written read as `()`.
    fn cleaned(&self, message: String, e: &EvalAltResult) -> String {
        // Rhai's own text ends with ` (line L, position C)`, which would contradict a file line.
        let message = match message.rfind(" (line ") {
            Some(i) if message.ends_with(')') => message[..i].to_string(),
            _ => message,
        };
        match unit_hint(e) {
            Some(hint) => format!("{message}. {hint}"),
            None => message,
        }
    }

    /// Where `e` happened, in the graph file's terms when known.
    fn position(&self, e: &EvalAltResult) -> Option<String> {
        let pos = e.position();
        pos.line()
            .map(|l| describe_position(self.origin.as_ref(), l, pos.position().unwrap_or(1)))
    }
}

/// `START` and `END` as script strings, made once (a clone shares them).
static NODE_NAMES: std::sync::LazyLock<(rhai::ImmutableString, rhai::ImmutableString)> =
    std::sync::LazyLock::new(|| (crate::graph::START.into(), crate::graph::END.into()));

/// The scope every task's script starts with: the run's `config` and `context`, node names
/// `START` and `END`, and the steps left.
fn task_scope(ctx: &TaskContext) -> Scope<'static> {
    let mut scope = Scope::new();
    scope.push_constant("config", to_dyn(&ctx.run.config));
    scope.push_constant("context", to_dyn(&ctx.run.context));
    let (start, end) = &*NODE_NAMES;
    scope.push_constant("START", start.clone());
    scope.push_constant("END", end.clone());
    let remaining = ctx.remaining_steps.min(i64::MAX as usize) as i64;
    scope.push_constant("remaining_steps", remaining);
    scope.push_constant("is_last_step", remaining <= 1);
    scope
}

/// Evaluate, answering the variable `kept` when the script ends without a value.
fn run_ast(
    engine: &Engine,
    scope: &mut Scope<'static>,
    ast: &AST,
    kept: Option<&str>,
) -> Result<Value, EvalAltResult> {
    let d = engine
        .eval_ast_with_scope::<Dynamic>(scope, ast)
        .map_err(|e| *e)?;
    match kept {
        Some(name) if d.is_unit() => Ok(scope
            .get_value::<Dynamic>(name)
            .map(|v| from_dyn(&v))
            .unwrap_or(Value::Null)),
        _ => Ok(from_dyn(&d)),
    }
}

/// Said when a script fails on Rhai's unit `()`, which is what a state key that was never
/// written reads as: only errors whose text shows `()` as an operand or the type used.
fn unit_hint(e: &EvalAltResult) -> Option<&'static str> {
    let unit_operand = |s: &str| {
        ["(())", "((),", ", ())", "'()'", "type ()"]
            .iter()
            .any(|p| s.contains(p))
    };
    let recognised = match e {
        EvalAltResult::ErrorFunctionNotFound(sig, _) => unit_operand(sig),
        EvalAltResult::ErrorDotExpr(..)
        | EvalAltResult::ErrorIndexingType(..)
        | EvalAltResult::ErrorPropertyNotFound(..)
        | EvalAltResult::ErrorMismatchDataType(..) => unit_operand(&e.to_string()),
        EvalAltResult::ErrorInFunctionCall(_, _, inner, _) => return unit_hint(inner),
        _ => false,
    };
    recognised.then_some(
        "Hint: a state key that was never written reads as Rhai's unit `()`; \
         give it a default under `state:` or check `state.key != ()` first",
    )
}

/// Read a script's result as a node result: `()` is no update, a map is an update, and
/// `command(update, goto)` is a Command.
pub fn to_command(v: Value) -> Result<Command, NodeError> {
    match v {
        Value::Null => Ok(Command::none()),
        Value::Object(mut o) => {
            if let Some(Value::Object(mut c)) = o.remove("__command__") {
                let mut cmd = Command::update(c.remove("update").unwrap_or(Value::Null));
                if c.get("graph").and_then(Value::as_str) == Some("parent") {
                    cmd.graph = CommandGraph::Parent;
                }
                cmd.goto = to_gotos(c.remove("goto").unwrap_or(Value::Null))?;
                Ok(cmd)
            } else {
                Ok(Command::update(Value::Object(o)))
            }
        }
        Value::Array(_) => Ok(Command::update(v)),
        other => Err(NodeError::invalid_update(format!(
            "Expected dict, got {other}"
        ))),
    }
}

/// Read a route result: a name, a `send(...)`, or a list of them.
pub fn to_gotos(v: Value) -> Result<Vec<Goto>, NodeError> {
    let items = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => vec![other],
    };
    items
        .iter()
        .map(|i| Goto::from_value(i).map_err(|e| NodeError::new("InvalidUpdateError", e)))
        .collect()
}
