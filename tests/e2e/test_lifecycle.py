"""The binary's own life: command line, migrations, and data that outlives a restart.

These tests start their own spindle processes (not the shared session server), so they only run
when the suite starts the binary itself, never against SPINDLE_E2E_URL.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import harness
import httpx
import pytest
from e2e_util import EXAMPLE_GRAPHS, default_assistant_id, wait_until
from langgraph_sdk import get_sync_client

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)


class Storage(harness.Storage):
    """A database several `spindle serve` processes in a row are started on."""

    def serve_args(self, port: int) -> list[str]:
        return ["serve", "--host", "127.0.0.1", "--port", str(port), "--database-url", self.database_url,
                "--examples"]


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request) -> Iterator[Storage]:
    yield from harness.storage_in_tempdir(Storage, request.param, "spindle-e2e-life")


@contextmanager
def running(storage: Storage, args=None) -> Iterator[harness.Server]:
    srv = harness.start(storage.backend, args or storage.serve_args, storage.workdir)
    try:
        yield srv
    finally:
        harness.stop(srv)


def short_lease(storage: Storage):
    """`serve` arguments with a 1-second run lease, so a dead worker's run is reclaimed at once."""
    def serve(port: int) -> list[str]:
        return storage.serve_args(port) + ["--run-lease-secs", "1"]
    return serve


def test_help_names_the_commands(tmp_path):
    """`spindle --help` documents the dev, serve and migrate commands."""
    r = harness.run(["--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    for word in ("dev", "serve", "migrate"):
        assert word in r.stdout, r.stdout


def test_data_survives_restart(storage):
    """Assistants (with their versions and pinned latest) and threads survive a restart;
    default assistants are not duplicated by the second start."""
    with running(storage) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            a = c.assistants.create("echo", name="persist", config={"configurable": {"v": 1}})
            c.assistants.update(a["assistant_id"], config={"configurable": {"v": 2}})
            c.assistants.set_latest(a["assistant_id"], 1)
            t = c.threads.create(metadata={"persist": "yes"})

    with running(storage) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            got = c.assistants.get(a["assistant_id"])
            assert got["version"] == 1
            assert got["config"]["configurable"] == {"v": 1}
            assert got["name"] == "persist"
            versions = c.assistants.get_versions(a["assistant_id"])
            assert sorted(v["version"] for v in versions) == [1, 2]
            assert c.threads.get(t["thread_id"])["metadata"] == {"persist": "yes"}
            for graph_id in EXAMPLE_GRAPHS:
                defaults = c.assistants.search(
                    graph_id=graph_id, metadata={"created_by": "system"}, limit=100
                )
                assert [d["assistant_id"] for d in defaults] == [default_assistant_id(graph_id)]
                assert defaults[0]["version"] == 1


def test_migrate_is_idempotent_then_serve(storage):
    """`spindle migrate` (database from SPINDLE_DATABASE_URL) succeeds twice; serve then starts."""
    env = {"SPINDLE_DATABASE_URL": storage.database_url}
    for attempt in (1, 2):
        r = harness.run(["migrate"], storage.workdir, env=env)
        assert r.returncode == 0, f"migrate #{attempt} failed:\n{r.stdout}\n{r.stderr}"
    with running(storage) as srv:
        r = httpx.get(srv.base_url + "/ready", timeout=10)
        assert r.status_code == 200, r.text


def test_dev_reuses_its_data_dir(tmp_path):
    """`spindle dev` keeps its data under --data-dir across restarts."""
    storage = Storage("sqlite", tmp_path)
    data = tmp_path / "data"

    def dev(port):
        return ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data)]

    with running(storage, dev) as srv:
        tid = httpx.post(srv.base_url + "/threads", json={"metadata": {"k": 1}}).json()["thread_id"]
    assert data.is_dir() and any(data.iterdir()), "nothing written under --data-dir"
    with running(storage, dev) as srv:
        r = httpx.get(f"{srv.base_url}/threads/{tid}")
        assert r.status_code == 200, r.text
        assert r.json()["metadata"] == {"k": 1}


