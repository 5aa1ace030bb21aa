"""What a thread's history keeps, through the official Python client: a copy carries it whole,
a rolled-back run takes its part with it, deleting an assistant stops and removes its runs,
and a run names its graph and assistant in its thread's metadata (which UIs list by)."""

from __future__ import annotations

import asyncio

import pytest
from e2e_util import assert_status, default_assistant_id
from langgraph_sdk.errors import NotFoundError


def texts(values: dict) -> list[str]:
    return [m["content"] for m in values["messages"]]


async def test_a_copy_behaves_as_its_original(client, tag):
    """The copy has the original's state, history (same checkpoint ids), graph and metadata;
    `update_state` and the next run work on it as on the original, and deleting the original
    leaves it whole."""
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    await client.runs.wait(tid, "echo", input={"messages": [{"role": "user", "content": "one"}]})
    copy = await client.threads.copy(tid)
    cid = copy["thread_id"]
    original = await client.threads.get(tid)
    assert copy["metadata"] == original["metadata"]
    assert copy["metadata"]["graph_id"] == "echo"

    state = await client.threads.get_state(cid)
    assert texts(state["values"]) == ["one", "echo: one"]
    assert state["checkpoint"]["thread_id"] == cid
    assert state["checkpoint_id"] == (await client.threads.get_state(tid))["checkpoint_id"]
    ids = lambda h: [s["checkpoint_id"] for s in h]  # noqa: E731
    assert ids(await client.threads.get_history(cid)) == ids(await client.threads.get_history(tid))
    assert len(await client.threads.get_history(cid)) >= 2

    await client.threads.delete(tid)
    assert texts((await client.threads.get_state(cid))["values"]) == ["one", "echo: one"]
    await client.threads.update_state(
        cid, {"messages": [{"role": "user", "content": "edited"}]}, as_node="respond"
    )
    assert texts((await client.threads.get_state(cid))["values"])[-1] == "edited"
    result = await client.runs.wait(
        cid, "echo", input={"messages": [{"role": "user", "content": "two"}]}
    )
    assert texts(result) == ["one", "echo: one", "edited", "two", "echo: two"]


async def slow_turn_rolled_back(client, tid: str, roll_back) -> str:
    """Starts a `slow` run (two steps of 1 s), rolls it back once its first step is saved, and
    answers its id."""
    run = await client.runs.create(tid, "slow", input={"delay_ms": 1000})
    await asyncio.sleep(1.5)
    history = await client.threads.get_history(tid, limit=20)
    assert any(s["metadata"].get("run_id") == run["run_id"] for s in history), (
        "the run saved a step before it was rolled back"
    )
    await roll_back(run)
    return run["run_id"]


@pytest.mark.parametrize("how", ["multitask_strategy", "cancel"])
async def test_a_rolled_back_run_takes_its_checkpoints(client, tag, http, how):
    """A run rolled back while it runs (`multitask_strategy: rollback`, or cancel with
    `action=rollback`) goes with its checkpoints: the next run continues from the state before
    it (each `slow` run adds 2 ticks: 2 + 2, not 2 + 1 + 2), and GET on it is 404."""
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    assert (await client.runs.wait(tid, "slow", input={"delay_ms": 0}))["ticks"] == 2
    before = [s["checkpoint_id"] for s in await client.threads.get_history(tid, limit=50)]
    next_run = {}

    async def roll_back(run):
        if how == "multitask_strategy":
            next_run["run"] = await client.runs.create(
                tid, "slow", input={"delay_ms": 0}, multitask_strategy="rollback"
            )
        else:
            await client.runs.cancel(tid, run["run_id"], wait=True, action="rollback")

    rolled_back = await slow_turn_rolled_back(client, tid, roll_back)
    if "run" in next_run:
        result = await client.runs.join(tid, next_run["run"]["run_id"])
    else:
        assert [s["checkpoint_id"] for s in await client.threads.get_history(tid, limit=50)] == before
        result = await client.runs.wait(tid, "slow", input={"delay_ms": 0})
    assert result["ticks"] == 4
    assert_status(http.get(f"/threads/{tid}/runs/{rolled_back}"), 404)
    history = await client.threads.get_history(tid, limit=50)
    assert not [s for s in history if s["metadata"].get("run_id") == rolled_back]
    # Nothing the rolled-back run's worker did afterwards lands on the thread.
    await asyncio.sleep(1.2)
    assert (await client.threads.get_state(tid))["values"]["ticks"] == 4


