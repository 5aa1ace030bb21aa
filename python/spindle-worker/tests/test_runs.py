"""Runs of the reference graphs through a real worker process and the fake Spindle."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from conftest import REF_DIR, new_run, new_thread, ref_worker, run_async
from fake_spindle import FakeSpindle
from spindle_worker.errors import summarize

ALL_MODES = ["values", "updates", "messages", "messages-tuple", "custom", "debug", "tasks", "checkpoints", "events"]
INPUTS = {
    "echo": {"messages": [{"role": "user", "content": "hi"}]},
    "chain": {"n": 0},
    "approval": {"messages": [{"role": "user", "content": "go"}]},
    "agent": {"messages": [{"role": "user", "content": "add"}]},
    "fanout": {"items": ["a", "b", "c"]},
    "nested": {"messages": [{"role": "user", "content": "x"}]},
    "slow": {"delay_ms": 5, "ticks": 0},
    "fail": {"n": 0},
}
EXPECTED_STATUS = {"approval": "interrupted", "fail": "error"}
# The event name each mode produces (messages accumulate into messages/*).
MODE_EVENT = {"messages": "messages/complete", "messages-tuple": "messages"}
# Graphs that produce nothing in some modes (no messages in chain; no custom events but slow).
SILENT = {("chain", "messages"), ("chain", "messages-tuple"), ("fanout", "messages"), ("fanout", "messages-tuple"),
          ("slow", "messages"), ("slow", "messages-tuple"), ("approval", "messages"), ("approval", "messages-tuple"), ("fail", "messages"), ("fail", "messages-tuple")}


@pytest.mark.parametrize("mode", ALL_MODES)
@run_async
async def test_every_graph_in_every_mode(mode: str) -> None:
    spindle, worker = await ref_worker()
    try:
        for graph_id, graph_input in INPUTS.items():
            run = new_run()
            await worker.start_run(run, graph_id, new_thread(), input=graph_input, stream_mode=[mode])
            done = await spindle.wait_done(run)
            assert done["status"] == EXPECTED_STATUS.get(graph_id, "success"), (graph_id, done)
            names = {n.split("|")[0] for n in spindle.event_names(run)}
            if mode == "custom" and graph_id != "slow" or (graph_id, mode) in SILENT:
                continue
            if graph_id == "fail" and mode in ("updates", "custom"):
                continue
            assert MODE_EVENT.get(mode, mode) in names, (graph_id, mode, names)
            assert names <= {MODE_EVENT.get(mode, mode), "messages/metadata", "messages/partial", "values"}, names
        assert spindle.violations == []
    finally:
        await worker.close()


@run_async
async def test_values_and_final_state() -> None:
    spindle, worker = await ref_worker()
    run = new_run()
    await worker.start_run(run, "agent", new_thread(), input=INPUTS["agent"], stream_mode=["values", "updates"])
    done = await spindle.wait_done(run)
    final = orjson.loads(done["final"])
    assert [m["content"] for m in final["values"]["messages"]] == ["add", "", "5", "The sum is 5."]
    assert final["values"]["messages"][1]["tool_calls"][0]["id"] == "call_add_1"
    assert final["next"] == [] and final["interrupts"] == {}
    updates = spindle.event_payloads(run, "updates")
    assert [list(u) for u in updates] == [["model"], ["tools"], ["model"]]
    await worker.close()


@run_async
async def test_messages_accumulate_like_the_reference() -> None:
    spindle, worker = await ref_worker()
    run = new_run()
    await worker.start_run(run, "echo", new_thread(), input=INPUTS["echo"], stream_mode=["messages"])
    await spindle.wait_done(run)
    names = spindle.event_names(run)
    assert names[:2] == ["messages/metadata", "messages/complete"], names
    (meta,) = spindle.event_payloads(run, "messages/metadata")
    (msg_id, entry), = meta.items()
    assert entry["metadata"]["langgraph_node"] == "respond"
    (complete,) = spindle.event_payloads(run, "messages/complete")
    assert complete[0]["content"] == "echo: hi" and complete[0]["id"] == msg_id
    await worker.close()


@run_async
async def test_subgraph_events_are_named_with_their_namespace() -> None:
    spindle, worker = await ref_worker()
    run = new_run()
    await worker.start_run(
        run, "nested", new_thread(), input=INPUTS["nested"], stream_mode=["updates", "messages-tuple"], subgraphs=True
    )
    await spindle.wait_done(run)
    names = spindle.event_names(run)
    child = [n for n in names if n.startswith("updates|child:")]
    assert len(child) == 2, names
    assert "updates" in names and any(n.startswith("messages|child:") for n in names)
    # Without subgraphs the child's own steps are not streamed.
    run2 = new_run()
    await worker.start_run(run2, "nested", new_thread(), input=INPUTS["nested"], stream_mode=["updates"])
    await spindle.wait_done(run2)
    assert spindle.event_names(run2) == ["updates", "updates"]
    assert spindle.violations == []
    await worker.close()


@run_async
async def test_interrupt_then_resume() -> None:
    spindle, worker = await ref_worker()
    thread = new_thread()
    run = new_run()
    await worker.start_run(run, "approval", thread, input=INPUTS["approval"], stream_mode=["values", "updates"])
    done = await spindle.wait_done(run)
    assert done["status"] == "interrupted"
    final = orjson.loads(done["final"])
    assert final["next"] == ["ask"]
    ((task_id, interrupts),) = final["interrupts"].items()
    assert interrupts[0]["value"] == {"question": "approve?"} and interrupts[0]["id"]
    assert spindle.event_payloads(run, "updates")[-1]["__interrupt__"][0]["value"] == {"question": "approve?"}

    resume = new_run()
    await worker.start_run(resume, "approval", thread, command={"resume": "yes"}, stream_mode=["values"])
    done = await spindle.wait_done(resume)
    assert done["status"] == "success"
    final = orjson.loads(done["final"])
    assert final["values"]["messages"][-1]["content"] == "decision: yes" and final["next"] == []
    await worker.close()


@run_async
async def test_error_keeps_message_of_public_errors_only() -> None:
    spindle, worker = await ref_worker()
    run = new_run()
    await worker.start_run(run, "fail", new_thread(), input={"n": 0})
    done = await spindle.wait_done(run)
    assert done["status"] == "error"
    assert done["error"] == {"error": "ValueError", "message": "boom"}
    assert "raise ValueError(\"boom\")" in done["traceback"]
    assert done["node"] == "boom", "the node whose task raised, for the run-failed log line"
    assert done["summary"] == "ValueError: boom", "the class and message, first in the log line"
    await worker.close()


def test_a_failures_summary_says_what_it_came_from_on_one_line() -> None:
    """What an operator reads first: the run's exception, then its causes, whatever their
    messages' lines; the real message even of an exception clients only see the class of."""

    class APIConnectionError(Exception):
        pass

    try:
        try:
            raise OSError(-2, "Name or service\nnot known")
        except OSError as cause:
            raise APIConnectionError("Connection error.") from cause
    except APIConnectionError as e:
        failure = e
    assert summarize(failure) == (
        "APIConnectionError: Connection error., caused by OSError: [Errno -2] Name or service not known"
    )
    assert len(summarize(ValueError("x" * 10_000))) == 2000


