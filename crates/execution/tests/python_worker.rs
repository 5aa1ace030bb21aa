//! Worker processes against the REAL Python worker (`python/spindle-worker`): interpreter
//! checks, spawn and `init`, `ping`, a run end to end with checkpoints kept by a Rust handler,
//! and the worker's death.
//!
//! They need a Python with `langgraph` and `spindle_worker`, named by `SPINDLE_TEST_PYTHON`
//! (`scripts/test` makes `python/spindle-worker/.venv` and sets it). Without it each test
//! says it is skipped and passes, unless `SPINDLE_TEST_REQUIRE_PYTHON` is set (as in CI).
//! The graphs are the reference's, in `../shared/ref` beside the checkout.
#![cfg(unix)]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rmpv::Value;
use spindle_execution::python::interpreter::{
    check_interpreter, Interpreter, InterpreterError, Source,
};
use spindle_execution::python::process::{GraphKind, WorkerError};
use spindle_execution::python::{RemoteError, Reply, WorkerCalls, WorkerProcess, WorkerSpec};
use tokio::sync::watch;

use common::test_python;

const WAIT: Duration = Duration::from_secs(60);

/// `../shared/ref` beside the checkout: the reference graphs and their `langgraph.json`.
fn ref_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/ref");
    dir.canonicalize()
        .unwrap_or_else(|e| panic!("the reference graphs are not at {}: {e}", dir.display()))
}

fn ref_graphs() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(ref_dir().join("langgraph.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(json["graphs"].clone()).unwrap()
}

fn spawn(python: &Path, spindle: Arc<TestSpindle>) -> WorkerProcess {
    let spec = WorkerSpec {
        name: "python-test".into(),
        python: python.to_owned(),
        project_dir: ref_dir(),
        env: BTreeMap::from([("SPINDLE_WORKER_LOG".into(), "INFO".into())]),
        max_runs: 4,
    };
    WorkerProcess::spawn(spec, spindle).expect("the worker starts")
}

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} took over {WAIT:?}"))
}

fn setting(program: &Path) -> Interpreter {
    Interpreter {
        program: program.to_owned(),
        source: Source::Setting,
    }
}

/// A venv of the test Python with nothing installed in it.
fn bare_venv(python: &Path, dir: &Path) -> PathBuf {
    let status = std::process::Command::new(python)
        .args(["-m", "venv", "--without-pip"])
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "cannot make a venv in {}", dir.display());
    dir.join("bin/python")
}

// -- interpreter checks --------------------------------------------------------------------