@pytest.mark.spindle_only
async def test_deleting_an_assistant_stops_and_removes_its_runs(client, tag, http):
    """Deleting an assistant cancels its active runs and deletes its runs; their threads stay
    with their state (the reference keeps threads too), and `?delete_threads=true` deletes the
    threads whose metadata names it. (The reference leaves its runs running.)"""
    assistant = await client.assistants.create("slow", metadata={"tag": tag})
    aid = assistant["assistant_id"]
    done_tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    done = await client.runs.create(done_tid, aid, input={"delay_ms": 0})
    await client.runs.join(done_tid, done["run_id"])
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    live = await client.runs.create(tid, aid, input={"delay_ms": 1000})
    await asyncio.sleep(0.3)

    await client.assistants.delete(aid)
    with pytest.raises(NotFoundError):
        await client.assistants.get(aid)
    for thread, run in [(tid, live), (done_tid, done)]:
        assert_status(http.get(f"/threads/{thread}/runs/{run['run_id']}"), 404)
    assert (await client.threads.get(tid))["status"] == "idle"
    assert (await client.threads.get_state(done_tid))["values"]["ticks"] == 2
    # The stopped run saves nothing more.
    await asyncio.sleep(2.2)
    assert (await client.threads.get(tid))["status"] == "idle"
    history = await client.threads.get_history(tid, limit=50)
    assert not [s for s in history if s["metadata"].get("step", -1) >= 1]

    # With its threads.
    other = await client.assistants.create("slow", metadata={"tag": tag})
    oid = other["assistant_id"]
    named = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    run = await client.runs.create(named, oid, input={"delay_ms": 1000})
    kept = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    await asyncio.sleep(0.3)
    await client.assistants.delete(oid, delete_threads=True)
    assert_status(http.get(f"/threads/{named}"), 404)
    assert_status(http.get(f"/threads/{named}/runs/{run['run_id']}"), 404)
    assert (await client.threads.get(kept))["thread_id"] == kept


async def test_a_run_names_its_graph_and_assistant_in_its_thread(client, tag):
    """A run on an existing thread writes `graph_id` and `assistant_id` into the thread's
    metadata, over what was there (as the reference), so a UI listing a graph's threads by
    metadata finds it."""
    tid = (await client.threads.create(metadata={"tag": tag, "graph_id": "old"}))["thread_id"]
    await client.runs.wait(tid, "echo", input={"messages": [{"role": "user", "content": "hi"}]})
    metadata = (await client.threads.get(tid))["metadata"]
    assert metadata["graph_id"] == "echo"
    assert metadata["assistant_id"] == default_assistant_id("echo")
    assert metadata["tag"] == tag
    found = await client.threads.search(metadata={"graph_id": "echo", "tag": tag})
    assert [t["thread_id"] for t in found] == [tid]
    found = await client.threads.search(
        metadata={"assistant_id": default_assistant_id("echo"), "tag": tag}
    )
    assert [t["thread_id"] for t in found] == [tid]

    assistant = await client.assistants.create("chain")
    await client.runs.wait(tid, assistant["assistant_id"], input={"n": 0})
    metadata = (await client.threads.get(tid))["metadata"]
    assert metadata["graph_id"] == "chain"
    assert metadata["assistant_id"] == assistant["assistant_id"]
