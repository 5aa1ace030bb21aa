"""Python graphs when things go wrong: a worker killed mid-run, Spindle killed mid-run, a
graph that fails to import. What a client relies on: a run survives both kills (same run id,
the next attempt, finished nodes not run again, every step's events once in the replay), and a
broken graph file is named, with its traceback, instead of a server that quietly has no graph.

These tests start their own spindle processes, so they never run against SPINDLE_E2E_URL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import harness
import httpx
import pytest
from conftest import PROJECTS, REF_PROJECT, WORKER_PYTHON
from e2e_util import wait_until
from langgraph_sdk import get_sync_client

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)


@pytest.fixture(autouse=True)
def _needs_worker_python():
    if not WORKER_PYTHON:
        if os.environ.get("SPINDLE_TEST_REQUIRE_PYTHON") == "1":
            pytest.fail("SPINDLE_TEST_REQUIRE_PYTHON=1 but SPINDLE_TEST_PYTHON is not set")
        pytest.skip("SPINDLE_TEST_PYTHON (a Python with spindle_worker installed) is not set")


class Storage(harness.Storage):
    """A database several `spindle serve` processes of the reference's Python project in a
    row are started on."""

    def serve(self, config: Path = REF_PROJECT / "langgraph.json", *extra: str):
        def args(port: int) -> list[str]:
            return [
                "serve", "--host", "127.0.0.1", "--port", str(port),
                "--database-url", self.database_url, "--config", str(config),
                "--python", WORKER_PYTHON, "--python-workers", "1",
                # A dead process's runs are reclaimed after a second.
                "--run-lease-secs", "1", *extra,
            ]
        return args

@pytest.fixture(params=["sqlite", "postgres"])
def storage(request) -> Iterator[Storage]:
    yield from harness.storage_in_tempdir(Storage, request.param, "spindle-e2e-pyfault")


@contextmanager
def running(storage: Storage, args) -> Iterator[harness.Server]:
    srv = harness.start(storage.backend, args, storage.workdir, timeout=60)
    try:
        yield srv
    finally:
        harness.stop(srv)


def worker_pids(server_pid: int) -> list[int]:
    """The server's Python worker processes (its children running `spindle_worker`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server_pid and "spindle_worker" in cmdline:
            pids.append(int(entry.name))
    return pids


def start_slow_run(c, srv: harness.Server, durability: str) -> tuple[str, str]:
    """A `slow` run (a -> b, 1.5 s each), followed until node `b` has started and node `a`'s
    step is saved."""
    tid = c.threads.create()["thread_id"]
    run = c.runs.create(
        tid, "slow", input={"delay_ms": 1500, "ticks": 0}, stream_mode=["values", "custom"],
        durability=durability,
    )
    url = f"{srv.base_url}/threads/{tid}/runs/{run['run_id']}/stream"
    with httpx.stream("GET", url, timeout=30) as r:
        for line in r.iter_lines():
            if '"tick":"b"' in line.replace(" ", ""):
                break
    saved = lambda: c.threads.get_state(tid)["values"].get("ticks") == 1  # noqa: E731
    wait_until(saved, what="node a's checkpoint")
    return tid, run["run_id"]


def check_resumed(c, tid: str, run_id: str) -> None:
    """The run finished on its second attempt without running node `a` again, and its replay
    shows both attempts with every step's events once."""
    assert c.runs.join(tid, run_id) == {"delay_ms": 1500, "ticks": 2}
    assert c.runs.get(tid, run_id)["status"] == "success"
    parts = list(c.runs.join_stream(tid, run_id, last_event_id="-1"))
    attempts = [p.data["attempt"] for p in parts if p.event == "metadata"]
    assert attempts == [1, 2], parts
    ticks = [p.data["tick"] for p in parts if p.event == "custom"]
    assert ticks.count("a") == 1, ticks
    assert parts[-1].event == "values" and parts[-1].data["ticks"] == 2


@pytest.mark.parametrize("durability", ["async", "sync"])
def test_a_run_survives_its_worker_being_killed(storage, durability):
    """SIGKILL of the Python worker mid-run: a new worker starts, and the run resumes there
    from its last checkpoint, in the same server."""
    with running(storage, storage.serve()) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            tid, run_id = start_slow_run(c, srv, durability)
            workers = worker_pids(srv.proc.pid)
            assert len(workers) == 1, workers
            os.kill(workers[0], signal.SIGKILL)
            check_resumed(c, tid, run_id)
            replaced = worker_pids(srv.proc.pid)
            assert len(replaced) == 1 and replaced != workers, (workers, replaced)
            # The server goes on serving Python graphs with the new worker.
            assert c.runs.wait(None, "chain", input={"n": 1}) == {"n": 4}
        assert "Python worker died" in srv.output()


