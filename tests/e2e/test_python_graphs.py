"""LangGraph Python graphs served unchanged: the reference server's own project
(``../shared/ref/langgraph.json``) run by Spindle's Python workers, driven by the official client,
on both backends. What a client relies on: runs wait and stream as on LangGraph Platform, state
and history read back with LangGraph's own types as JSON, interrupts resume, errors name the
exception.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest


async def _thread(client) -> str:
    return (await client.threads.create())["thread_id"]


async def test_a_python_graph_runs_and_its_thread_keeps_the_state(python_client):
    thread = await _thread(python_client)
    out = await python_client.runs.wait(thread, "chain", input={"n": 1})
    assert out == {"n": 4}
    # The next run starts from the thread's state, as LangGraph's checkpointer gives it back.
    out = await python_client.runs.wait(thread, "chain", input={"n": 10})
    assert out == {"n": 13}
    state = await python_client.threads.get_state(thread)
    assert state["values"] == {"n": 13}
    assert state["next"] == []
    got = await python_client.threads.get(thread)
    assert got["status"] == "idle"
    assert got["values"] == {"n": 13}


async def test_messages_come_back_as_langchain_messages_in_json(python_client):
    thread = await _thread(python_client)
    out = await python_client.runs.wait(
        thread, "echo", input={"messages": [{"type": "human", "content": "hi"}]}
    )
    messages = out["messages"]
    assert [m["type"] for m in messages] == ["human", "ai"]
    assert messages[1]["content"] == "echo: hi"
    # A second turn adds to the history the checkpoint kept (add_messages on real messages).
    out = await python_client.runs.wait(
        thread, "echo", input={"messages": [{"type": "human", "content": "again"}]}
    )
    assert [m["content"] for m in out["messages"]] == ["hi", "echo: hi", "again", "echo: again"]
    assert all(m["id"] for m in out["messages"])


async def test_stream_modes_values_and_updates(python_client):
    thread = await _thread(python_client)
    chunks = [
        c
        async for c in python_client.runs.stream(
            thread, "chain", input={"n": 0}, stream_mode=["values", "updates"]
        )
    ]
    events = [c.event for c in chunks]
    assert events[0] == "metadata"
    values = [c.data for c in chunks if c.event == "values"]
    updates = [c.data for c in chunks if c.event == "updates"]
    assert values == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]
    assert updates == [{"a": {"n": 1}}, {"b": {"n": 2}}, {"c": {"n": 3}}]


async def test_an_interrupt_waits_and_a_resume_finishes_it(python_client):
    thread = await _thread(python_client)
    out = await python_client.runs.wait(
        thread, "approval", input={"messages": [{"type": "human", "content": "deploy"}]}
    )
    assert out["__interrupt__"][0]["value"] == {"question": "approve?"}
    state = await python_client.threads.get_state(thread)
    assert state["next"] == ["ask"]
    assert state["tasks"][0]["interrupts"][0]["value"] == {"question": "approve?"}
    got = await python_client.threads.get(thread)
    assert got["status"] == "interrupted"
    assert list(got["interrupts"].values())[0][0]["value"] == {"question": "approve?"}

    out = await python_client.runs.wait(thread, "approval", command={"resume": "yes"})
    assert out["messages"][-1]["content"] == "decision: yes"
    assert (await python_client.threads.get(thread))["status"] == "idle"


async def test_history_lists_every_step_newest_first(python_client):
    thread = await _thread(python_client)
    await python_client.runs.wait(thread, "chain", input={"n": 0})
    history = await python_client.threads.get_history(thread, limit=10)
    assert [h["values"].get("n") for h in history] == [3, 2, 1, 0, None]
    assert [h["metadata"]["step"] for h in history] == [3, 2, 1, 0, -1]
    assert history[0]["next"] == [] and history[1]["next"] == ["c"]
    # A past checkpoint reads back alone.
    past = history[2]["checkpoint"]
    state = await python_client.threads.get_state(thread, checkpoint=past)
    assert state["values"] == {"n": 1}


async def test_a_tool_calling_agent_runs_to_its_answer(python_client):
    thread = await _thread(python_client)
    out = await python_client.runs.wait(
        thread, "agent", input={"messages": [{"type": "human", "content": "what is 2+3?"}]}
    )
    kinds = [m["type"] for m in out["messages"]]
    assert kinds == ["human", "ai", "tool", "ai"]
    assert out["messages"][1]["tool_calls"][0]["name"] == "add"
    assert out["messages"][-1]["content"] == "The sum is 5."


async def test_a_graph_that_raises_ends_the_run_with_its_exception(python_client):
    thread = await _thread(python_client)
    chunks = [c async for c in python_client.runs.stream(thread, "fail", input={})]
    errors = [c.data for c in chunks if c.event == "error"]
    assert errors and errors[0]["error"] == "ValueError"
    assert "boom" in errors[0]["message"]
    runs = await python_client.runs.list(thread)
    assert runs[0]["status"] == "error"
    assert (await python_client.threads.get(thread))["status"] == "error"


async def test_fan_out_with_send_keeps_the_items_order(python_client):
    thread = await _thread(python_client)
    out = await python_client.runs.wait(thread, "fanout", input={"items": ["a", "b", "c"]})
    assert out["results"] == ["A", "B", "C"]


async def test_subgraph_events_stream_with_their_namespace(python_client):
    thread = await _thread(python_client)
    chunks = [
        c
        async for c in python_client.runs.stream(
            thread,
            "nested",
            input={"messages": [{"type": "human", "content": "go"}]},
            stream_mode="updates",
            stream_subgraphs=True,
        )
    ]
    names = [c.event for c in chunks if c.event.startswith("updates")]
    assert "updates" in names
    assert any(n.startswith("updates|child:") for n in names), names
    final = await python_client.threads.get_state(thread)
    assert [m["content"] for m in final["values"]["messages"]] == ["go", "prep", "c1", "c2"]


async def test_custom_events_stream_as_the_graph_writes_them(python_client):
    thread = await _thread(python_client)
    chunks = [
        c
        async for c in python_client.runs.stream(
            thread, "slow", input={"delay_ms": 1, "ticks": 0}, stream_mode="custom"
        )
    ]
    assert [c.data for c in chunks if c.event == "custom"] == [{"tick": "a"}, {"tick": "b"}]


async def test_a_background_run_is_joined_with_its_final_values(python_client):
    thread = await _thread(python_client)
    run = await python_client.runs.create(thread, "chain", input={"n": 5})
    assert await python_client.runs.join(thread, run["run_id"]) == {"n": 8}
    assert (await python_client.runs.get(thread, run["run_id"]))["status"] == "success"


async def test_a_cancelled_python_run_stops(python_client):
    thread = await _thread(python_client)
    run = await python_client.runs.create(thread, "slow", input={"delay_ms": 3000, "ticks": 0})
    await python_client.runs.cancel(thread, run["run_id"], wait=True)
    got = await python_client.runs.get(thread, run["run_id"])
    assert got["status"] == "interrupted"


async def test_the_default_assistants_are_the_python_graphs(python_client):
    found = await python_client.assistants.search(limit=100)
    graphs = {a["graph_id"] for a in found}
    assert {"echo", "chain", "approval", "agent", "fanout", "nested", "slow", "fail"} <= graphs


@pytest.mark.parametrize("graph", ["chain"])
async def test_a_stateless_run_answers_without_a_thread(python_client, graph):
    out = await python_client.runs.wait(None, graph, input={"n": 1})
    assert out == {"n": 4}


async def test_update_state_writes_as_a_node_and_a_run_goes_on_from_it(python_client):
    """`update_state` runs the graph's own reducers as `as_node` wrote the values; the next
    run with no input continues from the edit (LangGraph's time travel)."""
    thread = await _thread(python_client)
    await python_client.runs.wait(thread, "chain", input={"n": 1})
    written = await python_client.threads.update_state(thread, {"n": 100}, as_node="b")
    assert written["checkpoint"]["checkpoint_id"]
    state = await python_client.threads.get_state(thread)
    assert state["values"] == {"n": 100}
    assert state["next"] == ["c"]
    assert state["metadata"]["source"] == "update"
    assert (await python_client.threads.get(thread))["values"] == {"n": 100}
    out = await python_client.runs.wait(thread, "chain", input=None)
    assert out == {"n": 101}


async def test_update_state_as_an_unknown_node_is_refused_and_changes_nothing(python_client):
    thread = await _thread(python_client)
    await python_client.runs.wait(thread, "chain", input={"n": 1})
    before = await python_client.threads.get_history(thread, limit=20)
    with pytest.raises(Exception) as refused:
        await python_client.threads.update_state(thread, {"n": 5}, as_node="nowhere")
    assert getattr(refused.value, "response").status_code == 422
    assert "nowhere" in refused.value.response.text
    assert await python_client.threads.get_history(thread, limit=20) == before


async def test_supersteps_on_create_build_a_history_a_run_goes_on_from(python_client):
    steps = [
        {"updates": [{"values": {"n": 1}, "as_node": "a"}]},
        {"updates": [{"values": {"n": 2}, "as_node": "b"}]},
    ]
    thread = await python_client.threads.create(graph_id="chain", supersteps=steps)
    assert thread["status"] == "interrupted" and thread["values"] == {"n": 2}
    history = await python_client.threads.get_history(thread["thread_id"], limit=10)
    assert [h["values"] for h in history][:2] == [{"n": 2}, {"n": 1}]
    assert await python_client.runs.wait(thread["thread_id"], "chain", input=None) == {"n": 3}


async def test_refused_supersteps_create_no_thread(python_client):
    tid = str(uuid.uuid4())
    with pytest.raises(Exception) as refused:
        await python_client.threads.create(
            thread_id=tid, graph_id="chain",
            supersteps=[{"updates": [{"values": {"n": 1}, "as_node": "nowhere"}]}],
        )
    assert refused.value.response.status_code == 422
    assert "nowhere" in refused.value.response.text
    with pytest.raises(Exception) as missing:
        await python_client.threads.get(tid)
    assert missing.value.response.status_code == 404


async def test_a_fork_from_a_past_checkpoint_runs_from_there(python_client):
    """Time travel: a run given a past checkpoint continues from that state."""
    thread = await _thread(python_client)
    await python_client.runs.wait(thread, "chain", input={"n": 0})
    history = await python_client.threads.get_history(thread, limit=10)
    after_a = next(h for h in history if h["values"].get("n") == 1)
    out = await python_client.runs.wait(
        thread, "chain", input=None, checkpoint_id=after_a["checkpoint"]["checkpoint_id"]
    )
    assert out == {"n": 3}


async def test_schemas_and_drawing_come_from_the_python_graph(python_client):
    schemas = await python_client.assistants.get_schemas("chain")
    assert schemas["graph_id"] == "chain"
    assert schemas["state_schema"]["properties"]["n"]["type"] == "integer"
    drawn = await python_client.assistants.get_graph("chain")
    assert {n["id"] for n in drawn["nodes"]} >= {"__start__", "a", "b", "c", "__end__"}
    nested = await python_client.assistants.get_graph("nested", xray=True)
    assert {"child:c1", "child:c2"} <= {n["id"] for n in nested["nodes"]}
    subgraphs = await python_client.assistants.get_subgraphs("nested")
    assert list(subgraphs) == ["child"]


async def test_a_cancel_with_rollback_takes_the_runs_checkpoints(python_client):
    """Cancel with `action="rollback"`: the run is deleted with everything it saved, and the
    thread's state is what it was before the run."""
    thread = await _thread(python_client)
    await python_client.runs.wait(thread, "slow", input={"delay_ms": 1, "ticks": 0})
    before = await python_client.threads.get_history(thread, limit=50)
    run = await python_client.runs.create(
        thread, "slow", input={"delay_ms": 1500, "ticks": 0}, durability="sync"
    )
    # Wait until node `a`'s step is saved, so there is something to take back.
    for _ in range(200):
        history = await python_client.threads.get_history(thread, limit=50)
        if len(history) > len(before) + 1:
            break
        await asyncio.sleep(0.02)
    await python_client.runs.cancel(thread, run["run_id"], wait=True, action="rollback")
    runs = [r["run_id"] for r in await python_client.runs.list(thread)]
    assert run["run_id"] not in runs
    after = await python_client.threads.get_history(thread, limit=50)
    assert [h["checkpoint"]["checkpoint_id"] for h in after] == [
        h["checkpoint"]["checkpoint_id"] for h in before
    ]


async def test_the_recursion_limit_of_a_run_reaches_the_graph(python_client):
    thread = await _thread(python_client)
    chunks = [
        c
        async for c in python_client.runs.stream(
            thread, "chain", input={"n": 0}, config={"recursion_limit": 2}
        )
    ]
    errors = [c.data for c in chunks if c.event == "error"]
    assert errors and errors[0]["error"] == "GraphRecursionError", chunks


async def test_durability_exit_saves_only_the_end(python_client):
    thread = await _thread(python_client)
    out = await python_client.runs.wait(thread, "chain", input={"n": 0}, durability="exit")
    assert out == {"n": 3}
    history = await python_client.threads.get_history(thread, limit=10)
    assert history[0]["values"] == {"n": 3}
    assert len(history) < 5  # not one checkpoint per step


REF_INPUTS = {
    "echo": {"messages": [{"role": "user", "content": "hi"}]},
    "chain": {"n": 0},
    "approval": {"messages": [{"role": "user", "content": "go"}]},
    "agent": {"messages": [{"role": "user", "content": "add"}]},
    "fanout": {"items": ["a", "b", "c"]},
    "nested": {"messages": [{"role": "user", "content": "x"}]},
    "slow": {"delay_ms": 5, "ticks": 0},
    "fail": {"n": 0},
}


@pytest.mark.spindle_only
async def test_runs_and_state_reads_leave_no_task_of_the_worker_pending(python_client, python_server):
    """Every run and state read gets a store whose batching task ends with it: one left to the
    garbage collector was destroyed pending, and asyncio logged so through the worker's stderr
    about once a run."""
    for _ in range(2):
        for graph_id, graph_input in REF_INPUTS.items():
            thread = await _thread(python_client)
            await python_client.runs.wait(thread, graph_id, input=graph_input, raise_error=False)
            await python_client.threads.get_state(thread)
    output = python_server.output()
    assert "Task was destroyed but it is pending" not in output
    assert "Task exception was never retrieved" not in output
