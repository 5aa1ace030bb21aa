"""Graph loading (files, modules, factories, failures) and the store."""

from __future__ import annotations

import orjson
from conftest import EXTRA_DIR, EXTRA_GRAPHS, new_run, new_thread, run_async
from fake_spindle import FakeSpindle


async def extra_worker():
    spindle = FakeSpindle(str(EXTRA_DIR))
    worker = await spindle.spawn()
    report = await worker.init(EXTRA_GRAPHS)
    return spindle, worker, report["graphs"]


@run_async
async def test_init_loads_each_kind_and_reports_failures_per_graph() -> None:
    _, worker, graphs = await extra_worker()
    kinds = {g: r.get("kind") for g, r in graphs.items() if r["ok"]}
    assert kinds == {
        "uncompiled": "state_graph",
        "from_config": "factory",
        "async_factory": "factory",
        "context_factory": "factory",
        "two_params": "factory",
        "whoami": "factory",
        "store_graph": "compiled",
        "by_module": "compiled",
        "schema_graph": "compiled",
    }
    # A compiled graph's own name is reported (it names the default assistant); LangGraph's
    # default name is not.
    names = {g: r.get("name") for g, r in graphs.items() if r["ok"]}
    assert names["by_module"] == "Doubler", names
    assert names["schema_graph"] is None and names["from_config"] is None, names
    broken = graphs["broken"]
    assert not broken["ok"] and "ModuleNotFoundError" in broken["error"]
    assert "not_a_real_package_for_spindle" in broken["traceback"]
    assert "has no variable 'nope'" in graphs["missing_var"]["error"] and "graph" in graphs["missing_var"]["error"]
    # A misspelt name: the name it may mean, and what the module defines.
    assert graphs["misspelt"]["error"] == (
        "ValueError: 'extra_pkg.graphs' has no variable 'grpah' (did you mean 'graph'?); "
        "graphs it defines: graph, schema_graph"
    ), graphs["misspelt"]
    assert "not a graph" in graphs["not_a_graph"]["error"]
    # A graph that failed to load answers not_found with its load error.
    try:
        await worker.start_run(new_run(), "broken", new_thread(), input={})
    except Exception as e:
        assert "not_found" in str(e) and "ModuleNotFoundError" in str(e)
    else:
        raise AssertionError("expected not_found")
    await worker.close()


async def _final(spindle: FakeSpindle, worker, graph_id: str, **kw) -> dict:
    run = new_run()
    await worker.start_run(run, graph_id, new_thread(), **kw)
    done = await spindle.wait_done(run)
    assert done["status"] == "success", done
    return orjson.loads(done["final"])["values"]


@run_async
async def test_factories_and_exports_run() -> None:
    spindle, worker, _ = await extra_worker()
    assert await _final(spindle, worker, "uncompiled", input={"text": ""}) == {"text": "uncompiled!"}
    config = {"configurable": {"thread_id": new_thread(), "greeting": "bonjour"}}
    assert await _final(spindle, worker, "from_config", input={}, config=config) == {"text": "bonjour!"}
    assert await _final(spindle, worker, "async_factory", input={}) == {"text": "async!"}
    config = {"configurable": {"thread_id": new_thread(), "greeting": "hi"}}
    assert await _final(spindle, worker, "two_params", input={}, config=config) == {"text": "threads.create_run/hi!"}
    assert await _final(spindle, worker, "by_module", input={"n": 21}) == {"n": 42}
    await worker.close()


@run_async
async def test_context_manager_factory_stays_open_for_the_run() -> None:
    spindle, worker, _ = await extra_worker()
    run = new_run()
    await worker.start_run(run, "context_factory", new_thread(), input={}, stream_mode=["custom"])
    done = await spindle.wait_done(run)
    assert orjson.loads(done["final"])["values"] == {"text": "cm:threads.create_run"}
    assert spindle.event_payloads(run, "custom") == [{"open": ["threads.create_run"]}]
    # Read paths open it too, with their own access context, and close it after.
    drawing = orjson.loads(await worker.request("graph.draw", {"graph_id": "context_factory", "config": {}}))
    assert [n["id"] for n in drawing["nodes"]] == ["__start__", "node", "__end__"]
    await worker.close()


@run_async
async def test_store_calls_go_to_spindle_with_the_run() -> None:
    spindle, worker, _ = await extra_worker()
    values = await _final(spindle, worker, "store_graph", input={"text": "remember me"})
    assert values == {"text": "remember me|1|sync:remember me"}
    assert spindle.store[(("memories", "u1"), "last")]["value"] == {"text": "remember me"}
    batches = [b for op, b in spindle.calls if op == "store.batch"]
    assert batches and all(b["run"] for b in batches)
    kinds = [next(iter(op)) for b in batches for op in b["ops"]]
    assert kinds == ["put", "get", "search", "get"]
    await worker.close()


@run_async
async def test_graph_schemas() -> None:
    _, worker, _ = await extra_worker()
    schemas = await worker.request("graph.schemas", {"graph_id": "schema_graph", "config": {}})
    assert set(schemas) == {"input", "output", "state", "config", "context"}
    assert orjson.loads(schemas["input"])["properties"] == {
        "title": {"title": "Title", "type": "string"},
        "words": {"title": "Words", "type": "integer"},
    }
    assert orjson.loads(schemas["state"])["title"] == "schema_graph_state"  # named after the graph id
    assert orjson.loads(schemas["context"])["properties"]["user"]["default"] == "anon"
    await worker.close()


@run_async
async def test_auth_user_reads_by_key_and_attribute() -> None:
    spindle, worker, _ = await extra_worker()
    user = {"identity": "u-1", "display_name": "Ada", "permissions": ["read"]}
    config = {"configurable": {"thread_id": new_thread(), "langgraph_auth_user": user}}
    assert await _final(spindle, worker, "whoami", input={}, config=config) == {"text": "u-1/u-1/Ada/['read']"}
    await worker.close()
