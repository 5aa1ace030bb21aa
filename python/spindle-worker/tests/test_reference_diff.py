"""Differential checks: the same graph, input and stream modes on the reference server
(`langgraph dev`) and on a worker behind the fake Spindle give the same events.

Ids, timestamps and config-derived metadata differ by construction and are normalised
away; everything else (event names, order, payloads) must match. The reference is found
through $SPINDLE_REF_LANGGRAPH (a `langgraph` executable), then `langgraph` on PATH; the
test is skipped, saying so, when neither is there.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import REF_DIR, new_run, new_thread, ref_worker, run_async

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# `metadata` copies the run config (assistant, user, server versions): Spindle's differs by design.
VOLATILE_KEYS = {"metadata", "id", "run_id", "thread_id", "checkpoint_id", "parent_checkpoint_id", "timestamp", "ts", "created_at"}


def _langgraph_cli() -> str | None:
    found = os.environ.get("SPINDLE_REF_LANGGRAPH") or shutil.which("langgraph")
    if found and Path(found).exists():
        return found
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    cli = _langgraph_cli()
    if cli is None:
        if os.environ.get("SPINDLE_TEST_REQUIRE_REFERENCE"):
            pytest.fail("SPINDLE_TEST_REQUIRE_REFERENCE is set but no reference `langgraph` CLI was found")
        pytest.skip("reference server unavailable: set SPINDLE_REF_LANGGRAPH to a `langgraph` CLI "
                    "with the inmem extra (pip install 'langgraph-cli[inmem]'), or put it on PATH")
    project = Path(tempfile.mkdtemp(prefix="spindle-ref-")) / "ref"
    shutil.copytree(REF_DIR, project)
    port = _free_port()
    log = open(project / "server.log", "wb")
    proc = subprocess.Popen(
        [cli, "dev", "--no-browser", "--no-reload", "--port", str(port)],
        cwd=project, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "LANGSMITH_TRACING": "false", "LANGGRAPH_NO_VERSION_CHECK": "true"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                if httpx.get(f"{url}/ok", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"reference server did not start: {(project / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the session we started, by its id
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def reference_stream(url: str, graph_id: str, body: dict[str, Any], thread_id: str | None = None) -> tuple[str, list[tuple[str, Any]]]:
    with httpx.Client(base_url=url, timeout=60) as client:
        if thread_id is None:
            thread_id = client.post("/threads", json={}).json()["thread_id"]
        events: list[tuple[str, Any]] = []
        # The API calls the subgraphs flag `stream_subgraphs`.
        api_body = {("stream_subgraphs" if k == "subgraphs" else k): v for k, v in body.items()}
        with client.stream("POST", f"/threads/{thread_id}/runs/stream", json={"assistant_id": graph_id, **api_body}) as r:
            r.raise_for_status()
            name, data = None, []
            for line in r.iter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and name is not None:
                    events.append((name, orjson.loads("\n".join(data)) if data else None))
                    name, data = None, []
    return thread_id, events


def normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<volatile>" if k in VOLATILE_KEYS else normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, str):
        return UUID_RE.sub("<uuid>", value)
    return value


def comparable(events: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Spindle's own events (`metadata`, `error`) left out; names and payloads normalised."""
    return [(UUID_RE.sub("<uuid>", n), p if n == "events" else normalise(p)) for n, p in events if n not in ("metadata", "error")]


async def worker_stream(graph_id: str, body: dict[str, Any], spindle=None, worker=None, thread: str | None = None):
    run = new_run()
    thread = thread or new_thread()
    kw = {k: v for k, v in body.items() if k in ("input", "command", "stream_mode", "subgraphs")}
    await worker.start_run(run, graph_id, thread, **kw)
    done = await spindle.wait_done(run)
    events = [(n, orjson.loads(d)) for n, d in spindle.events[run]]
    return thread, events, done


CASES = [
    ("echo", {"input": {"messages": [{"role": "user", "content": "hi"}]}, "stream_mode": ["values", "updates"]}),
    ("chain", {"input": {"n": 0}, "stream_mode": ["values", "updates", "tasks"]}),
    ("agent", {"input": {"messages": [{"role": "user", "content": "add"}]}, "stream_mode": ["updates", "values"]}),
    ("fanout", {"input": {"items": ["a", "b", "c"]}, "stream_mode": ["updates", "values"]}),
    ("nested", {"input": {"messages": [{"role": "user", "content": "x"}]}, "stream_mode": ["updates", "values"]}),
    ("nested", {"input": {"messages": [{"role": "user", "content": "x"}]}, "stream_mode": ["updates"], "subgraphs": True}),
    ("slow", {"input": {"delay_ms": 1, "ticks": 0}, "stream_mode": ["custom", "updates"]}),
    ("approval", {"input": {"messages": [{"role": "user", "content": "go"}]}, "stream_mode": ["values", "updates"]}),
]
# Modes whose payloads carry run-specific metadata: only names and message contents are compared.
MESSAGE_CASES = [
    ("echo", {"input": {"messages": [{"role": "user", "content": "hi"}]}, "stream_mode": ["messages-tuple"]}),
    ("agent", {"input": {"messages": [{"role": "user", "content": "add"}]}, "stream_mode": ["messages"]}),
    ("nested", {"input": {"messages": [{"role": "user", "content": "x"}]}, "stream_mode": ["messages-tuple"], "subgraphs": True}),
    ("chain", {"input": {"n": 0}, "stream_mode": ["debug", "checkpoints"]}),
    ("echo", {"input": {"messages": [{"role": "user", "content": "hi"}]}, "stream_mode": ["events", "values"]}),
]