def dev_with_config(config: Path, data_dir: Path):
    """`spindle dev` arguments for a port: the given config file, a data dir of the test's."""
    def args(port: int) -> list[str]:
        return ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
                "--config", str(config)]
    return args


def test_dev_reloads_a_changed_graph_file(tmp_path):
    """`spindle dev` watches its graph files: a changed file serves new runs at once; one
    that no longer loads is logged and the version from before keeps serving."""
    project = tmp_path / "project"
    project.mkdir()
    graph = project / "chain.yaml"
    source = (Path(__file__).parents[2] / "examples" / "graphs" / "chain.yaml").read_text()
    graph.write_text(source)
    (project / "spindle.json").write_text('{"graphs": {"chain": "./chain.yaml"}}')
    storage = Storage("sqlite", tmp_path)

    dev = dev_with_config(project / "spindle.json", tmp_path / "d")

    with running(storage, dev) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            assert c.runs.wait(None, "chain", input={"n": 1}) == {"n": 4}
            changed = source.replace("(state.n ?? 0) + 1", "(state.n ?? 0) + 10")
            assert changed != source
            graph.write_text(changed)
            wait_until(lambda: c.runs.wait(None, "chain", input={"n": 1}) == {"n": 31},
                       what="the changed graph file to answer", timeout=20)
            graph.write_text("nodes: [this is not a graph")
            wait_until(lambda: "does not load" in srv.output(), what="the broken file to be logged",
                       timeout=20)
            assert c.runs.wait(None, "chain", input={"n": 1}) == {"n": 31}
        out = srv.output()
    assert "graph file changed; new runs use the new version" in out, out


def test_dev_reloads_a_graph_when_a_file_it_imports_changes(tmp_path):
    """`spindle dev` also watches the graph files a graph file imports, directly or through
    another import, in the project or outside it; an import added by a change is followed."""
    project = tmp_path / "project"
    (project / "lib").mkdir(parents=True)
    shared = tmp_path / "shared"
    shared.mkdir()

    def step(add: int) -> str:
        return ("state: {n: integer}\n"
                f"nodes: {{s: {{kind: script, code: '#{{ n: (state.n ?? 0) + {add} }}'}}}}\n"
                "edges: [{from: __start__, to: s}, {from: s, to: __end__}]\n")

    def uses(name: str, path: str) -> str:
        return ("state: {n: integer}\n"
                f"graphs: {{{name}: {path}}}\n"
                f"nodes: {{{name}: {{kind: subgraph, graph: {name}}}}}\n"
                f"edges: [{{from: __start__, to: {name}}}, {{from: {name}, to: __end__}}]\n")

    # main.yaml -> lib/middle.yaml -> ../shared/add.yaml (outside the project folder)
    (shared / "add.yaml").write_text(step(1))
    (project / "lib" / "middle.yaml").write_text(uses("add", "../../shared/add.yaml"))
    (project / "lib" / "other.yaml").write_text(step(100))
    (project / "main.yaml").write_text(uses("middle", "./lib/middle.yaml"))
    (project / "spindle.json").write_text('{"graphs": {"main": "./main.yaml"}}')
    storage = Storage("sqlite", tmp_path)

    dev = dev_with_config(project / "spindle.json", tmp_path / "d")

    with running(storage, dev) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            def answer():
                return c.runs.wait(None, "main", input={"n": 1})

            assert answer() == {"n": 2}
            (shared / "add.yaml").write_text(step(10))
            wait_until(lambda: answer() == {"n": 11}, what="the changed imported file to answer",
                       timeout=20)
            # The middle file now imports another file: that one is watched from then on.
            (project / "lib" / "middle.yaml").write_text(uses("add", "./other.yaml"))
            wait_until(lambda: answer() == {"n": 101}, what="the new import to answer", timeout=20)
            (project / "lib" / "other.yaml").write_text(step(1000))
            wait_until(lambda: answer() == {"n": 1001}, what="the newly imported file to answer",
                       timeout=20)
            # A broken imported file keeps the version from before serving.
            (project / "lib" / "other.yaml").write_text("nodes: [this is not a graph")
            wait_until(lambda: "does not load" in srv.output(), what="the broken file to be logged",
                       timeout=20)
            assert answer() == {"n": 1001}
        out = srv.output()
    assert "watching imported graph files outside the project" in out, out