@run_async
async def test_cancel() -> None:
    spindle, worker = await ref_worker()
    run = new_run()
    await worker.start_run(run, "slow", new_thread(), input={"delay_ms": 5000, "ticks": 0}, stream_mode=["custom"])
    await _until(lambda: spindle.event_names(run))
    assert await worker.request("run.cancel", {"run": list(run)}) is None
    done = await spindle.wait_done(run, timeout=5)
    assert done["status"] == "cancelled"
    assert spindle.event_payloads(run, "custom") == [{"tick": "a"}]
    with pytest.raises(Exception, match="not_found"):
        await worker.request("run.cancel", {"run": list(run)})
    await worker.close()


@run_async
async def test_fenced_run_stops_silently() -> None:
    spindle, worker = await ref_worker()
    run = new_run()
    spindle.fenced.add(run)  # as if another attempt had taken over
    await worker.start_run(run, "chain", new_thread(), input={"n": 0})
    await asyncio.sleep(1)
    assert run not in spindle.done
    assert [op for op, _ in spindle.calls] == ["cp.get"], spindle.calls
    assert (await worker.request("ping"))["active_runs"] == 0
    await worker.close()


@run_async
async def test_fenced_mid_run() -> None:
    spindle, worker = await ref_worker()
    run = new_run()
    await worker.start_run(run, "slow", new_thread(), input={"delay_ms": 300, "ticks": 0}, stream_mode=["custom"])
    await _until(lambda: spindle.event_names(run))
    spindle.fenced.add(run)
    await asyncio.sleep(1.5)
    assert run not in spindle.done
    assert spindle.event_payloads(run, "custom") == [{"tick": "a"}]  # b never ran
    await worker.close()


