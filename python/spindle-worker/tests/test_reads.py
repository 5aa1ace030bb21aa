"""state.get / state.history / state.update and the graph reads."""

from __future__ import annotations

import orjson
from conftest import new_run, new_thread, ref_worker, run_async


@run_async
async def test_state_get_history_and_update() -> None:
    spindle, worker = await ref_worker()
    thread = new_thread()
    run = new_run()
    await worker.start_run(run, "approval", thread, input={"messages": [{"role": "user", "content": "go"}]})
    await spindle.wait_done(run)
    config = {"configurable": {"thread_id": thread}}
    calls_before_reads = len(spindle.calls)

    state = orjson.loads(await worker.request("state.get", {"graph_id": "approval", "config": config, "subgraphs": False}))
    assert state["next"] == ["ask"]
    assert state["values"]["messages"][0]["type"] == "human"  # decoded to JSON, as the reference
    assert state["interrupts"][0]["value"] == {"question": "approve?"}
    assert state["tasks"][0]["name"] == "ask" and state["tasks"][0]["interrupts"][0]["id"]
    assert state["checkpoint"]["thread_id"] == thread and state["checkpoint"]["checkpoint_ns"] == ""
    assert state["metadata"]["source"] == "loop" and "checkpoint_ns" not in state["metadata"]
    assert state["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]

    history = [orjson.loads(s) for s in await worker.request(
        "state.history", {"graph_id": "approval", "config": config, "limit": 10})]
    assert [h["metadata"]["step"] for h in history] == [0, -1]
    assert history[0]["checkpoint"] == state["checkpoint"]
    before = await worker.request("state.history", {
        "graph_id": "approval", "config": config, "limit": 10, "before": state["checkpoint_id"]})
    assert len(before) == 1

    reply = await worker.request("state.update", {
        "graph_id": "approval", "config": config,
        "updates": [[{"values": {"messages": [{"role": "ai", "content": "decided by hand"}]}, "as_node": "ask"}]],
    })
    new_id = reply["config"]["checkpoint_id"]
    assert new_id and reply["config"]["thread_id"] == thread
    state = orjson.loads(await worker.request("state.get", {"graph_id": "approval", "config": config}))
    assert state["checkpoint_id"] == new_id and state["next"] == []
    assert state["values"]["messages"][-1]["content"] == "decided by hand"
    assert state["metadata"]["source"] == "update"
    assert all("run" not in body for _, body in spindle.calls[calls_before_reads:]), "reads carry no run"
    await worker.close()


@run_async
async def test_state_get_with_subgraphs() -> None:
    spindle, worker = await ref_worker()
    thread = new_thread()
    run = new_run()
    await worker.start_run(run, "nested", thread, input={"messages": [{"role": "user", "content": "x"}]})
    await spindle.wait_done(run)
    state = orjson.loads(await worker.request(
        "state.get", {"graph_id": "nested", "config": {"configurable": {"thread_id": thread}}, "subgraphs": True}))
    assert [m["content"] for m in state["values"]["messages"]] == ["x", "prep", "c1", "c2"]
    await worker.close()


@run_async
async def test_graph_schemas_draw_and_subgraphs() -> None:
    _, worker = await ref_worker()
    schemas = await worker.request("graph.schemas", {"graph_id": "chain", "config": {}})
    assert set(schemas) == {"input", "output", "state", "config", "context"}
    # (typing.TypedDict states give null input/output schemas before Python 3.12, as in the
    # reference; test_loading checks full schemas on a typing_extensions graph.)
    assert orjson.loads(schemas["state"])["properties"]["n"]

    drawing = orjson.loads(await worker.request("graph.draw", {"graph_id": "chain", "config": {}, "xray": False}))
    assert [n["id"] for n in drawing["nodes"]] == ["__start__", "a", "b", "c", "__end__"]
    assert all("id" not in (n.get("data") or {}) for n in drawing["nodes"] if isinstance(n.get("data"), dict))
    xray = orjson.loads(await worker.request("graph.draw", {"graph_id": "nested", "config": {}, "xray": True}))
    assert any(n["id"] == "child:c1" for n in xray["nodes"])

    subs = orjson.loads(await worker.request("graph.subgraphs", {"graph_id": "nested", "config": {}, "recurse": True}))
    assert list(subs) == ["child"] and "state_schema" in subs["child"]
    await worker.close()
