"""Following runs that are already under way: the thread join stream, joining a run's stream
mid-run with `Last-Event-ID`, stateless run streams by id, what a client disconnect does
(`on_disconnect`), and the rollback strategy."""

from __future__ import annotations

import json
import threading
import time

import httpx
from e2e_util import assert_status, assert_validation_error, describe


def parse_frames(text: str) -> list[dict]:
    """SSE frames (CRLF-framed) as dicts {event, data, id}; keepalive comments dropped."""
    frames = []
    for raw in text.split("\r\n\r\n"):
        frame: dict = {}
        for line in raw.split("\r\n"):
            if line.startswith("event: "):
                frame["event"] = line[7:]
            elif line.startswith("data: "):
                frame["data"] = json.loads(line[6:])
            elif line.startswith("id: "):
                frame["id"] = int(line[4:])
        if "event" in frame:
            frames.append(frame)
    return frames


class StreamReader:
    """Reads an SSE response in a background thread until `stop()` or `until` holds."""

    def __init__(self, base_url: str, path: str, headers: dict | None = None, until=None):
        self.frames: list[dict] = []
        self.status: int | None = None
        self.opened = threading.Event()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._until = until
        self._thread = threading.Thread(target=self._read, args=(base_url, path, headers or {}), daemon=True)
        self._thread.start()
        assert self.opened.wait(10), "the stream did not open"

    def _read(self, base_url: str, path: str, headers: dict) -> None:
        buffer = ""
        with httpx.Client(base_url=base_url, timeout=30) as http:
            with http.stream("GET", path, headers=headers) as r:
                self.status = r.status_code
                self.opened.set()
                for chunk in r.iter_text():
                    buffer += chunk
                    while "\r\n\r\n" in buffer:
                        raw, buffer = buffer.split("\r\n\r\n", 1)
                        self.frames.extend(parse_frames(raw + "\r\n\r\n"))
                    if self._stop.is_set() or (self._until and self._until(self.frames)):
                        break
        self.done.set()

    def wait(self, timeout: float = 15) -> list[dict]:
        assert self.done.wait(timeout), f"the stream did not finish: {self.frames}"
        return self.frames


def run_done(frames: list[dict], run_id: str) -> bool:
    return any(f["event"] == "metadata" and f["data"].get("status") == "run_done" and f["data"].get("run_id") == run_id for f in frames)


async def test_thread_stream_carries_every_run_of_the_thread(client, tag, base_url):
    """`GET /threads/{id}/stream` opened before any run sees the runs started afterwards: each
    run's `metadata`, its events, and `metadata {status: run_done}`, with increasing ids."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    state = {}
    reader = StreamReader(base_url, f"/threads/{tid}/stream", until=lambda fs: "second" in state and run_done(fs, state["second"]))
    assert reader.status == 200
    first = await client.runs.wait(tid, "chain", input={"n": 0})
    assert first == {"n": 3}
    second = await client.runs.create(tid, "chain", input={"n": 10}, stream_mode=["updates"])
    state["second"] = second["run_id"]
    frames = reader.wait()
    ids = [f["id"] for f in frames]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), frames
    starts = [f["data"]["run_id"] for f in frames if f["event"] == "metadata" and "attempt" in f["data"]]
    assert len(starts) == 2 and starts[1] == second["run_id"], frames
    assert [f["data"] for f in frames if f["event"] == "updates"] == [{"a": {"n": 11}}, {"b": {"n": 12}}, {"c": {"n": 13}}]
    done = [f["data"]["run_id"] for f in frames if f["data"].get("status") == "run_done"]
    assert done == starts, frames


async def test_thread_stream_lifecycle_and_resume(client, tag, base_url):
    """`stream_mode=lifecycle` sends only run starts and ends; `Last-Event-ID` replays the
    thread's log after that id, across runs."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    runs = [await client.runs.wait(tid, "chain", input={"n": i}) for i in range(2)]
    assert runs == [{"n": 3}, {"n": 4}]
    everything = StreamReader(base_url, f"/threads/{tid}/stream", headers={"Last-Event-ID": "-1"}, until=lambda fs: sum(f["data"].get("status") == "run_done" for f in fs) == 2).wait()
    assert everything[0]["event"] == "metadata"
    resumed = StreamReader(
        base_url,
        f"/threads/{tid}/stream?stream_mode=lifecycle",
        headers={"Last-Event-ID": str(everything[0]["id"])},
        until=lambda fs: sum(f["data"].get("status") == "run_done" for f in fs) == 2,
    ).wait()
    assert {f["event"] for f in resumed} == {"metadata"}, resumed
    assert [f["id"] for f in resumed] == [f["id"] for f in everything[1:] if f["event"] == "metadata"]


async def test_thread_stream_refuses_unknown_modes_and_other_threads(http):
    import uuid

    r = http.get(f"/threads/{uuid.uuid4()}/stream")
    assert_status(r, 404)
    tid = http.post("/threads", json={}).json()["thread_id"]
    r = http.get(f"/threads/{tid}/stream?stream_modes=bogus")
    assert_validation_error(r, "query", "stream_modes")


