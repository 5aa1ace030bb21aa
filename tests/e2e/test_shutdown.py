"""Graceful shutdown (issue 29): a `spindle serve` process stopped with SIGTERM ends the streams
it serves (clients resume them on another process), claims no more runs, lets its running runs
finish within `--shutdown-grace-secs`, and hands the others back to the queue, where another
process on the same PostgreSQL database resumes them at once, not after their lease.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import harness
import httpx
import pytest

pytestmark = [
    pytest.mark.skipif(not harness.POSTGRES_URL, reason=harness.POSTGRES_SKIP_REASON),
    pytest.mark.skipif(
        bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
        reason="starts its own spindle processes",
    ),
]

GRACE_SECS = 2
# Far longer than the test may take: a run resumed elsewhere within it was handed back, not
# taken over after its lease.
LEASE_SECS = 120


@pytest.fixture
def two_processes(tmp_path):
    """Two `spindle serve` processes on one fresh database."""
    with harness.serve_on_one_database(
        2, tmp_path,
        "--shutdown-grace-secs", str(GRACE_SECS),
        "--run-lease-secs", str(LEASE_SECS),
    ) as servers:
        yield servers


def start_run(base: str, thread_id: str, delay_ms: int) -> dict:
    r = httpx.post(
        f"{base}/threads/{thread_id}/runs",
        json={"assistant_id": "slow", "input": {"delay_ms": delay_ms}},
        timeout=10,
    )
    r.raise_for_status()
    return r.json()


def new_thread(base: str) -> str:
    r = httpx.post(f"{base}/threads", json={}, timeout=10)
    r.raise_for_status()
    return r.json()["thread_id"]


def read_sse(lines):
    """SSE frames as (id, event, data) from a response's lines (comments skipped)."""
    frame: dict = {}
    for line in lines:
        if not line:
            if "data" in frame:
                yield (frame.get("id"), frame.get("event"), frame["data"])
            frame = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            frame[key] = value[1:] if value.startswith(" ") else value


def join_frames(base: str, thread_id: str, run_id: str, last_id: str | None, on_frame=None):
    """The run's join stream from `base` as (id, event, data) frames, until it ends or is cut
    (a stopping process cuts its streams, so clients reconnect)."""
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    frames = []
    with httpx.stream(
        "GET", f"{base}/threads/{thread_id}/runs/{run_id}/stream", headers=headers, timeout=60
    ) as response:
        assert response.status_code == 200
        try:
            for frame in read_sse(response.iter_lines()):
                frames.append(frame)
                if on_frame:
                    on_frame(frame)
        except httpx.RemoteProtocolError:
            pass
    return frames


def wait_for_run(base: str, thread_id: str, run_id: str, within: float) -> dict:
    deadline = time.monotonic() + within
    while True:
        run = httpx.get(f"{base}/threads/{thread_id}/runs/{run_id}", timeout=10).json()
        if run["status"] not in ("pending", "running") or time.monotonic() > deadline:
            return run
        time.sleep(0.1)


def test_sigterm_finishes_short_runs_hands_back_long_ones_and_ends_streams(two_processes):
    stopping, staying = two_processes
    a, b = stopping.base_url, staying.base_url
    short_thread, long_thread = new_thread(a), new_thread(a)
    # Claimed by the process they are created on (it has free slots).
    short = start_run(a, short_thread, delay_ms=300)
    long = start_run(a, long_thread, delay_ms=4000)

    first_seen = threading.Event()
    frames_before: list = []

    def follow():
        frames_before.extend(
            join_frames(a, long_thread, long["run_id"], "-1",
                        on_frame=lambda f: first_seen.set())
        )

    follower = threading.Thread(target=follow)
    follower.start()
    assert first_seen.wait(10), "the long run's stream on the stopping process sent nothing"

    stopping.proc.send_signal(signal.SIGTERM)
    sigterm = time.monotonic()
    # The stream it served ends at once (well before the grace), so its client can go on
    # elsewhere.
    follower.join(timeout=GRACE_SECS)
    assert not follower.is_alive(), "the stream was not ended by the stopping process"
    assert time.monotonic() - sigterm < GRACE_SECS

    # The process exits once its runs are finished or handed back.
    try:
        stopping.proc.wait(timeout=GRACE_SECS + 15)
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit after its shutdown grace\n"
                    + harness.tail(stopping.output()))
    assert stopping.proc.returncode == 0, harness.tail(stopping.output())
    log = stopping.output()

    # The short run finished on the stopping process, within the grace.
    done = wait_for_run(b, short_thread, short["run_id"], within=5)
    assert (done["status"], done.get("attempt", 1)) == ("success", 1), done

    # The long run was handed back and resumed by the other process at once: it ends long
    # before its lease would have run out.
    resumed = wait_for_run(b, long_thread, long["run_id"], within=30)
    assert resumed["status"] == "success", (resumed, harness.tail(log))
    assert time.monotonic() - sigterm < LEASE_SECS / 2
    assert "handing them back" in log, harness.tail(log)
    state = httpx.get(f"{b}/threads/{long_thread}/state", timeout=10).json()
    assert state["values"]["ticks"] == 2, state

    # The client resumes its stream on the other process from the last id it got: together
    # with what it had, exactly a replay from the start.
    last_id = frames_before[-1][0]
    after = join_frames(b, long_thread, long["run_id"], last_id)
    replay = join_frames(b, long_thread, long["run_id"], "-1")
    assert frames_before + after == replay