def test_a_run_survives_spindle_being_killed(storage):
    """SIGKILL of Spindle itself mid-run: its worker exits with it (no orphan), and the next
    Spindle process resumes the run."""
    srv = harness.start(storage.backend, storage.serve(), storage.workdir, timeout=60)
    try:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            tid, run_id = start_slow_run(c, srv, "async")
        workers = worker_pids(srv.proc.pid)
        assert len(workers) == 1, workers
    finally:
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(timeout=10)
    # The worker sees its socket close and exits by itself.
    gone = lambda: not Path(f"/proc/{workers[0]}").exists() or "Z" in stat_state(workers[0])  # noqa: E731
    wait_until(gone, what="the orphaned worker to exit", timeout=15)

    with running(storage, storage.serve()) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            check_resumed(c, tid, run_id)


def stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


BROKEN_GRAPH = '''
from typing import TypedDict

from langgraph.graph import StateGraph, START, END
import a_module_that_does_not_exist  # noqa: F401


class S(TypedDict):
    n: int


graph = StateGraph(S).add_node("a", lambda s: s).add_edge(START, "a").add_edge("a", END).compile()
'''

GOOD_GRAPH = '''
from typing import TypedDict

from langgraph.graph import StateGraph, START, END


class S(TypedDict):
    n: int


graph = StateGraph(S).add_node("a", lambda s: {"n": s["n"] + 1}).add_edge(START, "a").add_edge("a", END).compile()
'''


def broken_project(root: Path) -> Path:
    (root / "graphs").mkdir(parents=True, exist_ok=True)
    (root / "graphs" / "broken.py").write_text(BROKEN_GRAPH)
    (root / "graphs" / "good.py").write_text(GOOD_GRAPH)
    config = root / "langgraph.json"
    config.write_text(
        '{"dependencies": ["."], "graphs": {"broken": "./graphs/broken.py:graph",'
        ' "good": "./graphs/good.py:graph"}}'
    )
    return config


def test_serve_refuses_to_start_with_a_graph_that_fails_to_import(tmp_path):
    config = broken_project(tmp_path / "project")
    args = [
        "serve", "--host", "127.0.0.1", "--port", str(harness.free_port()),
        "--database-url", str(tmp_path / "spindle.db"), "--config", str(config),
        "--python", WORKER_PYTHON,
    ]
    result = harness.run(args, tmp_path, timeout=60)
    assert result.returncode != 0
    err = result.stderr
    assert "broken" in err and "graphs/broken.py" in err, err
    assert "a_module_that_does_not_exist" in err, err
    assert "Traceback" in err, err


def test_check_imports_python_graphs_as_serve_does(tmp_path):
    """`spindle check` imports a config's Python graphs in a worker: a misspelt variable (that
    `serve` refuses) fails the check, naming the variable it may mean and the graphs the
    module defines; a module that fails to import fails it with its traceback; the graphs
    that import are said to."""
    project = PROJECTS / "template"
    root = tmp_path / "template"
    shutil.copytree(project, root, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    config = json.loads((root / "langgraph.json").read_text())

    done = harness.run(["check", "langgraph.json", "--python", WORKER_PYTHON], root)
    assert done.returncode == 0, done.stderr
    assert "ok: graph 'agent': Python compiled graph `New Graph` ./src/agent/graph.py:graph, imported" in \
        done.stdout, done.stdout

    config["graphs"]["agent"] = "./src/agent/graph.py:grpah"
    (root / "langgraph.json").write_text(json.dumps(config))
    done = harness.run(["check", "langgraph.json", "--python", WORKER_PYTHON], root)
    assert done.returncode == 1, done.stdout
    assert (
        "error: graph 'agent' (./src/agent/graph.py:grpah) failed to import: ValueError: "
        "'./src/agent/graph.py' has no variable 'grpah' (did you mean 'graph'?); "
        "graphs it defines: graph; functions it defines: call_model"
    ) in done.stderr, done.stderr

    broken = broken_project(tmp_path / "broken")
    done = harness.run(["check", str(broken), "--python", WORKER_PYTHON], tmp_path)
    assert done.returncode == 1, done.stdout
    assert "graph 'broken' (./graphs/broken.py:graph) failed to import: ModuleNotFoundError" in done.stderr
    assert "Traceback" in done.stderr, done.stderr


def test_dev_starts_and_a_broken_graphs_runs_say_why(tmp_path):
    config = broken_project(tmp_path / "project")
    storage = Storage("sqlite", tmp_path)

    def dev(port: int) -> list[str]:
        return ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / "d"),
                "--config", str(config), "--python", WORKER_PYTHON]

    with running(storage, dev) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            assert c.runs.wait(None, "good", input={"n": 1}) == {"n": 2}
            tid = c.threads.create()["thread_id"]
            parts = list(c.runs.stream(tid, "broken", input={"n": 1}))
            errors = [p.data for p in parts if p.event == "error"]
            assert errors, parts
            assert "a_module_that_does_not_exist" in errors[0]["message"], errors
        out = srv.output()
    assert "broken (Python, failed to import" in out, out
    assert "a_module_that_does_not_exist" in out, out