#[tokio::test]
async fn a_missing_interpreter_is_reported() {
    let got = check_interpreter(
        &setting(Path::new("/nonexistent/bin/python")),
        &ref_dir(),
        &BTreeMap::new(),
    )
    .await;
    let err = got.unwrap_err();
    assert!(matches!(err, InterpreterError::NotFound { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("/nonexistent/bin/python") && text.contains("--python"),
        "{text}"
    );
}

#[tokio::test]
async fn something_that_is_not_python_is_reported() {
    let got = check_interpreter(
        &setting(Path::new("/bin/false")),
        &ref_dir(),
        &BTreeMap::new(),
    )
    .await;
    assert!(
        matches!(got, Err(InterpreterError::NotPython { .. })),
        "{got:?}"
    );
}

#[tokio::test]
async fn the_worker_venv_passes_the_check() {
    let Some(python) = test_python("the worker venv passes the check") else {
        return;
    };
    let info = check_interpreter(&setting(&python), &ref_dir(), &BTreeMap::new())
        .await
        .unwrap();
    assert!(info.python.starts_with("3."), "{info:?}");
    assert!(!info.langgraph.is_empty(), "{info:?}");
}

#[tokio::test]
async fn a_python_without_langgraph_says_to_install_it() {
    let Some(python) = test_python("a Python without langgraph") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bare = bare_venv(&python, dir.path());
    let err = check_interpreter(&setting(&bare), &ref_dir(), &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, InterpreterError::LangGraphMissing { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("-m pip install langgraph"),
        "{err}"
    );
}

#[tokio::test]
async fn a_python_without_the_worker_package_says_to_install_it() {
    let Some(python) = test_python("a Python without spindle_worker") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bare = bare_venv(&python, dir.path());
    // langgraph visible through PYTHONPATH (the test venv's site-packages); an editable
    // install of spindle_worker is not, since PYTHONPATH entries do not run `.pth` files.
    let site = std::process::Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    let site = String::from_utf8(site.stdout).unwrap().trim().to_owned();
    if Path::new(&site).join("spindle_worker").exists() {
        eprintln!("*** SKIPPED: spindle_worker is installed in {site} itself (not editable) ***");
        return;
    }
    let env = BTreeMap::from([("PYTHONPATH".to_owned(), site)]);
    let err = check_interpreter(&setting(&bare), &ref_dir(), &env)
        .await
        .unwrap_err();
    assert!(
        matches!(err, InterpreterError::WorkerMissing { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("python/spindle-worker"), "{err}");
}

// -- the worker process --------------------------------------------------------------------

#[tokio::test]
async fn init_loads_the_reference_graphs() {
    let Some(python) = test_python("init loads the reference graphs") else {
        return;
    };
    let worker = spawn(&python, TestSpindle::new());
    let report = within("init", worker.init(&ref_graphs())).await.unwrap();
    assert_eq!(report.graphs.len(), 8, "{report:?}");
    for (id, load) in &report.graphs {
        assert!(load.ok, "{id}: {load:?}");
        assert_eq!(load.kind, Some(GraphKind::Compiled), "{id}");
    }
    assert!(report.python.starts_with("3.") && !report.langgraph.is_empty());
    within("shutdown", worker.shutdown(Duration::from_secs(10))).await;
}

#[tokio::test]
async fn a_broken_graph_reports_its_error_while_the_others_load() {
    let Some(python) = test_python("a broken graph") else {
        return;
    };
    let worker = spawn(&python, TestSpindle::new());
    let mut graphs = ref_graphs();
    graphs.insert(
        "no_such_var".into(),
        "./graphs/ref_graphs.py:no_such_graph".into(),
    );
    graphs.insert(
        "no_such_module".into(),
        "no_such_package.graphs:graph".into(),
    );
    let report = within("init", worker.init(&graphs)).await.unwrap();
    assert_eq!(report.graphs.values().filter(|g| g.ok).count(), 8);
    for id in ["no_such_var", "no_such_module"] {
        let load = &report.graphs[id];
        assert!(!load.ok, "{id}: {load:?}");
        assert!(
            load.error.as_deref().is_some_and(|e| !e.is_empty()),
            "{id}: {load:?}"
        );
        assert!(
            load.traceback
                .as_deref()
                .is_some_and(|t| t.contains("Traceback")),
            "{id}: {load:?}"
        );
    }
    assert!(report.graphs["no_such_module"]
        .error
        .as_deref()
        .unwrap()
        .contains("ModuleNotFoundError"));
}

#[tokio::test]
async fn ping_reports_health() {
    let Some(python) = test_python("ping") else {
        return;
    };
    let worker = spawn(&python, TestSpindle::new());
    let health = within("ping", worker.ping()).await.unwrap();
    assert_eq!(health.active_runs, 0);
    assert!(health.rss_bytes > 1_000_000, "{health:?}");
    assert!(health.loop_lag_ms >= 0.0);
}

#[tokio::test]
async fn a_run_of_chain_end_to_end_with_checkpoints_kept_in_rust() {
    let Some(python) = test_python("a run of chain end to end") else {
        return;
    };
    let spindle = TestSpindle::new();
    let worker = spawn(&python, spindle.clone());
    within("init", worker.init(&ref_graphs())).await.unwrap();
    let thread = "thread-chain-1";
    let run_id = "run-chain-1";
    let body = run_start(run_id, "chain", thread, serde_json::json!({"n": 0}));
    let accepted: Value = within("run.start", worker.call("run.start", &body))
        .await
        .unwrap();
    assert_eq!(accepted, Value::Nil);

    let done = within("run.done", spindle.wait_done()).await;
    assert_eq!(str_field(&done, "status"), Some("success"), "{done}");
    let final_json: serde_json::Value =
        serde_json::from_slice(bin_field(&done, "final").unwrap()).unwrap();
    assert_eq!(final_json["values"], serde_json::json!({"n": 3}));
    assert_eq!(final_json["next"], serde_json::json!([]));

    {
        let memory = spindle.memory.lock().unwrap();
        assert_eq!(memory.violations, Vec::<String>::new());
        let names: Vec<&str> = memory
            .events
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        assert!(
            names.contains(&"values") && names.contains(&"checkpoints"),
            "{names:?}"
        );
        let last_values = memory
            .events
            .iter()
            .rev()
            .find(|(name, _)| name == "values")
            .unwrap();
        let last_values: serde_json::Value = serde_json::from_slice(&last_values.1).unwrap();
        assert_eq!(last_values, serde_json::json!({"n": 3}));
        // Every step was saved, each save after the events produced before it.
        let puts: Vec<usize> = memory
            .saves
            .iter()
            .filter(|s| s.0 == "cp.put")
            .map(|s| s.1)
            .collect();
        assert!(puts.len() >= 4, "input + 3 steps: {:?}", memory.saves);
        assert!(puts.windows(2).all(|w| w[0] <= w[1]), "{puts:?}");
        assert!(
            puts[1..].iter().all(|&n| n > 0),
            "later saves come after events: {puts:?}"
        );
    }

    // The state the worker reads back through cp.get is the one the handler kept.
    let state_get = serde_json::json!({
        "graph_id": "chain",
        "config": {"configurable": {"thread_id": thread}},
        "subgraphs": false,
    });
    let state: Value = within("state.get", worker.call("state.get", &state_get))
        .await
        .unwrap();
    let state: serde_json::Value = serde_json::from_slice(state.as_slice().unwrap()).unwrap();
    assert_eq!(state["values"], serde_json::json!({"n": 3}), "{state}");
    within("shutdown", worker.shutdown(Duration::from_secs(10))).await;
}

#[tokio::test]
async fn a_killed_worker_is_noticed_and_pending_requests_fail() {
    let Some(python) = test_python("a killed worker") else {
        return;
    };
    let worker = spawn(&python, TestSpindle::new());
    within("ping", worker.ping()).await.unwrap();
    let pid = worker.pid().unwrap().to_string();
    // Stopped, it cannot answer: the ping stays pending until the kill.
    signal("-STOP", &pid);
    let pending = worker.ping();
    tokio::pin!(pending);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut pending)
            .await
            .is_err()
    );
    signal("-KILL", &pid);
    let err = within("the pending ping", pending).await.unwrap_err();
    let WorkerError::Exited { exit, .. } = &err else {
        panic!("{err}")
    };
    assert!(!exit.killed, "killed from outside, not by Spindle: {exit}");
    let ended = within("the exit", worker.exited()).await;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(ended.status.and_then(|s| s.signal()), Some(9), "{ended}");
    assert!(worker.connection().is_closed());
    assert!(worker.ping().await.is_err());
}

#[tokio::test]
async fn a_closed_socket_makes_the_worker_exit_and_drop_kills_it() {
    let Some(python) = test_python("worker exit") else {
        return;
    };
    let worker = spawn(&python, TestSpindle::new());
    within("ping", worker.ping()).await.unwrap();
    let exit = within("shutdown", worker.shutdown(Duration::from_secs(15))).await;
    assert!(!exit.killed, "the worker exits by itself on EOF: {exit}");
    assert_eq!(exit.status.and_then(|s| s.code()), Some(0), "{exit}");

    let worker = spawn(&python, TestSpindle::new());
    within("ping", worker.ping()).await.unwrap();
    let pid = worker.pid().unwrap();
    let exit = worker.exit();
    drop(worker);
    let mut exit = exit;
    let ended = within("the kill", exit.wait_for(Option::is_some))
        .await
        .unwrap()
        .clone();
    let ended = ended.unwrap();
    assert!(ended.killed, "{ended}");
    assert!(!Path::new(&format!("/proc/{pid}")).exists() || !alive(pid));
}

#[tokio::test]
async fn a_worker_that_cannot_start_explains_its_exit() {
    let Some(python) = test_python("a worker that cannot start") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bare = bare_venv(&python, dir.path());
    let worker = spawn(&bare, TestSpindle::new());
    let err = within("init", worker.init(&ref_graphs()))
        .await
        .unwrap_err();
    let WorkerError::Exited { exit, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(exit.status.and_then(|s| s.code()), Some(1), "{exit}");
    assert!(
        err.to_string().contains("No module named spindle_worker"),
        "{err}"
    );
}

fn signal(sig: &str, pid: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

fn alive(pid: u32) -> bool {
    // A zombie is not alive; the monitor reaps, so the entry goes soon after.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// `run.start` as Spindle sends it (`fake_spindle.run_config`).
fn run_start(
    run_id: &str,
    graph_id: &str,
    thread: &str,
    input: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "run": [run_id, 1],
        "graph_id": graph_id,
        "input": input,
        "config": {
            "configurable": {
                "thread_id": thread,
                "run_id": run_id,
                "graph_id": graph_id,
                "assistant_id": format!("assistant-{graph_id}"),
            },
            "metadata": {"graph_id": graph_id, "run_attempt": 1},
            "recursion_limit": 25,
            "run_id": run_id,
        },
        "context": null,
        "stream_mode": ["values", "updates", "checkpoints", "debug"],
        "subgraphs": false,
        "checkpointer": true,
    })
}

// -- a minimal Spindle: checkpoints in memory, values opaque ---------------------------------

/// What Spindle keeps for these tests: checkpoints, blobs and writes as they came (values
/// never decoded), each save with the count of events received before it, and the ordering
/// rule checked as `fake_spindle.py` checks it.
struct TestSpindle {
    memory: Mutex<Memory>,
    done: watch::Sender<Option<Value>>,
}

#[derive(Default)]
struct Memory {
    /// (thread, ns) -> checkpoint id -> saved
    checkpoints: BTreeMap<(String, String), BTreeMap<String, Saved>>,
    /// (thread, ns, channel, version) -> (type, bytes)
    blobs: HashMap<(String, String, String, u64), (Value, Value)>,
    /// (thread, ns, checkpoint id) -> (task_path, task_id, idx) -> [task_id, channel, type, bytes]
    writes: HashMap<(String, String, String), TaskWrites>,
    events: Vec<(String, Vec<u8>)>,
    /// (op, events received before it)
    saves: Vec<(String, usize)>,
    built_on: HashSet<String>,
    violations: Vec<String>,
}

/// (task_path, task_id, idx) -> [task_id, channel, type, bytes], in LangGraph's order.
type TaskWrites = BTreeMap<(String, String, i64), Value>;

struct Saved {
    checkpoint: Value,
    metadata: Value,
    parent: Option<String>,
}

impl TestSpindle {
    fn new() -> Arc<TestSpindle> {
        Arc::new(TestSpindle {
            memory: Mutex::default(),
            done: watch::channel(None).0,
        })
    }

    async fn wait_done(&self) -> Value {
        let mut done = self.done.subscribe();
        let body = done.wait_for(Option::is_some).await.unwrap().clone();
        body.unwrap()
    }
}

impl WorkerCalls for TestSpindle {
    fn request(&self, op: &str, body: Value) -> Reply {
        // Answered here, on the reader task, so each save is counted after exactly the
        // events that arrived before it.
        let answer = self.answer(op, &body);
        Box::pin(async move { answer })
    }

    fn event(&self, op: &str, body: Value) -> Option<BoxFuture<'static, ()>> {
        let mut memory = self.memory.lock().unwrap();
        match op {
            "run.events" => {
                for event in field(&body, "events")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let pair = event.as_array().unwrap();
                    let name = pair[0].as_str().unwrap().to_owned();
                    let Value::Binary(data) = &pair[1] else {
                        memory
                            .violations
                            .push(format!("{name}: its payload is not bin"));
                        continue;
                    };
                    memory.check_not_after_save(&name, data);
                    memory.events.push((name, data.clone()));
                }
            }
            "run.done" => {
                self.done.send_replace(Some(body));
            }
            other => memory.violations.push(format!("unknown event {other}")),
        }
        None
    }
}

impl TestSpindle {
    fn answer(&self, op: &str, body: &Value) -> Result<Value, RemoteError> {
        let mut memory = self.memory.lock().unwrap();
        if matches!(op, "cp.put" | "cp.writes") {
            let count = memory.events.len();
            memory.saves.push((op.to_owned(), count));
            if let Some(base) = field(body, "config").and_then(|c| str_field(c, "checkpoint_id")) {
                memory.built_on.insert(base.to_owned());
            }
        }
        match op {
            "cp.get" => Ok(memory.get(body)),
            "cp.list" => Ok(memory.list(body)),
            "cp.put" => memory.put(body),
            "cp.writes" => memory.put_writes(body),
            "store.batch" => Ok(store_batch(body)),
            other => Err(RemoteError::bad_request(format!(
                "unknown operation {other}"
            ))),
        }
    }
}

impl Memory {
    fn check_not_after_save(&mut self, name: &str, data: &[u8]) {
        let mode = name.split('|').next().unwrap_or_default();
        if !matches!(mode, "checkpoints" | "debug") {
            return;
        }
        let mut payload: serde_json::Value = serde_json::from_slice(data).unwrap();
        if mode == "debug" {
            if payload["type"] != "checkpoint" {
                return;
            }
            payload = payload["payload"].take();
        }
        if let Some(id) = payload["config"]["configurable"]["checkpoint_id"].as_str() {
            if self.built_on.contains(id) {
                self.violations.push(format!(
                    "{name} event for checkpoint {id} arrived after a save built on it"
                ));
            }
        }
    }

    fn get(&self, body: &Value) -> Value {
        let config = field(body, "config").unwrap();
        let (thread, ns) = thread_ns(config);
        let Some(saved) = self.checkpoints.get(&(thread.clone(), ns.clone())) else {
            return Value::Nil;
        };
        let id = match str_field(config, "checkpoint_id") {
            Some(id) => Some(id.to_owned()),
            None => saved.keys().next_back().cloned(),
        };
        match id {
            Some(id) if saved.contains_key(&id) => self.tuple(&thread, &ns, &id),
            _ => Value::Nil,
        }
    }

    fn list(&self, body: &Value) -> Value {
        let config = field(body, "config").unwrap_or(&Value::Nil);
        let thread = str_field(config, "thread_id").unwrap_or_default();
        let ns = str_field(config, "checkpoint_ns");
        let only = str_field(config, "checkpoint_id");
        let before = str_field(body, "before");
        let limit = field(body, "limit")
            .and_then(Value::as_u64)
            .map(|l| l as usize);
        let filter = field(body, "filter")
            .and_then(Value::as_map)
            .cloned()
            .unwrap_or_default();
        let mut found: Vec<(String, String, String)> = vec![];
        for ((t, n), saved) in &self.checkpoints {
            if t != thread || ns.is_some_and(|ns| ns != n) {
                continue;
            }
            for (id, s) in saved {
                let matches = filter
                    .iter()
                    .all(|(k, v)| k.as_str().and_then(|k| field(&s.metadata, k)) == Some(v));
                if only.is_some_and(|o| o != id)
                    || before.is_some_and(|b| id.as_str() >= b)
                    || !matches
                {
                    continue;
                }
                found.push((t.clone(), n.clone(), id.clone()));
            }
        }
        found.sort_by(|a, b| b.2.cmp(&a.2));
        found.truncate(limit.unwrap_or(usize::MAX));
        Value::Array(
            found
                .iter()
                .map(|(t, n, id)| self.tuple(t, n, id))
                .collect(),
        )
    }

    fn tuple(&self, thread: &str, ns: &str, id: &str) -> Value {
        let saved = &self.checkpoints[&(thread.to_owned(), ns.to_owned())][id];
        let versions = field(&saved.checkpoint, "channel_versions")
            .and_then(Value::as_map)
            .cloned()
            .unwrap_or_default();
        let blobs = versions
            .iter()
            .filter_map(|(channel, version)| {
                let key = (
                    thread.to_owned(),
                    ns.to_owned(),
                    channel.as_str()?.to_owned(),
                    version.as_u64()?,
                );
                let (kind, bytes) = self.blobs.get(&key)?;
                Some(Value::Array(vec![
                    channel.clone(),
                    version.clone(),
                    kind.clone(),
                    bytes.clone(),
                ]))
            })
            .collect();
        let writes = self
            .writes
            .get(&(thread.to_owned(), ns.to_owned(), id.to_owned()))
            .map(|w| w.values().cloned().collect())
            .unwrap_or_default();
        let config = |id: &str| {
            map(&[
                ("thread_id", thread.into()),
                ("checkpoint_ns", ns.into()),
                ("checkpoint_id", id.into()),
            ])
        };
        map(&[
            ("config", config(id)),
            ("checkpoint", saved.checkpoint.clone()),
            ("metadata", saved.metadata.clone()),
            (
                "parent_config",
                saved.parent.as_deref().map(config).unwrap_or(Value::Nil),
            ),
            ("channel_values", Value::Array(blobs)),
            ("pending_writes", Value::Array(writes)),
        ])
    }

    fn put(&mut self, body: &Value) -> Result<Value, RemoteError> {
        let config = field(body, "config").ok_or_else(|| RemoteError::bad_request("no config"))?;
        let (thread, ns) = thread_ns(config);
        let checkpoint = field(body, "checkpoint").cloned().unwrap_or(Value::Nil);
        let id = str_field(&checkpoint, "id")
            .ok_or_else(|| RemoteError::bad_request("no id"))?
            .to_owned();
        if field(&checkpoint, "channel_values").is_some() {
            self.violations
                .push("a checkpoint travelled with its values".into());
        }
        for blob in field(body, "blobs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let [channel, version, kind, bytes] = blob.as_array().unwrap().as_slice() else {
                return Err(RemoteError::bad_request(format!("bad blob {blob}")));
            };
            let Some(version) = version.as_u64() else {
                self.violations
                    .push(format!("version {version} is not an integer"));
                continue;
            };
            let key = (
                thread.clone(),
                ns.clone(),
                channel.as_str().unwrap().to_owned(),
                version,
            );
            self.blobs.insert(key, (kind.clone(), bytes.clone()));
        }
        let saved = Saved {
            checkpoint,
            metadata: field(body, "metadata").cloned().unwrap_or(Value::Nil),
            parent: str_field(config, "checkpoint_id").map(str::to_owned),
        };
        self.checkpoints
            .entry((thread.clone(), ns.clone()))
            .or_default()
            .insert(id.clone(), saved);
        Ok(map(&[(
            "config",
            map(&[
                ("thread_id", thread.into()),
                ("checkpoint_ns", ns.into()),
                ("checkpoint_id", id.into()),
            ]),
        )]))
    }

    fn put_writes(&mut self, body: &Value) -> Result<Value, RemoteError> {
        let config = field(body, "config").ok_or_else(|| RemoteError::bad_request("no config"))?;
        let (thread, ns) = thread_ns(config);
        let id = str_field(config, "checkpoint_id")
            .unwrap_or_default()
            .to_owned();
        let task_id = str_field(body, "task_id").unwrap_or_default().to_owned();
        let task_path = str_field(body, "task_path").unwrap_or_default().to_owned();
        let stored = self.writes.entry((thread, ns, id)).or_default();
        for (pos, write) in field(body, "writes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let [channel, kind, bytes] = write.as_array().unwrap().as_slice() else {
                return Err(RemoteError::bad_request(format!("bad write {write}")));
            };
            let idx = match channel.as_str() {
                Some("__error__") => -1,
                Some("__scheduled__") => -2,
                Some("__interrupt__") => -3,
                Some("__resume__") => -4,
                _ => pos as i64,
            };
            let key = (task_path.clone(), task_id.clone(), idx);
            if idx >= 0 && stored.contains_key(&key) {
                continue; // a retried task's first writes win
            }
            let row = Value::Array(vec![
                task_id.as_str().into(),
                channel.clone(),
                kind.clone(),
                bytes.clone(),
            ]);
            stored.insert(key, row);
        }
        Ok(Value::Nil)
    }
}

/// The store, minimally: nothing is kept, so gets find nothing and searches are empty.
fn store_batch(body: &Value) -> Value {
    let ops = field(body, "ops")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let result = |op: &Value| {
        let kind = op
            .as_map()
            .and_then(|m| m.first())
            .and_then(|(k, _)| k.as_str());
        match kind {
            Some("search" | "list_namespaces") => Value::Array(vec![]),
            _ => Value::Nil,
        }
    };
    Value::Array(ops.iter().map(result).collect())
}

fn field<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value
        .as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    field(value, key).and_then(Value::as_str)
}

fn bin_field<'a>(value: &'a Value, key: &str) -> Option<&'a [u8]> {
    field(value, key).and_then(Value::as_slice)
}

fn thread_ns(config: &Value) -> (String, String) {
    (
        str_field(config, "thread_id")
            .unwrap_or_default()
            .to_owned(),
        str_field(config, "checkpoint_ns")
            .unwrap_or_default()
            .to_owned(),
    )
}

fn map(entries: &[(&str, Value)]) -> Value {
    Value::Map(
        entries
            .iter()
            .map(|(k, v)| (Value::from(*k), v.clone()))
            .collect(),
    )
}
