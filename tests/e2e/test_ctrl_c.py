"""Stopping a server with Ctrl-C while a run executes (issue 54): the first Ctrl-C says how
many runs are still running and that a second one stops now; the second stops now, handing the
runs back; the next start says which runs it resumes, and they resume from their last
checkpoint (a finished node does not run again). On `spindle dev` (SQLite) and `spindle serve`
(PostgreSQL).

These tests start their own spindle processes, so they never run against SPINDLE_E2E_URL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import harness
import httpx
import pytest
from e2e_util import wait_until
from langgraph_sdk import get_sync_client

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)

# Far longer than the test: a process that exits soon after the second Ctrl-C did not wait.
GRACE_SECS = 60
# Each of the `slow` graph's two nodes sleeps this long.
DELAY_MS = 2000


class Storage(harness.Storage):
    def args(self, grace_secs: int = GRACE_SECS):
        def args(port: int) -> list[str]:
            command = ["dev"] if self.backend == "sqlite" else ["serve", "--examples"]
            return [
                *command, "--host", "127.0.0.1", "--port", str(port),
                "--database-url", self.database_url,
                "--shutdown-grace-secs", str(grace_secs),
            ]
        return args


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request) -> Iterator[Storage]:
    yield from harness.storage_in_tempdir(Storage, request.param, "spindle-e2e-ctrl-c")


def wait_for_tick(base_url: str, thread_id: str, run_id: str, tick: str) -> None:
    """Follows the run's stream until its node `tick` has started."""
    url = f"{base_url}/threads/{thread_id}/runs/{run_id}/stream"
    with httpx.stream("GET", url, headers={"Last-Event-ID": "-1"}, timeout=30) as r:
        for line in r.iter_lines():
            if f'"tick":"{tick}"' in line.replace(" ", ""):
                return
    pytest.fail(f"the run's stream ended before node {tick} started")


def test_a_second_ctrl_c_stops_now_and_the_next_start_resumes_the_run(storage):
    srv = harness.start(storage.backend, storage.args(), storage.workdir)
    try:
        with get_sync_client(url=srv.base_url, api_key=None, timeout=30) as c:
            thread_id = c.threads.create()["thread_id"]
            run = c.runs.create(thread_id, "slow", input={"delay_ms": DELAY_MS, "ticks": 0},
                                stream_mode=["values", "custom"])
        # Node a is done (its checkpoint saved), node b is sleeping.
        wait_for_tick(srv.base_url, thread_id, run["run_id"], "b")

        srv.proc.send_signal(signal.SIGINT)
        wait_until(lambda: "press Ctrl-C again to stop now" in srv.output(),
                   what="the first Ctrl-C's notice")
        out = srv.output()
        assert "1 run still running: waiting up to 60 s" in out, harness.tail(out)

        srv.proc.send_signal(signal.SIGINT)
        second = time.monotonic()
        try:
            srv.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("the second Ctrl-C did not stop the server\n" + harness.tail(srv.output()))
        assert time.monotonic() - second < 15
        out = srv.output()
        assert "stopping now: handing the runs still executing back" in out, harness.tail(out)
    finally:
        harness.stop(srv)

    again = harness.start(storage.backend, storage.args(grace_secs=1), storage.workdir)
    try:
        with get_sync_client(url=again.base_url, api_key=None, timeout=30) as c:
            assert c.runs.join(thread_id, run["run_id"]) == {"delay_ms": DELAY_MS, "ticks": 2}
            assert c.runs.get(thread_id, run["run_id"])["status"] == "success"
            parts = list(c.runs.join_stream(thread_id, run["run_id"], last_event_id="-1"))
        # Resumed after node a: a ran once, in the first attempt.
        ticks = [p.data["tick"] for p in parts if p.event == "custom"]
        assert ticks.count("a") == 1, ticks
        attempts = [p.data["attempt"] for p in parts if p.event == "metadata"]
        assert attempts == [1, 2], parts
        resumed = [line for line in again.output().splitlines()
                   if "resuming the run from its last checkpoint" in line]
        assert resumed and run["run_id"] in resumed[0], harness.tail(again.output())
        if storage.backend == "sqlite":  # `dev` has its database to itself: its banner says so
            assert "Resuming: 1 run the last stop interrupted" in again.output(), again.output()
    finally:
        harness.stop(again)
