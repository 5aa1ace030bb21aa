"""Python graphs, the rest of what LangGraph Platform offers them: graphs exported as factories
(given the run's config, or a context manager held open for the run), a node searching the
store by meaning, a state update into a subgraph's namespace, a cancel its blocked worker
cannot confirm, and the agent protocol v2 (the thread event stream and its commands) over a
Python graph's runs. On both backends, through the official client and the raw wire.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from test_thread_events import (
    ALL_CHANNELS, EventReader, check_envelopes, collect_until_completed, command, ended, events_of, new_thread, ok,
)


async def _thread(client) -> str:
    return (await client.threads.create())["thread_id"]


# --------------------------------------------------------------------------------------------
# factories and the store (projects/extras)
# --------------------------------------------------------------------------------------------


async def test_a_factory_builds_the_graph_from_the_assistants_config(extras_client):
    out = await extras_client.runs.wait(None, "from_config", input={"text": "world"})
    assert out == {"text": "hello, world"}
    assistant = await extras_client.assistants.create(
        "from_config", config={"configurable": {"greeting": "bonjour"}}
    )
    out = await extras_client.runs.wait(None, assistant["assistant_id"], input={"text": "monde"})
    assert out == {"text": "bonjour, monde"}


async def test_a_context_manager_factory_is_held_open_for_the_run(extras_client):
    thread = await _thread(extras_client)
    parts = [
        p async for p in extras_client.runs.stream(
            thread, "held_open", input={"text": ""}, stream_mode=["custom", "values"]
        )
    ]
    custom = [p.data for p in parts if p.event == "custom"]
    assert custom == [{"open": ["threads.create_run"]}], parts
    values = [p.data for p in parts if p.event == "values"]
    assert values[-1]["text"] == "opened for threads.create_run"


async def test_a_node_searches_the_store_by_meaning(extras_client):
    ns = ["docs"]
    await extras_client.store.put_item(ns, "cats", {"text": "cats purr and chase mice at night"})
    await extras_client.store.put_item(ns, "stocks", {"text": "stock markets fell sharply on monday"})
    await extras_client.store.put_item(ns, "soup", {"text": "a recipe for tomato soup with basil"})
    try:
        out = await extras_client.runs.wait(None, "recall", input={"text": "tomato basil soup"})
        found = out["found"]
        assert found[0]["key"] == "soup", found
        scores = [f["score"] for f in found]
        assert all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)
        # The same ranking the API's own search gives.
        direct = (await extras_client.store.search_items(ns, query="tomato basil soup", limit=3))["items"]
        assert [f["key"] for f in found] == [i["key"] for i in direct]
    finally:
        for key in ("cats", "stocks", "soup"):
            await extras_client.store.delete_item(ns, key)


async def test_update_state_into_a_subgraphs_namespace_then_resume(extras_client):
    """A subgraph stopped at an interrupt: `update_state` with the subgraph's checkpoint (its
    `child:<task>` namespace) writes its state as its node `after` would; the resumed run
    goes on from there. What the reference answers too (checked by hand against
    `langgraph dev` with the same graph)."""
    thread = await _thread(extras_client)
    out = await extras_client.runs.wait(thread, "nest", input={"text": "start"})
    assert out["__interrupt__"][0]["value"] == "value?"
    sub = (await extras_client.threads.get_state(thread, subgraphs=True))["tasks"][0]["state"]
    assert sub["checkpoint"]["checkpoint_ns"].startswith("child:")
    assert sub["values"] == {"text": "start"} and sub["next"] == ["ask"]
    written = await extras_client.threads.update_state(
        thread, {"text": "edited"}, checkpoint=sub["checkpoint"], as_node="after"
    )
    assert written["checkpoint"]["checkpoint_ns"] == sub["checkpoint"]["checkpoint_ns"]
    state = await extras_client.threads.get_state(thread, subgraphs=True)
    assert state["next"] == ["child"]
    assert state["tasks"][0]["state"]["values"] == {"text": "edited"}
    assert state["tasks"][0]["state"]["next"] == []
    assert await extras_client.runs.wait(thread, "nest", input=None) == {"text": "edited"}


async def test_a_cancel_its_blocked_worker_never_confirms_keeps_the_threads_values(extras_client):
    """A run whose node blocks its worker's event loop cannot confirm a cancel; the run ends
    after a grace period anyway, and the thread keeps the values of its last checkpoint (read
    through the other worker), not none. (Last in its module: the blocked worker stays
    blocked a while after.)"""
    thread = await _thread(extras_client)
    run = await extras_client.runs.create(thread, "blocker", input={"text": "before", "seconds": 14})

    async def started() -> bool:
        return (await extras_client.runs.get(thread, run["run_id"]))["status"] == "running"

    deadline = time.monotonic() + 20
    while not await started():
        assert time.monotonic() < deadline, "the run did not start"
        await asyncio.sleep(0.1)
    await asyncio.sleep(1)  # into its node, which blocks the loop
    await extras_client.runs.cancel(thread, run["run_id"], wait=True)
    assert (await extras_client.runs.get(thread, run["run_id"]))["status"] == "interrupted"
    got = await extras_client.threads.get(thread)
    assert got["values"] == {"text": "before", "seconds": 14}, got


async def test_a_reply_a_model_did_not_stream_is_on_the_messages_channel(extras_client):
    """Protocol v2 through the official client: a chat model that cannot stream answers whole,
    and its reply is on `messages` as a streamed one is (start, text, finish); the message the
    next node writes itself is not."""
    thread = await _thread(extras_client)
    async with extras_client.threads.stream(thread, assistant_id="quiet_model") as stream:
        seen: list[dict] = []
        task = asyncio.create_task(collect_until_completed(stream, seen))
        await asyncio.sleep(0.2)
        await stream.run.start(input={"messages": [{"role": "human", "content": "hi"}]})
        await asyncio.wait_for(task, 30)
    messages = [e["params"]["data"] for e in seen if e["method"] == "messages"]
    assert [m["event"] for m in messages] == [
        "message-start", "content-block-start", "content-block-delta", "content-block-finish", "message-finish"
    ], messages
    assert messages[3]["content"] == {"type": "text", "text": "quietly: hi"}, messages
    state = await extras_client.threads.get_state(thread)
    assert [m["content"] for m in state["values"]["messages"]] == ["hi", "quietly: hi", "noted"]
    assert messages[0]["id"] == state["values"]["messages"][1]["id"]


# --------------------------------------------------------------------------------------------
# protocol v2 over a Python graph (the reference's project, python_server)
# --------------------------------------------------------------------------------------------

AGENT_INPUT = {"messages": [{"role": "human", "content": "what is 2+3?"}]}


@pytest.fixture
def py_http(python_server):
    with httpx.Client(base_url=python_server.base_url, timeout=30) as http:
        yield http


def test_a_python_run_streams_protocol_events(python_server, py_http):
    """A thread stream opened first sees a Python agent run started by `run.start`: its
    lifecycle, the tool call, values, updates, tasks and checkpoints, in protocol shapes."""
    tid = new_thread(py_http)
    reader = EventReader(python_server.base_url, tid, {"channels": ALL_CHANNELS}, until=ended())
    ok(command(py_http, tid, "run.start", {"assistant_id": "agent", "input": AGENT_INPUT}))
    frames = reader.wait()
    check_envelopes(frames)
    life = events_of(frames, "lifecycle")
    assert life[0]["event"] == "running" and life[-1]["event"] == "completed", life
    tools = events_of(frames, "tools")
    assert [t["event"] for t in tools] == ["tool-started", "tool-finished"], tools
    assert tools[0]["tool_name"] == "add" and tools[0]["input"] == {"a": 2, "b": 3}
    values = events_of(frames, "values")
    assert values[-1]["messages"][-1]["content"] == "The sum is 5."
    updates = [f["data"]["params"] for f in frames if f["data"]["method"] == "updates"]
    assert {u["node"] for u in updates} >= {"model", "tools"}, updates
    assert events_of(frames, "tasks"), "no tasks events"
    checkpoints = events_of(frames, "checkpoints")
    assert checkpoints and all(isinstance(c["id"], str) for c in checkpoints)


def test_a_python_interrupt_is_answered_through_input_respond(python_server, py_http):
    """`approval` stops with `input.requested`; `input.respond` resumes it on the same stream;
    `state.get` then reads the Python graph's state through its worker."""
    tid = new_thread(py_http)
    reader = EventReader(python_server.base_url, tid, {"channels": ALL_CHANNELS}, until=ended(2))
    ok(command(py_http, tid, "run.start", {"assistant_id": "approval", "input": AGENT_INPUT}))
    deadline = time.monotonic() + 30
    while not events_of(reader.frames, "input.requested") and time.monotonic() < deadline:
        time.sleep(0.05)
    [asked] = events_of(reader.frames, "input.requested")
    assert asked["payload"] == {"question": "approve?"}, asked
    ok(command(py_http, tid, "input.respond",
               {"namespace": [], "interrupt_id": asked["interrupt_id"], "response": "yes"}, cid=2))
    frames = reader.wait()
    check_envelopes(frames)
    assert [e["event"] for e in events_of(frames, "lifecycle")] == [
        "running", "interrupted", "running", "completed"
    ]
    state = ok(command(py_http, tid, "state.get", {"namespace": []}, cid=3))
    assert state["values"]["messages"][-1]["content"] == "decision: yes"
    listed = ok(command(py_http, tid, "state.listCheckpoints", {"limit": 2}, cid=4))["checkpoints"]
    assert listed[0]["id"] == state["checkpoint"]["id"]