@run_async
async def test_crash_then_resume_does_not_rerun_finished_nodes() -> None:
    spindle = FakeSpindle(str(REF_DIR))
    spindle, worker = await ref_worker(spindle)
    thread = new_thread()
    run_id, _ = new_run()
    graph_input = {"delay_ms": 1500, "ticks": 0}
    await worker.start_run((run_id, 1), "slow", thread, input=graph_input, stream_mode=["custom", "updates"])
    # Node a's writes are saved once it finishes; kill the worker while b sleeps.
    await _until(lambda: any(op == "cp.writes" and b["writes"][0][0] == "ticks" for op, b in spindle.calls), 10)
    await _until(lambda: spindle.event_payloads((run_id, 1), "custom") == [{"tick": "a"}, {"tick": "b"}], 10)
    await worker.kill()
    assert (run_id, 1) not in spindle.done

    _, worker2 = await ref_worker(spindle)
    await worker2.start_run((run_id, 2), "slow", thread, input=graph_input, stream_mode=["custom", "updates"])
    done = await spindle.wait_done((run_id, 2))
    assert done["status"] == "success"
    assert orjson.loads(done["final"])["values"]["ticks"] == 2
    assert spindle.event_payloads((run_id, 2), "custom") == [{"tick": "b"}], "a must not run again"
    assert spindle.violations == []
    await worker2.close()


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@run_async
async def test_ordering_rule_under_each_durability(durability: str) -> None:
    spindle, worker = await ref_worker()
    for graph_id in ("chain", "nested", "fanout", "slow", "agent"):
        run = new_run()
        await worker.start_run(
            run, graph_id, new_thread(), input=INPUTS[graph_id], stream_mode=["debug", "checkpoints", "values"],
            subgraphs=graph_id == "nested", durability=durability,
        )
        assert (await spindle.wait_done(run))["status"] == "success"
    assert spindle.violations == []
    if durability == "exit":
        assert sum(op == "cp.put" for op, _ in spindle.calls) == 5  # one per run, at its end
    await worker.close()


@run_async
async def test_worker_full_answers_conflict() -> None:
    spindle, worker = await ref_worker(None, SPINDLE_WORKER_MAX_RUNS="1")
    run = new_run()
    await worker.start_run(run, "slow", new_thread(), input={"delay_ms": 500, "ticks": 0})
    with pytest.raises(Exception, match="conflict"):
        await worker.start_run(new_run(), "slow", new_thread(), input={"delay_ms": 1, "ticks": 0})
    await spindle.wait_done(run)
    with pytest.raises(Exception, match="not_found"):
        await worker.start_run(new_run(), "nope", new_thread(), input={})
    await worker.close()


@run_async
async def test_stateless_run_without_checkpointer() -> None:
    spindle, worker = await ref_worker()
    run = new_run()
    await worker.start_run(run, "chain", new_thread(), input={"n": 1}, checkpointer=False, stream_mode=["values"])
    done = await spindle.wait_done(run)
    assert done["status"] == "success" and "final" not in done
    assert spindle.event_payloads(run, "values")[-1] == {"n": 4}
    assert not [c for c in spindle.calls if c[0].startswith("cp.")]
    await worker.close()


@run_async
async def test_ping_and_exit_on_eof() -> None:
    spindle, worker = await ref_worker()
    pong = await worker.request("ping")
    assert pong["active_runs"] == 0 and pong["rss_bytes"] > 0 and pong["loop_lag_ms"] >= 0
    assert await worker.close() == 0


async def _until(cond, timeout: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)


@run_async
async def test_concurrent_runs_share_one_worker() -> None:
    spindle, worker = await ref_worker()
    runs = [new_run() for _ in range(6)]
    for run in runs:
        await worker.start_run(run, "slow", new_thread(), input={"delay_ms": 300, "ticks": 0}, stream_mode=["custom"])
    assert (await worker.request("ping"))["active_runs"] == 6
    for run in runs:
        done = await spindle.wait_done(run)
        assert orjson.loads(done["final"])["values"]["ticks"] == 2
        assert spindle.event_payloads(run, "custom") == [{"tick": "a"}, {"tick": "b"}]
    assert spindle.violations == []
    await worker.close()


def test_runs_and_reads_leave_no_store_task_pending(capfd: pytest.CaptureFixture[str]) -> None:
    """Each run and each state read makes a store whose batching task must end with it: left
    to the garbage collector it is destroyed pending, and asyncio says so in the worker's log
    (about once a run)."""

    @run_async
    async def runs_and_reads() -> None:
        spindle, worker = await ref_worker()
        try:
            for graph_id, graph_input in [*INPUTS.items(), *INPUTS.items()]:
                run, thread = new_run(), new_thread()
                await worker.start_run(run, graph_id, thread, input=graph_input, stream_mode=["values"])
                assert (await spindle.wait_done(run))["status"] == EXPECTED_STATUS.get(graph_id, "success")
                config = {"configurable": {"thread_id": thread}}
                await worker.request("state.get", {"graph_id": graph_id, "config": config})
        finally:
            assert await worker.close() == 0

    runs_and_reads()
    err = capfd.readouterr().err
    assert "Task was destroyed but it is pending" not in err, err
    assert "Task exception was never retrieved" not in err, err