async def test_join_stream_mid_run_resumes_without_gap(client, tag, http, base_url):
    """Joining a running run's stream with `Last-Event-ID` gives the events after it, then the
    live ones, each once; the whole stream equals a replay from the start."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await client.runs.create(tid, "slow", input={"delay_ms": 400, "ticks": 0}, stream_mode=["values", "custom"])
    path = f"/threads/{tid}/runs/{run['run_id']}/stream"
    first = StreamReader(base_url, path, until=lambda fs: any(f["event"] == "custom" for f in fs)).wait()
    last = first[-1]["id"]
    rest = StreamReader(base_url, path, headers={"Last-Event-ID": str(last)}).wait()
    assert all(f["id"] > last for f in rest)
    replay = parse_frames(http.get(path, headers={"Last-Event-ID": "-1"}).text)
    assert first + rest == replay, (first, rest, replay)
    assert replay[-1]["data"] == {"delay_ms": 400, "ticks": 2}


async def test_stateless_run_stream_by_run_id(client, http):
    """`GET /runs/{run_id}/stream` (what the JS client calls) replays a run found by id alone."""
    run = await client.runs.create(None, "chain", input={"n": 0}, on_completion="keep")
    await client.runs.join(run["thread_id"], run["run_id"])
    frames = parse_frames(http.get(f"/runs/{run['run_id']}/stream").text)
    assert frames[0]["event"] == "metadata" and frames[-1]["data"] == {"n": 3}, frames
    import uuid

    assert_status(http.get(f"/runs/{uuid.uuid4()}/stream"), 404)


async def test_disconnect_cancels_the_run_by_default(client, tag, base_url):
    """A client that leaves a run stream (`on_disconnect` cancel, the interface's default)
    stops the run within a second: it ends `interrupted` before its slow node finishes."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run_id = leave_stream_early(base_url, tid, {})
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        run = await client.runs.get(tid, run_id)
        if run["status"] == "interrupted":
            break
        time.sleep(0.05)
    assert run["status"] == "interrupted", run
    assert (await client.threads.get(tid))["status"] != "busy"


async def test_disconnect_with_continue_leaves_the_run_running(client, tag, base_url):
    """With `on_disconnect=continue` the run finishes after its client left."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run_id = leave_stream_early(base_url, tid, {"on_disconnect": "continue"})
    assert await client.runs.join(tid, run_id) == {"delay_ms": 1500, "ticks": 2}
    assert (await client.runs.get(tid, run_id))["status"] == "success"


def leave_stream_early(base_url: str, tid: str, extra: dict) -> str:
    """Starts a `slow` run through the stream endpoint, reads its first event and hangs up."""
    body = {"assistant_id": "slow", "input": {"delay_ms": 1500, "ticks": 0}, **extra}
    with httpx.Client(base_url=base_url, timeout=10) as http:
        with http.stream("POST", f"/threads/{tid}/runs/stream", json=body) as r:
            assert r.status_code == 200, describe(r)
            run_id = r.headers["content-location"].rsplit("/", 1)[1]
            for chunk in r.iter_text():
                if "event: metadata" in chunk:
                    break
    return run_id


async def test_rollback_strategy_deletes_the_running_run(client, tag, http):
    """`multitask_strategy=rollback` stops the running run and deletes it with what it wrote
    (GET on it is 404); the new run runs on the state from before it, at once: the rolled-back
    run's end wakes the workers (on PostgreSQL it once did not, and the new run waited for the
    old one's lease to run out, 30 s)."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    assert await client.runs.wait(tid, "chain", input={"n": 0}) == {"n": 3}
    slow = await client.runs.create(tid, "slow", input={"delay_ms": 1500, "ticks": 0})
    time.sleep(0.3)
    new = await client.runs.create(tid, "chain", input={"n": 100}, multitask_strategy="rollback")
    created = time.monotonic()
    assert await client.runs.join(tid, new["run_id"]) == {"n": 103}
    # Stopped within its node's sleep (1.5 s), then claimed: far below the lease (30 s).
    assert time.monotonic() - created < 10, "the new run waited for the old run's lease"
    assert_status(http.get(f"/threads/{tid}/runs/{slow['run_id']}"), 404)
    listed = [r["run_id"] for r in await client.runs.list(tid)]
    assert slow["run_id"] not in listed and new["run_id"] in listed


async def test_cancel_many_by_status(client, tag, http):
    """`POST /runs/cancel {status}` stops every active run of the caller with that status, in
    any thread; it cannot be combined with `thread_id`/`run_ids`."""
    threads = [(await client.threads.create(metadata={"tag": tag}))["thread_id"] for _ in range(2)]
    runs = [await client.runs.create(tid, "slow", input={"delay_ms": 3000, "ticks": 0}) for tid in threads]
    queued = await client.runs.create(threads[0], "chain", input={"n": 0})
    r = http.post("/runs/cancel", json={"status": "pending", "thread_id": threads[0]})
    assert_validation_error(r, "body", "thread_id")
    r = http.post("/runs/cancel", json={"status": "bogus"})
    assert_validation_error(r, "body", "status")
    await client.runs.cancel_many(status="all")
    for tid, run in [(threads[0], runs[0]), (threads[1], runs[1]), (threads[0], queued)]:
        await client.runs.join(tid, run["run_id"])
        assert (await client.runs.get(tid, run["run_id"]))["status"] == "interrupted"
