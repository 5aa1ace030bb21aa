"""A run's stream cut by a stopping server (SIGTERM: a deploy, Ctrl-C in `dev`), as the official
clients live through it. A streamed run answers `Location: /threads/{t}/runs/{r}/stream`, the
path both clients reconnect to with `Last-Event-ID`, and a stopping process cuts its streams
(an error, not a clean end), so each client reconnects once the server is back (on PostgreSQL a
second process has taken the run over meanwhile) and receives every event of the run exactly
once, through its last `values`. Starts its own spindle processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import harness
import httpx
import pytest
from langgraph_sdk import get_client

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)

JS_DIR = Path(__file__).resolve().parents[1] / "js"
# Each node of `slow` sleeps this long: the stream is cut during the first.
DELAY_MS = 2500


class Storage(harness.Storage):
    """The database of one server restarted on the same port, and on PostgreSQL a second
    process on it that takes over the runs the stopped one hands back."""

    def __init__(self, backend: str, workdir: Path):
        super().__init__(backend, workdir)
        self.port = harness.free_port()
        self.others: list[harness.Server] = []

    def args(self, port: int) -> list[str]:
        # No grace: a stopping process hands its runs back at once.
        return ["serve", "--host", "127.0.0.1", "--port", str(port), "--database-url",
                self.database_url, "--examples", "--shutdown-grace-secs", "0"]

    def start(self) -> harness.Server:
        """The server on `self.port` (the same one after each restart)."""
        server = harness.Server(
            backend=self.backend,
            base_url=f"http://127.0.0.1:{self.port}",
            stdout_path=self.workdir / f"main.{time.monotonic_ns()}.stdout.log",
            stderr_path=self.workdir / f"main.{time.monotonic_ns()}.stderr.log",
        )
        server.argv = [str(harness.spindle_bin()), *self.args(self.port)]
        with open(server.stdout_path, "wb") as out, open(server.stderr_path, "wb") as err:
            server.proc = subprocess.Popen(server.argv, cwd=self.workdir, stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=err, env=harness.child_env())
        try:
            harness._wait_ready(server, harness.START_TIMEOUT)
        except RuntimeError as e:
            harness.stop(server)
            pytest.fail(f"spindle did not start on port {self.port}: {e}\n{harness.tail(server.output())}")
        return server

    def start_other(self) -> None:
        if self.backend == "postgres":
            self.others.append(harness.start(self.backend, self.args, self.workdir))

    def close(self) -> None:
        for server in self.others:
            harness.stop(server)
        super().close()


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request):
    yield from harness.storage_in_tempdir(Storage, request.param, "spindle-e2e-reconnect")


def new_thread(base_url: str) -> str:
    r = httpx.post(f"{base_url}/threads", json={}, timeout=10)
    r.raise_for_status()
    return r.json()["thread_id"]


def cut_and_restart(storage: Storage, server: harness.Server) -> harness.Server:
    """SIGTERM `server` (it cuts its streams and hands its run back), then start it again."""
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the server did not stop after SIGTERM\n" + harness.tail(server.output()))
    assert server.proc.returncode == 0, harness.tail(server.output())
    return storage.start()


def replay(base_url: str, thread_id: str) -> list[tuple[str, str, object]]:
    """The thread's only run's stream from its start, as (id, event, data), once it ended."""
    with httpx.Client(base_url=base_url, timeout=30) as http:
        deadline = time.monotonic() + 30
        while True:
            runs = http.get(f"/threads/{thread_id}/runs").json()
            if runs and runs[0]["status"] not in ("pending", "running"):
                break
            assert time.monotonic() < deadline, f"the run did not end: {runs}"
            time.sleep(0.1)
        assert len(runs) == 1 and runs[0]["status"] == "success", runs
        frames, frame = [], {}
        with http.stream("GET", f"/threads/{thread_id}/runs/{runs[0]['run_id']}/stream",
                         headers={"Last-Event-ID": "-1"}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line:
                    if "data" in frame:
                        frames.append((frame.get("id"), frame.get("event"), json.loads(frame["data"])))
                    frame = {}
                elif not line.startswith(":"):
                    key, _, value = line.partition(":")
                    frame[key] = value[1:] if value.startswith(" ") else value
        return frames


def check_got_the_replay(got: list[tuple[str, str, object]], want: list[tuple[str, str, object]]) -> None:
    ids = [i for i, _, _ in got]
    assert len(ids) == len(set(ids)), f"an event came twice: {ids}"
    assert got == want, f"the client got\n{got}\nthe run's stream is\n{want}"
    values = [d for _, e, d in got if e == "values"]
    assert values[-1] == {"delay_ms": DELAY_MS, "ticks": 2}, values


def test_python_client_reconnects_to_the_run_stream_after_sigterm(storage: Storage):
    server = storage.start()
    storage.start_other()
    thread_id = new_thread(server.base_url)
    got: list[tuple[str, str, object]] = []

    async def follow(first_tick: asyncio.Event):
        client = get_client(url=server.base_url)
        async for part in client.runs.stream(thread_id, "slow", input={"delay_ms": DELAY_MS},
                                             stream_mode=["values", "custom"], stream_resumable=True):
            got.append((part.id, part.event, part.data))
            if part.event == "custom":
                first_tick.set()

    async def main():
        first_tick = asyncio.Event()
        task = asyncio.create_task(follow(first_tick))
        await asyncio.wait_for(first_tick.wait(), 20)
        return task

    loop = asyncio.new_event_loop()
    try:
        task = loop.run_until_complete(main())
        # The stream is cut mid-node; the client retries until the server is back.
        restarted = loop.run_until_complete(asyncio.to_thread(cut_and_restart, storage, server))
        try:
            loop.run_until_complete(asyncio.wait_for(task, 60))
            check_got_the_replay(got, replay(restarted.base_url, thread_id))
        finally:
            harness.stop(restarted)
    finally:
        loop.close()


def test_js_client_reconnects_to_the_run_stream_after_sigterm(storage: Storage):
    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        if os.environ.get("SPINDLE_TEST_REQUIRE_JS") == "1":
            pytest.fail("node or tests/js/node_modules is missing (run `npm ci` in tests/js)")
        pytest.skip("node or tests/js/node_modules is missing (run `npm ci` in tests/js)")
    server = storage.start()
    storage.start_other()
    thread_id = new_thread(server.base_url)
    proc = subprocess.Popen([node, "stream_resumable.mjs", thread_id, str(DELAY_MS)], cwd=JS_DIR,
                            env={**os.environ, "SPINDLE_URL": server.base_url},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got: list[tuple[str, str, object]] = []
    first_tick = threading.Event()

    def read():
        for line in proc.stdout:
            part = json.loads(line)
            if part["event"] == "" and part["data"] is None:
                # Not an event: the JS client's SSE decoder turns each keepalive comment into
                # an empty part once an event id has been seen (so it does with LangGraph's
                # own keepalives).
                continue
            got.append((part.get("id"), part["event"], part["data"]))
            if part["event"] == "custom":
                first_tick.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    restarted = None
    try:
        assert first_tick.wait(20), f"the JS client got no custom event: {got} {proc.stderr.read() if proc.poll() is not None else ''}"
        restarted = cut_and_restart(storage, server)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the JS client did not finish; it got {got}")
        reader.join(5)
        assert proc.returncode == 0, proc.stderr.read()
        check_got_the_replay(got, replay(restarted.base_url, thread_id))
    finally:
        if proc.poll() is None:
            proc.kill()
        if restarted is not None:
            harness.stop(restarted)
