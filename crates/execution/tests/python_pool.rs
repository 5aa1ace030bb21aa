//! The pool of REAL Python workers (`python/spindle-worker`): a worker whose event loop is
//! blocked gets no new runs until it answers again, workers are recycled after a number of
//! runs, and a call for a run attempt that is not executing is fenced.
//!
//! They need a Python with `langgraph` and `spindle_worker`, named by `SPINDLE_TEST_PYTHON`
//! (`scripts/test` makes `python/spindle-worker/.venv` and sets it). Without it each test
//! says it is skipped and passes, unless `SPINDLE_TEST_REQUIRE_PYTHON` is set (as in CI).
#![cfg(unix)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use spindle_execution::python::calls::SpindleCalls;
use spindle_execution::python::executor::{self, PythonEnd, RunRoute, StartRun};
use spindle_execution::python::pool::{PoolSettings, PythonPool};
use spindle_execution::python::{ErrorCode, WorkerCalls};
use spindle_execution::StoreConfig;
use spindle_graph::EventSink;
use spindle_storage::{Scope, Storage};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use common::test_python;

/// A node that blocks the worker's event loop for `n` seconds (what a careless `time.sleep`
/// in an async node does), and a quick one.
const GRAPHS: &str = r#"
import time
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class S(TypedDict):
    n: float


async def block(state: S):
    time.sleep(state["n"])
    return {"n": 0}


async def inc(state: S):
    return {"n": state["n"] + 1}


blocker = StateGraph(S).add_node("block", block).add_edge(START, "block").add_edge("block", END).compile()
quick = StateGraph(S).add_node("inc", inc).add_edge(START, "inc").add_edge("inc", END).compile()
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    storage: Arc<dyn Storage>,
    pool: Arc<PythonPool>,
    shutdown: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn pool(python: &Path, tune: impl FnOnce(&mut PoolSettings)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("graphs.py"), GRAPHS).unwrap();
    let db = dir.path().join("spindle.db");
    let storage = spindle_storage::connect(db.to_str().unwrap())
        .await
        .unwrap();
    let mut settings = PoolSettings {
        python: python.to_owned(),
        project_dir: dir.path().to_owned(),
        env: BTreeMap::new(),
        graphs: BTreeMap::from([
            ("blocker".into(), "./graphs.py:blocker".into()),
            ("quick".into(), "./graphs.py:quick".into()),
        ]),
        auth: None,
        workers: 1,
        runs_per_worker: 10,
        recycle_after_runs: None,
        max_rss_bytes: None,
        ping_every: PoolSettings::PING_EVERY,
        missed_pings: PoolSettings::MISSED_PINGS,
    };
    tune(&mut settings);
    let calls = Arc::new(SpindleCalls::new(storage.clone(), StoreConfig::default()));
    let (pool, report) = PythonPool::start(settings, calls).await.unwrap();
    assert!(report.graphs.values().all(|g| g.ok), "{report:?}");
    let shutdown = CancellationToken::new();
    pool.supervise(shutdown.clone());
    Fixture {
        _dir: dir,
        storage,
        pool,
        shutdown,
    }
}

/// Runs `graph_id` with `{"n": n}` on a new thread, to its end.
async fn run(fixture: &Fixture, graph_id: &str, n: f64) -> PythonEnd {
    run_on(&fixture.pool, &fixture.storage, graph_id, n).await
}

async fn run_on(
    pool: &Arc<PythonPool>,
    storage: &Arc<dyn Storage>,
    graph_id: &str,
    n: f64,
) -> PythonEnd {
    let (sink, mut events) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let route = RunRoute {
        sink: EventSink::from(sink),
        saves: storage.checkpointer(),
        scope: Scope::new(Scope::LOCAL_USER),
    };
    let start = StartRun {
        graph_id: graph_id.into(),
        input: Some(json!({"n": n})),
        command: None,
        config: json!({"configurable": {"thread_id": Uuid::now_v7().to_string()}}),
        context: json!({}),
        stream_mode: vec!["values".into()],
        subgraphs: false,
        interrupt_before: None,
        interrupt_after: None,
        durability: "async".into(),
        checkpointer: true,
    };
    let key = (Uuid::now_v7(), 1);
    executor::execute(pool, key, start, route, &CancellationToken::new()).await
}

