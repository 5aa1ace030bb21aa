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


@run_async
async def test_an_update_at_a_past_checkpoint_forks_without_reusing_a_version() -> None:
    """A branch from an older checkpoint must not reuse a channel version of the newer branch:
    Spindle writes a (channel, version) blob once and keeps it, so a reused version would read
    back the other branch's value (here n=2 and no next task instead of n=50 and `b`). The
    reference server answers n=50, next ["b"]; the run from there ends at n=52."""
    spindle, worker = await ref_worker()
    thread = new_thread()
    run = new_run()
    await worker.start_run(run, "chain", thread, input={"n": 0})
    await spindle.wait_done(run)
    config = {"configurable": {"thread_id": thread}}
    history = [orjson.loads(s) for s in await worker.request(
        "state.history", {"graph_id": "chain", "config": config, "limit": 10})]
    after_a = next(h for h in history if h["values"] == {"n": 1})

    past = {"configurable": {"thread_id": thread, "checkpoint_id": after_a["checkpoint_id"]}}
    reply = await worker.request("state.update", {
        "graph_id": "chain", "config": past, "updates": [[{"values": {"n": 50}, "as_node": "a"}]],
    })
    state = orjson.loads(await worker.request("state.get", {"graph_id": "chain", "config": config}))
    assert state["checkpoint_id"] == reply["config"]["checkpoint_id"]
    assert state["parent_checkpoint_id"] == after_a["checkpoint_id"]
    assert (state["values"], state["next"]) == ({"n": 50}, ["b"])

    again = new_run()
    await worker.start_run(again, "chain", thread, input=None)
    done = await spindle.wait_done(again)
    assert orjson.loads(done["final"])["values"] == {"n": 52}
    assert spindle.violations == []
    await worker.close()


@run_async
async def test_an_update_checkpoint_names_its_graph_in_metadata() -> None:
    """As on the reference, an update's checkpoint metadata carries `graph_id` like the run's
    checkpoints do, so a history filtered on the graph finds the updates as well."""
    spindle, worker = await ref_worker()
    thread = new_thread()
    run = new_run()
    await worker.start_run(run, "chain", thread, input={"n": 0})
    await spindle.wait_done(run)
    config = {"configurable": {"thread_id": thread}}
    await worker.request("state.update", {
        "graph_id": "chain", "config": config, "updates": [[{"values": {"n": 7}, "as_node": "c"}]],
    })
    found = [orjson.loads(s) for s in await worker.request(
        "state.history", {"graph_id": "chain", "config": config, "limit": 10, "filter": {"graph_id": "chain"}})]
    assert found[0]["metadata"]["source"] == "update" and found[0]["values"] == {"n": 7}
    assert len(found) == 6  # the update, then the run's five checkpoints
    await worker.close()