@pytest.mark.parametrize("graph_id,body", CASES, ids=[f"{g}-{'+'.join(b['stream_mode'])}{'-sub' if b.get('subgraphs') else ''}" for g, b in CASES])
@run_async
async def test_same_events_as_reference(reference: str, graph_id: str, body: dict[str, Any]) -> None:
    _, expected = reference_stream(reference, graph_id, body)
    spindle, worker = await ref_worker()
    _, got, _ = await worker_stream(graph_id, body, spindle, worker)
    await worker.close()
    assert comparable(got) == comparable(expected)


def _shape(name: str, payload: Any) -> Any:
    if name.startswith("messages/metadata"):
        return name
    if name.startswith("messages/"):
        return name, [m.get("content") for m in payload]
    if name.startswith("messages"):
        return name, payload[0].get("content"), payload[1].get("langgraph_node")
    if name == "events":
        return name, payload["event"], payload["name"], payload.get("metadata", {}).get("langgraph_node")
    if name.startswith(("debug", "checkpoints")):
        return name, payload.get("type"), sorted(payload) if isinstance(payload, dict) else None
    return name


@pytest.mark.parametrize("graph_id,body", MESSAGE_CASES, ids=[f"{g}-{'+'.join(b['stream_mode'])}" for g, b in MESSAGE_CASES])
@run_async
async def test_same_message_and_debug_events_as_reference(reference: str, graph_id: str, body: dict[str, Any]) -> None:
    _, expected = reference_stream(reference, graph_id, body)
    spindle, worker = await ref_worker()
    _, got, _ = await worker_stream(graph_id, body, spindle, worker)
    await worker.close()
    assert [_shape(n, p) for n, p in comparable(got)] == [_shape(n, p) for n, p in comparable(expected)]


@run_async
async def test_error_and_resume_as_reference(reference: str) -> None:
    body = {"input": {"n": 0}, "stream_mode": ["values"]}
    _, expected = reference_stream(reference, "fail", body)
    spindle, worker = await ref_worker()
    _, got, done = await worker_stream("fail", body, spindle, worker)
    assert comparable(got) == comparable(expected)
    assert expected[-1] == ("error", done["error"])

    start = {"input": {"messages": [{"role": "user", "content": "go"}]}, "stream_mode": ["values"]}
    resume = {"command": {"resume": "yes"}, "stream_mode": ["values", "updates"]}
    ref_thread, _ = reference_stream(reference, "approval", start)
    _, expected = reference_stream(reference, "approval", resume, thread_id=ref_thread)
    thread, _, _ = await worker_stream("approval", start, spindle, worker)
    _, got, _ = await worker_stream("approval", resume, spindle, worker, thread=thread)
    await worker.close()
    assert comparable(got) == comparable(expected)


@run_async
async def test_state_and_graph_reads_as_reference(reference: str) -> None:
    start = {"input": {"messages": [{"role": "user", "content": "go"}]}, "stream_mode": ["values"]}
    ref_thread, _ = reference_stream(reference, "approval", start)
    spindle, worker = await ref_worker()
    thread, _, _ = await worker_stream("approval", start, spindle, worker)
    with httpx.Client(base_url=reference, timeout=30) as client:
        ref_state = client.get(f"/threads/{ref_thread}/state").json()
        ref_history = client.post(f"/threads/{ref_thread}/history", json={"limit": 10}).json()
        ref_draw = client.get("/assistants/nested/graph", params={"xray": "true"}).json()
        assistant = client.post("/assistants/search", json={"graph_id": "nested"}).json()[0]["assistant_id"]
        ref_subgraphs = client.get(f"/assistants/{assistant}/subgraphs", params={"recurse": "true"}).json()
        ref_schemas = client.get(f"/assistants/{assistant}/schemas").json()
    config = {"configurable": {"thread_id": thread}}
    state = orjson.loads(await worker.request("state.get", {"graph_id": "approval", "config": config}))
    history = [orjson.loads(h) for h in await worker.request("state.history", {"graph_id": "approval", "config": config, "limit": 10})]
    draw = orjson.loads(await worker.request("graph.draw", {"graph_id": "nested", "config": {}, "xray": True}))
    subgraphs = orjson.loads(await worker.request("graph.subgraphs", {"graph_id": "nested", "config": {}, "recurse": True}))
    schemas = await worker.request("graph.schemas", {"graph_id": "nested", "config": {}})
    await worker.close()

    def lg_meta(s: dict) -> dict:
        # Checkpoint metadata also copies the run's config (assistant, user, versions): compare LangGraph's part.
        return {k: s["metadata"][k] for k in ("source", "step", "parents") if k in s["metadata"]}

    assert normalise(state) == normalise(ref_state) and lg_meta(state) == lg_meta(ref_state)
    assert [normalise(h) for h in history] == [normalise(h) for h in ref_history]
    assert [lg_meta(h) for h in history] == [lg_meta(h) for h in ref_history]
    assert draw == ref_draw
    assert subgraphs == ref_subgraphs
    ours = {f"{k}_schema": orjson.loads(v) if v is not None else None for k, v in schemas.items()}
    assert ours == {k: ref_schemas[k] for k in ours}