def test_dev_reloads_changed_graphs_and_runs_in_flight_resume(tmp_path):
    """`spindle dev` watches the project: a changed graph file reloads the workers (new runs
    get the new code), and a run in flight on the old worker resumes on a new one from its
    last checkpoint, as a run whose worker died does."""
    project = tmp_path / "project"
    shutil.copytree(REF_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
    storage = Storage("sqlite", tmp_path)

    def dev(port: int) -> list[str]:
        return ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / "d"),
                "--config", str(project / "langgraph.json"), "--python", WORKER_PYTHON]

    with running(storage, dev) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            assert c.runs.wait(None, "chain", input={"n": 1}) == {"n": 4}
            tid = c.threads.create()["thread_id"]
            run = c.runs.create(tid, "slow", input={"delay_ms": 4000, "ticks": 0},
                                stream_mode=["values", "custom"])
            url = f"{srv.base_url}/threads/{tid}/runs/{run['run_id']}/stream"
            with httpx.stream("GET", url, timeout=30) as r:
                for line in r.iter_lines():
                    if '"tick":"a"' in line.replace(" ", ""):
                        break
            graphs = project / "graphs" / "ref_graphs.py"
            source = graphs.read_text()
            changed = source.replace('return {"n": state.get("n", 0) + 1}',
                                     'return {"n": state.get("n", 0) + 10}')
            assert changed != source
            graphs.write_text(changed)
            assert c.runs.join(tid, run["run_id"]) == {"delay_ms": 4000, "ticks": 2}
            assert c.runs.get(tid, run["run_id"])["status"] == "success"
            parts = list(c.runs.join_stream(tid, run["run_id"], last_event_id="-1"))
            attempts = [p.data["attempt"] for p in parts if p.event == "metadata"]
            assert attempts == [1, 2], parts
            wait_until(lambda: c.runs.wait(None, "chain", input={"n": 1}) == {"n": 31},
                       what="the changed graph to answer", timeout=30)
        out = srv.output()
    assert "reloading the Python graphs" in out, out
    # The old worker's exit was asked for: no warning that reads like a crash.
    warned = [line for line in out.splitlines() if "WARN" in line and "Python worker exited" in line]
    assert not warned, warned
    # The run taken up again on a new worker says so, naming it.
    resumed = [line for line in out.splitlines() if "resuming the run from its last checkpoint" in line]
    assert resumed and run["run_id"] in resumed[0], out


def test_a_python_run_past_its_time_limit_ends_timeout(tmp_path):
    """`--run-timeout-secs`: a Python run still going past it is stopped on its worker and
    ends `timeout` with a `TimeoutError`; the worker takes the next run as usual."""
    storage = Storage("sqlite", tmp_path)

    def dev(port: int) -> list[str]:
        return ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / "d"),
                "--config", str(REF_PROJECT / "langgraph.json"), "--python", WORKER_PYTHON,
                "--run-timeout-secs", "1"]

    with running(storage, dev) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            tid = c.threads.create()["thread_id"]
            parts = list(c.runs.stream(tid, "slow", input={"delay_ms": 3000, "ticks": 0}))
            errors = [p.data for p in parts if p.event == "error"]
            assert errors and errors[0]["error"] == "TimeoutError", parts
            run_id = c.runs.list(tid)[0]["run_id"]
            assert c.runs.get(tid, run_id)["status"] == "timeout"
            assert c.runs.wait(None, "chain", input={"n": 1}) == {"n": 4}