@pytest.mark.parametrize("durability", ["async", "sync"])
def test_run_survives_sigkill(storage, durability):
    """A server killed with SIGKILL during a `slow` run and started again finishes that run from
    its last checkpoint (attempt 2; the node that had finished and been saved does not run
    again), and the run's stream replays every event of both attempts. With `sync`, a step
    starts only once the one before is saved; with `async` (the default) it is saved while the
    next step runs, so the test waits until the thread's state shows it."""
    import signal

    serve = short_lease(storage)
    srv = harness.start(storage.backend, serve, storage.workdir)
    try:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            tid = c.threads.create()["thread_id"]
            run = c.runs.create(
                tid, "slow", input={"delay_ms": 1500, "ticks": 0}, stream_mode=["values", "custom"],
                durability=durability,
            )
            # Follow the run until node `b` has started, then kill.
            url = f"{srv.base_url}/threads/{tid}/runs/{run['run_id']}/stream"
            with httpx.stream("GET", url, timeout=30) as r:
                for line in r.iter_lines():
                    if '"tick":"b"' in line.replace(" ", ""):
                        break
            if durability == "async":
                saved = lambda: c.threads.get_state(tid)["values"].get("ticks") == 1  # noqa: E731
                wait_until(saved, what="node a's checkpoint")
    finally:
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(timeout=10)

    with running(storage, serve) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            assert c.runs.join(tid, run["run_id"]) == {"delay_ms": 1500, "ticks": 2}
            assert c.runs.get(tid, run["run_id"])["status"] == "success"
            parts = list(c.runs.join_stream(tid, run["run_id"], last_event_id="-1"))
    attempts = [p.data["attempt"] for p in parts if p.event == "metadata"]
    assert attempts == [1, 2], parts
    ticks = [p.data["tick"] for p in parts if p.event == "custom"]
    assert ticks.count("a") == 1, ticks
    assert parts[-1].event == "values" and parts[-1].data["ticks"] == 2


def mark_claimed_by_a_dead_worker(storage: Storage, run_id: str) -> None:
    """Makes a pending run look as if a worker had claimed it and died at once, before the
    run's input checkpoint was saved: running, attempt 1, its lease long expired."""
    expired = "2000-01-01T00:00:00Z"
    claimed = ("UPDATE runs SET status = 'running', attempt = 1, lease_owner = 'dead-worker', "
               "lease_expires_at = {t}, started_at = {t} WHERE run_id = {id}")
    if storage.backend == "postgres":
        import psycopg

        with psycopg.connect(storage.database_url, autocommit=True) as conn:
            conn.execute(claimed.format(t="%s::timestamptz", id="%s::uuid"), (expired, expired, run_id))
    else:
        import sqlite3

        with sqlite3.connect(storage.database_url) as conn:
            conn.execute(claimed.format(t="?", id="?"), (expired, expired, run_id))


def test_run_whose_worker_died_before_its_input_was_saved_starts_over(storage):
    """A run claimed by a worker that died before the run's input checkpoint was saved is
    claimed again (attempt 2) and runs with its input, not from the thread's earlier state:
    the input of a run is never lost to a crash."""
    serve = short_lease(storage)
    with running(storage, serve) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            tid = c.threads.create()["thread_id"]
            first = c.runs.wait(tid, "slow", input={"delay_ms": 10, "ticks": 0})
            assert first == {"delay_ms": 10, "ticks": 2}
            run = c.runs.create(tid, "slow", input={"delay_ms": 20, "ticks": 0},
                                after_seconds=3600)
    mark_claimed_by_a_dead_worker(storage, run["run_id"])

    with running(storage, serve) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            assert c.runs.join(tid, run["run_id"]) == {"delay_ms": 20, "ticks": 2}
            assert c.runs.get(tid, run["run_id"])["status"] == "success"
            parts = list(c.runs.join_stream(tid, run["run_id"], last_event_id="-1"))
    attempts = [p.data["attempt"] for p in parts if p.event == "metadata"]
    assert attempts == [2], parts