fn succeeded(end: &PythonEnd) -> bool {
    matches!(end, PythonEnd::Done(done) if done.status == "success")
}

async fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_loop_is_blocked_gets_no_new_runs_until_it_answers() {
    let Some(python) = test_python("blocked loop") else {
        return;
    };
    let fixture = pool(&python, |s| {
        s.workers = 2;
        s.ping_every = Duration::from_millis(150);
        s.missed_pings = 2;
    })
    .await;
    let pool = fixture.pool.clone();
    let storage = fixture.storage.clone();
    let blocked = tokio::spawn(async move { run_on(&pool, &storage, "blocker", 3.0).await });
    let pool = fixture.pool.clone();
    // The blocked worker stops taking runs once it missed its pings...
    wait_for(
        "the blocked worker to be taken out",
        Duration::from_secs(3),
        || {
            pool.workers()
                .iter()
                .any(|w| w.active_runs == 1 && !w.takes_runs)
        },
    )
    .await;
    // ...while the other one still runs everything.
    let started = Instant::now();
    assert!(succeeded(&run(&fixture, "quick", 1.0).await));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Once its node ends it answers again and takes runs again.
    assert!(succeeded(&blocked.await.unwrap()));
    wait_for(
        "the worker to take runs again",
        Duration::from_secs(3),
        || pool.workers().iter().all(|w| w.takes_runs),
    )
    .await;
}

/// Many runs at once never give a worker more than its slots: it would refuse the extra
/// one ("worker is full") and that run would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn runs_started_at_once_never_overfill_a_worker() {
    let Some(python) = test_python("slots under contention") else {
        return;
    };
    let fixture = Arc::new(pool(&python, |s| s.runs_per_worker = 1).await);
    let runs: Vec<_> = (0..200)
        .map(|_| {
            let fixture = fixture.clone();
            tokio::spawn(async move { run(&fixture, "quick", 1.0).await })
        })
        .collect();
    for run in runs {
        let end = run.await.unwrap();
        assert!(succeeded(&end), "{end:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_is_recycled_after_its_runs() {
    let Some(python) = test_python("recycling") else {
        return;
    };
    let fixture = pool(&python, |s| s.recycle_after_runs = Some(2)).await;
    let pids =
        |f: &Fixture| -> Vec<Option<u32>> { f.pool.workers().iter().map(|w| w.pid).collect() };
    let first = pids(&fixture);
    assert!(succeeded(&run(&fixture, "quick", 1.0).await));
    assert_eq!(pids(&fixture), first, "one run does not recycle it");
    assert!(succeeded(&run(&fixture, "quick", 1.0).await));
    // Its second run recycled it: a new worker took its place.
    wait_for("the replacement worker", Duration::from_secs(30), || {
        let now = pids(&fixture);
        now.len() == 1 && now != first
    })
    .await;
    assert!(succeeded(&run(&fixture, "quick", 1.0).await));
}

/// A call that names a run attempt not executing here (it ended, was cancelled, lost its
/// lease) is refused as `fenced`, so the worker stops that attempt; it stores nothing.
#[tokio::test]
async fn a_save_of_an_attempt_not_executing_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("spindle.db");
    let storage = spindle_storage::connect(db.to_str().unwrap())
        .await
        .unwrap();
    let calls = SpindleCalls::new(storage.clone(), StoreConfig::default());
    let thread = Uuid::now_v7().to_string();
    let body = rmpv::ext::to_value(json!({
        "run": [Uuid::now_v7().to_string(), 2],
        "config": {"thread_id": thread, "checkpoint_ns": ""},
        "checkpoint": {"v": 4, "id": "1f000000-0000-6000-8000-000000000001",
                       "ts": "2026-01-01T00:00:00+00:00", "channel_versions": {},
                       "versions_seen": {}, "updated_channels": []},
        "metadata": {}, "blobs": [],
    }))
    .unwrap();
    let refused = calls.request("cp.put", body).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Fenced, "{refused:?}");
    let saver = storage.checkpointer();
    assert!(saver.get_tuple(&thread, "", None).await.unwrap().is_none());
}