def test_idle_streams_get_keepalive_comments(tmp_path):
    """While a run is quiet, its event stream carries `: heartbeat` comments at the configured
    interval (`--keepalive-interval-secs`), so proxies keep the connection open."""
    storage = Storage("sqlite", tmp_path)

    def dev(port):
        return ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / "d"),
                "--keepalive-interval-secs", "1"]

    with running(storage, dev) as srv:
        tid = httpx.post(srv.base_url + "/threads", json={}).json()["thread_id"]
        body = {"assistant_id": "slow", "input": {"delay_ms": 1600, "ticks": 0}, "stream_mode": ["custom"]}
        r = httpx.post(f"{srv.base_url}/threads/{tid}/runs/stream", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert ": heartbeat\r\n\r\n" in r.text, r.text


def test_a_run_past_its_time_limit_ends_timeout(tmp_path):
    """`--run-timeout-secs`: a run still going past it is stopped and ends `timeout`, and its
    stream's `error` event says `TimeoutError`, as its record does."""
    storage = Storage("sqlite", tmp_path)

    def dev(port):
        return ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(tmp_path / "d"),
                "--run-timeout-secs", "1"]

    with running(storage, dev) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            tid = c.threads.create()["thread_id"]
            parts = list(c.runs.stream(tid, "slow", input={"delay_ms": 3000, "ticks": 0}))
            errors = [p.data for p in parts if p.event == "error"]
            assert errors and errors[0]["error"] == "TimeoutError", parts
            run = c.runs.list(tid)[0]
            assert run["status"] == "timeout"


def kill(srv: harness.Server) -> None:
    import signal

    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(timeout=10)


def replay(c, tid: str, run_id: str) -> list:
    """Every logged event of the run, from the start (what a client resuming at -1 gets)."""
    return list(c.runs.join_stream(tid, run_id, last_event_id="-1"))


def check_replay(parts: list, durability: str, what: str) -> None:
    """The replay of a `slow` run (a -> b) resumed after a kill has every step's events once.

    A node's `updates` may show twice only when the node ran again in a later attempt because
    its step was not saved (its `custom` tick shows again there). With `sync` and `async`
    durability a step whose events reached the log was saved with them, so a node's update
    shows exactly once in the whole replay, and the values after each step show; with `exit`
    nothing is saved before the end, so a resumed run runs every node again.
    """
    attempts: list[list] = []
    for p in parts:
        if p.event == "metadata":
            attempts.append([])
        elif attempts:
            attempts[-1].append(p)
    assert attempts, f"{what}: no metadata event: {parts}"
    updates = [[n for p in a if p.event == "updates" for n in p.data] for a in attempts]
    ticks = [[p.data["tick"] for p in a if p.event == "custom"] for a in attempts]
    for node in ("a", "b"):
        seen = [i for i, nodes in enumerate(updates) if node in nodes]
        assert seen, f"{what}: node {node}'s update is missing from the replay: {parts}"
        for i in seen:
            assert updates[i].count(node) == 1, f"{what}: {node} twice in attempt {i + 1}: {parts}"
        for i in seen[:-1]:
            assert any(node in t for t in ticks[i + 1:]), (
                f"{what}: node {node}'s update shows in attempt {i + 1} and again later, "
                f"though it did not run again: {parts}"
            )
    if durability in ("sync", "async"):
        flat = [n for nodes in updates for n in nodes]
        assert flat == ["a", "b"], f"{what}: updates {updates}: {parts}"
        # The values after each step, once in the whole replay (a resumed attempt first
        # streams the state it resumes from, as LangGraph does): a save carries exactly the
        # events emitted before it (its mark in the event channel), so a step's `values`
        # are logged with its checkpoint, not with the save before it.
        values = [p.data["ticks"] for i, a in enumerate(attempts) for j, p in enumerate(a)
                  if p.event == "values" and not (i > 0 and j == 0)]
        assert len(values) == len(set(values)), f"{what}: values {values}: {parts}"
        values = {p.data["ticks"] for a in attempts for p in a if p.event == "values"}
        assert {1, 2} <= values, f"{what}: values {values}: {parts}"
    last = [p for p in parts if p.event == "values"][-1]
    assert last.data["ticks"] == 2, f"{what}: {parts}"


def test_a_resumed_runs_replay_has_every_steps_events_once(storage):
    """SIGKILLs of the server at many points of `slow` runs (a -> b), under each durability:
    after a restart every run resumes and ends with its final state, and the replay of its
    events (Last-Event-ID -1) shows every node's `updates` (and, when steps are saved, the
    values after each step) exactly once. A step is never saved while its events are not
    logged: a kill just after a node ended used to leave its checkpoint saved and its events
    lost, so the resumed run skipped the node and no replay ever showed it."""
    import random

    rng = random.Random(26)
    serve = short_lease(storage)
    delay_ms = 60
    durabilities = ["async", "sync", "exit"]
    runs_per_round = 6
    resumed = 0
    srv = harness.start(storage.backend, serve, storage.workdir)
    try:
        for round_no in range(8):
            with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
                started = []
                for i in range(runs_per_round):
                    durability = durabilities[(round_no + i) % len(durabilities)]
                    tid = c.threads.create()["thread_id"]
                    run = c.runs.create(
                        tid, "slow", input={"delay_ms": delay_ms, "ticks": 0},
                        stream_mode=["updates", "values", "custom"], durability=durability,
                    )
                    started.append((tid, run["run_id"], durability))
                    time.sleep(rng.uniform(0.0, 0.03))
                # Kill at a different point of the runs each round: around node a's end
                # (about 60 ms in), b's, and everywhere between.
                time.sleep(rng.uniform(0.0, 0.12))
            kill(srv)
            srv = harness.start(storage.backend, serve, storage.workdir)
            with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
                for tid, run_id, durability in started:
                    what = f"round {round_no}, {durability} run {run_id}"
                    final = c.runs.join(tid, run_id)
                    assert final == {"delay_ms": delay_ms, "ticks": 2}, f"{what}: {final}"
                    assert c.runs.get(tid, run_id)["status"] == "success", what
                    parts = replay(c, tid, run_id)
                    resumed += sum(p.event == "metadata" for p in parts) > 1
                    check_replay(parts, durability, what)
    finally:
        harness.stop(srv)
    # The kills must have hit runs mid-way for the test to mean anything.
    assert resumed >= 10, f"only {resumed} runs were resumed after a kill"


def test_a_run_given_up_after_its_worker_died_streams_its_error(storage):
    """With its attempts used up (--max-attempts 1), a run whose server was killed mid-run
    ends `error`: its streams, replayed or live, get an `error` event (WorkerLost) before
    they end, as after a graph error, and the server logs a warning naming the run."""
    def serve(port: int) -> list[str]:
        # A lease long enough for the restarted server to be following the run before the
        # lease runs out and the run is given up.
        return storage.serve_args(port) + ["--run-lease-secs", "3", "--max-attempts", "1"]

    srv = harness.start(storage.backend, serve, storage.workdir)
    try:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            tid = c.threads.create()["thread_id"]
            run = c.runs.create(tid, "slow", input={"delay_ms": 1000, "ticks": 0},
                                stream_mode=["values", "custom"])
            wait_until(lambda: c.runs.get(tid, run["run_id"])["status"] == "running",
                       what="the run to start")
    finally:
        kill(srv)

    with running(storage, serve) as srv:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=60) as c:
            # A stream joined before the run is given up: it gets the error live.
            live = list(c.runs.join_stream(tid, run["run_id"]))
            assert c.runs.get(tid, run["run_id"])["status"] == "error"
            parts = replay(c, tid, run["run_id"])
        output = srv.output()
    for stream, events in (("live", live), ("replay", parts)):
        errors = [p.data for p in events if p.event == "error"]
        assert len(errors) == 1, f"{stream}: {events}"
        assert errors[0]["error"] == "WorkerLost", f"{stream}: {events}"
        assert errors[0]["message"], f"{stream}: {events}"
    assert parts[-1].event == "error", parts
    warned = [line for line in output.splitlines() if run["run_id"] in line and "WARN" in line]
    assert warned, f"no warning names the run:\n{harness.tail(output)}"
    assert tid in warned[0] and "attempts=1" in warned[0], warned[0]
