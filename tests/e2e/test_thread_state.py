"""Thread state through the official Python client: state and history (with subgraphs and
interrupts), state updates, time travel, thread TTL and prune, supersteps, and the 409s and
422s around them."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
from conftest import BACKENDS, _loop, _session_server
from e2e_util import assert_error_body, assert_status, assert_validation_error
from langgraph_sdk import get_client
from langgraph_sdk.errors import BadRequestError, ConflictError, NotFoundError

HI = {"messages": [{"role": "user", "content": "hi"}]}


def same_state(got: dict, expected: dict) -> None:
    """The same state, read two ways. (The reference leaves `checkpoint_ns` out of
    `checkpoint` when the state was asked for by id; Spindle always names it.)"""
    assert {k: v for k, v in got.items() if k != "checkpoint"} == {
        k: v for k, v in expected.items() if k != "checkpoint"
    }
    assert got["checkpoint"]["checkpoint_id"] == expected["checkpoint"]["checkpoint_id"]


def brief(states: list[dict]) -> list[tuple]:
    """(source, step, next) of each state, to compare histories."""
    return [(s["metadata"]["source"], s["metadata"]["step"], s["next"]) for s in states]


async def chain_thread(client, tag: str) -> str:
    """A thread on which `chain` ran from n=0 (final n=3)."""
    thread = await client.threads.create(metadata={"tag": tag})
    assert await client.runs.wait(thread["thread_id"], "chain", input={"n": 0}) == {"n": 3}
    return thread["thread_id"]


async def test_a_thread_without_checkpoints_has_an_empty_state(client, tag):
    """As the reference: empty values, nothing next, no checkpoint; an empty history."""
    thread = await client.threads.create(metadata={"tag": tag})
    state = await client.threads.get_state(thread["thread_id"])
    assert state == {
        "values": {}, "next": [], "tasks": [], "metadata": None, "created_at": None,
        "checkpoint": None, "parent_checkpoint": None, "interrupts": [],
        "checkpoint_id": None, "parent_checkpoint_id": None,
    }
    assert await client.threads.get_history(thread["thread_id"]) == []


async def test_state_and_history_after_a_run(client, tag):
    """The latest state holds the final values and its checkpoint; history lists every
    checkpoint newest first, and pages back with `before` in each of its forms."""
    tid = await chain_thread(client, tag)
    state = await client.threads.get_state(tid)
    assert state["values"] == {"n": 3}
    assert state["next"] == [] and state["tasks"] == [] and state["interrupts"] == []
    assert state["checkpoint"]["thread_id"] == tid
    assert state["checkpoint"]["checkpoint_ns"] == ""
    assert state["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert state["parent_checkpoint_id"] == state["parent_checkpoint"]["checkpoint_id"]
    assert state["metadata"]["source"] == "loop"

    history = await client.threads.get_history(tid, limit=10)
    assert brief(history) == [
        ("loop", 3, []), ("loop", 2, ["c"]), ("loop", 1, ["b"]), ("loop", 0, ["a"]),
        ("input", -1, ["__start__"]),
    ]
    assert history[0] == state
    assert [s["values"] for s in history] == [{"n": 3}, {"n": 2}, {"n": 1}, {"n": 0}, {}]
    # Each state's parent is the next older one.
    for newer, older in zip(history, history[1:]):
        assert newer["parent_checkpoint_id"] == older["checkpoint_id"]

    # A page of two before the second state, with `before` as a config object.
    page = await client.threads.get_history(
        tid, limit=2, before={"configurable": {"checkpoint_id": history[1]["checkpoint_id"]}}
    )
    assert [s["checkpoint_id"] for s in page] == [h["checkpoint_id"] for h in history[2:4]]
    # Metadata filter.
    inputs = await client.threads.get_history(tid, limit=10, metadata={"source": "input"})
    assert [s["checkpoint_id"] for s in inputs] == [history[4]["checkpoint_id"]]

    # The state at an older checkpoint: by id (GET) and by reference (POST).
    at = await client.threads.get_state(tid, checkpoint_id=history[2]["checkpoint_id"])
    same_state(at, history[2])
    posted = await client.threads.get_state(
        tid, checkpoint={"checkpoint_id": history[2]["checkpoint_id"], "checkpoint_ns": ""}
    )
    same_state(posted, history[2])
    # The latest as GET /history answers it: limit 1 by default, as the reference.
    assert (await client.http.get(f"/threads/{tid}/history")) == [state]


@pytest.mark.spindle_only
async def test_history_before_as_an_id_or_a_raw_checkpoint(client, tag):
    """The interface accepts `before` as a checkpoint id string or a raw checkpoint object
    (the reference refuses both)."""
    tid = await chain_thread(client, tag)
    history = await client.threads.get_history(tid, limit=10)
    cid = history[1]["checkpoint_id"]
    expected = [h["checkpoint_id"] for h in history[2:4]]
    by_id = await client.threads.get_history(tid, limit=2, before=cid)
    assert [s["checkpoint_id"] for s in by_id] == expected
    raw = await client.threads.get_history(tid, limit=2, before={"checkpoint_id": cid})
    assert [s["checkpoint_id"] for s in raw] == expected
    got = await client.http.get(f"/threads/{tid}/history", params={"limit": 2, "before": cid})
    assert [s["checkpoint_id"] for s in got] == expected


async def test_an_interrupted_thread_shows_next_tasks_and_interrupts(client, tag):
    """`approval` stops at `interrupt()`: its state names the next node, the task's interrupt
    and the same interrupt at the top level; the thread is `interrupted`."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    await client.runs.wait(tid, "approval", input=HI)
    state = await client.threads.get_state(tid)
    assert state["next"] == ["ask"]
    [task] = state["tasks"]
    assert task["name"] == "ask"
    assert task["path"] == ["__pregel_pull", "ask"]
    assert task["error"] is None and task["result"] is None
    [interrupt] = task["interrupts"]
    assert interrupt["value"] == {"question": "approve?"}
    assert isinstance(interrupt["id"], str) and interrupt["id"]
    assert state["interrupts"] == [interrupt]
    got = await client.threads.get(tid)
    assert got["status"] == "interrupted"
    assert got["interrupts"] == {task["id"]: [interrupt]}


async def test_the_state_inside_a_subgraph(client, tag):
    """`nested` paused before its subgraph node: with `subgraphs=True` the pending task shows
    the subgraph's (empty) state; once run, the subgraph's own checkpoints are read through its
    namespace, as state and as history."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    await client.runs.wait(tid, "nested", input=HI, interrupt_before=["child"])
    plain = await client.threads.get_state(tid)
    assert plain["next"] == ["child"]
    [task] = plain["tasks"]
    ns = task["checkpoint"]["checkpoint_ns"]
    assert task["checkpoint"] == {"thread_id": tid, "checkpoint_ns": f"child:{task['id']}"}
    assert task["state"] is None

    nested = await client.threads.get_state(tid, subgraphs=True)
    [task] = nested["tasks"]
    assert task["checkpoint"] is None
    assert task["state"]["values"] == {} and task["state"]["checkpoint"] is None

    final = await client.runs.wait(tid, "nested", input=None)
    assert [m["content"] for m in final["messages"]] == ["hi", "prep", "c1", "c2"]
    sub = await client.threads.get_history(tid, limit=10, checkpoint={"checkpoint_ns": ns})
    assert sub, "the subgraph's history"
    assert all(s["checkpoint"]["checkpoint_ns"] == ns for s in sub)
    assert [m["content"] for m in sub[0]["values"]["messages"]][-1] == "c2"
    assert sub[0]["next"] == [] and sub[-1]["metadata"]["source"] == "input"
    latest = await client.threads.get_state(tid, checkpoint={"checkpoint_ns": ns})
    assert latest == sub[0]
    # The root history is not mixed with the subgraph's.
    root = await client.threads.get_history(tid, limit=20)
    assert all(s["checkpoint"]["checkpoint_ns"] == "" for s in root)


async def test_update_state_writes_a_checkpoint_as_if_the_node_ran(client, tag):
    """An update as `b` makes `c` next; the thread's status and values follow, as after a run;
    a run without input continues from there."""
    tid = await chain_thread(client, tag)
    before = await client.threads.get_state(tid)
    answer = await client.threads.update_state(tid, {"n": 10}, as_node="b")
    cp = answer["checkpoint"]
    assert cp["thread_id"] == tid and cp["checkpoint_ns"] == ""
    assert answer["checkpoint_id"] == cp["checkpoint_id"]
    state = await client.threads.get_state(tid)
    assert state["checkpoint_id"] == cp["checkpoint_id"]
    assert state["parent_checkpoint_id"] == before["checkpoint_id"]
    assert state["values"] == {"n": 10}
    assert state["next"] == ["c"]
    assert state["metadata"]["source"] == "update"
    assert state["metadata"]["step"] == before["metadata"]["step"] + 1
    thread = await client.threads.get(tid)
    assert thread["status"] == "interrupted"
    assert thread["values"] == {"n": 10}
    assert await client.runs.wait(tid, "chain", input=None) == {"n": 11}
    assert (await client.threads.get(tid))["status"] == "idle"


@pytest.mark.spindle_only
async def test_an_update_shows_on_the_thread_state_update_stream(client, tag):
    """The update is logged for `GET /threads/{id}/stream?stream_mode=state_update` with the
    payload the reference publishes, `{state, thread_id}`. (The reference's dev server publishes
    it but its join stream never delivers it, hence spindle_only.)"""
    tid = await chain_thread(client, tag)

    async def first_update():
        async for part in await client.threads.join_stream(
            tid, stream_mode="state_update", last_event_id="0"
        ):
            if part.event == "state_update":
                return part.data
        return None

    # Listen first, then update: the event arrives live (a later join replays it from the log).
    listening = asyncio.ensure_future(first_update())
    await asyncio.sleep(0.5)
    await client.threads.update_state(tid, {"n": 7}, as_node="c")
    data = await asyncio.wait_for(listening, timeout=10)
    assert data["thread_id"] == tid
    assert data["state"]["values"] == {"n": 7}
    assert data["state"]["metadata"]["source"] == "update"


async def test_update_state_of_a_thread_without_checkpoints(client, tag):
    """A thread whose metadata names its graph can be edited before any run: the first
    checkpoint is step 0, as in the reference."""
    thread = await client.threads.create(metadata={"tag": tag}, graph_id="chain")
    tid = thread["thread_id"]
    await client.threads.update_state(tid, {"n": 5})
    state = await client.threads.get_state(tid)
    assert state["values"] == {"n": 5}
    assert state["next"] == ["a"]
    assert state["metadata"]["step"] == 0
    assert (await client.threads.get(tid))["status"] == "interrupted"


async def test_update_state_is_refused_while_a_run_is_active(client, tag):
    """409 while a run of the thread is pending or running; nothing is written."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await client.runs.create(tid, "slow", input={"delay_ms": 3000, "ticks": 0})
    with pytest.raises(ConflictError):
        await client.threads.update_state(tid, {"ticks": 100}, as_node="a")
    await client.runs.cancel(tid, run["run_id"], wait=True)
    history = await client.threads.get_history(tid, limit=100)
    assert all(s["metadata"]["source"] != "update" for s in history)


@pytest.mark.spindle_only
async def test_update_state_refuses_bad_input(client, http, tag):
    """422 naming the field: values of the wrong type, an unknown node; 404 for an unknown
    checkpoint; a thread with no graph is a 400 (the error body), as the reference answers."""
    tid = await chain_thread(client, tag)
    r = http.post(f"/threads/{tid}/state", json={"values": 5})
    assert_validation_error(r, "body", "values")
    r = http.post(f"/threads/{tid}/state", json={"values": {"n": 1}, "as_node": "zzz"})
    assert_validation_error(r, "body", "as_node")
    r = http.post(f"/threads/{tid}/state", json={"values": {"n": 1}, "checkpoint_id": str(uuid.uuid4())})
    assert_status(r, 404)
    bare = await client.threads.create(metadata={"tag": tag})
    r = http.post(f"/threads/{bare['thread_id']}/state", json={"values": {"n": 1}})
    assert assert_error_body(r, 400)["error"] == "bad_request"
    with pytest.raises(BadRequestError):
        await client.threads.update_state(bare["thread_id"], {"n": 1})
    assert (await client.threads.get_state(bare["thread_id"]))["values"] == {}
    r = http.get(f"/threads/{uuid.uuid4()}/state")
    assert_status(r, 404)


@pytest.mark.spindle_only
async def test_history_refuses_bad_limits_and_before(http, client, tag):
    """`limit` must be 1 to 1000 (body and query); `before` must name a checkpoint."""
    tid = await chain_thread(client, tag)
    for limit in (0, 1001):
        r = http.post(f"/threads/{tid}/history", json={"limit": limit})
        assert_validation_error(r, "body", "limit")
        r = http.get(f"/threads/{tid}/history", params={"limit": limit})
        assert_validation_error(r, "query", "limit")
    for before in (5, {"configurable": {}}, ["x"]):
        r = http.post(f"/threads/{tid}/history", json={"limit": 2, "before": before})
        assert_validation_error(r, "body", "before")
    r = http.post(f"/threads/{tid}/history", json={"limit": 1000})
    assert_status(r, 200)


async def test_a_run_from_an_earlier_checkpoint_forks_and_keeps_the_history(client, tag):
    """Time travel: a run with `checkpoint_id` continues from that checkpoint on a new branch;
    every checkpoint of the old branch stays readable."""
    tid = await chain_thread(client, tag)
    old = await client.threads.get_history(tid, limit=100)
    after_a = next(s for s in old if s["next"] == ["b"])
    result = await client.runs.wait(tid, "chain", input=None, checkpoint_id=after_a["checkpoint_id"])
    assert result == {"n": 3}
    new = await client.threads.get_history(tid, limit=100)
    new_ids = [s["checkpoint_id"] for s in new]
    for s in old:
        assert s["checkpoint_id"] in new_ids
        same_state(await client.threads.get_state(tid, checkpoint_id=s["checkpoint_id"]), s)
    branch = new[: len(new) - len(old)]
    assert branch[-1]["metadata"]["source"] == "fork"
    assert branch[-1]["parent_checkpoint_id"] == after_a["checkpoint_id"]
    assert branch[0]["values"] == {"n": 3}

    # An edit of an older checkpoint branches off it too.
    answer = await client.threads.update_state(
        tid, {"n": 100}, as_node="a", checkpoint={"checkpoint_id": after_a["checkpoint_id"]}
    )
    head = await client.threads.get_state(tid)
    assert head["checkpoint_id"] == answer["checkpoint"]["checkpoint_id"]
    assert head["parent_checkpoint_id"] == after_a["checkpoint_id"]
    assert head["values"] == {"n": 100} and head["next"] == ["b"]
    assert len(await client.threads.get_history(tid, limit=100)) == len(new) + 1

    # A run given the checkpoint as an object (`checkpoint`) forks the same way.
    again = await client.runs.wait(
        tid, "chain", input=None, checkpoint={"checkpoint_id": after_a["checkpoint_id"], "checkpoint_ns": ""}
    )
    assert again == {"n": 3}
    latest = await client.threads.get_history(tid, limit=100)
    fork = [s for s in latest if s["metadata"]["source"] == "fork"]
    assert len(fork) == 2 and all(f["parent_checkpoint_id"] == after_a["checkpoint_id"] for f in fork)


async def test_supersteps_build_a_history(client, tag):
    """`supersteps` on create: each superstep is one checkpoint, as if its nodes ran; updates of
    one superstep are applied together."""
    steps = [
        {"updates": [{"values": {"n": 1}, "as_node": "a"}]},
        {"updates": [{"values": {"n": 2}, "as_node": "b"}]},
    ]
    thread = await client.threads.create(metadata={"tag": tag}, graph_id="chain", supersteps=steps)
    tid = thread["thread_id"]
    assert thread["status"] == "interrupted" and thread["values"] == {"n": 2}
    history = await client.threads.get_history(tid, limit=10)
    assert brief(history) == [("update", 1, ["c"]), ("update", 0, ["b"])]
    assert await client.runs.wait(tid, "chain", input=None) == {"n": 3}

    fan = await client.threads.create(
        metadata={"tag": tag}, graph_id="fanout",
        supersteps=[{"updates": [
            {"values": {"results": ["x"]}, "as_node": "work"},
            {"values": {"results": ["y"]}, "as_node": "work"},
        ]}],
    )
    [state] = await client.threads.get_history(fan["thread_id"], limit=10)
    assert state["values"] == {"results": ["x", "y"]} and state["next"] == []

    goto = await client.threads.create(
        metadata={"tag": tag}, graph_id="chain",
        supersteps=[{"updates": [
            {"values": None, "command": {"update": {"n": 4}, "goto": "c"}, "as_node": "a"},
        ]}],
    )
    state = await client.threads.get_state(goto["thread_id"])
    assert state["values"] == {"n": 4} and sorted(state["next"]) == ["b", "c"]


@pytest.mark.spindle_only
async def test_supersteps_refuse_bad_input_and_create_nothing(http, tag):
    """A superstep naming an unknown node, lacking `as_node`, or on a thread whose graph is not
    named is a 422; the thread is not created."""
    tid = str(uuid.uuid4())
    bad = [
        ({"metadata": {"graph_id": "chain"}, "supersteps": [{"updates": [{"values": {}, "as_node": "zz"}]}]}, "as_node"),
        ({"metadata": {"graph_id": "chain"}, "supersteps": [{"updates": [{"values": {}}]}]}, "as_node"),
        ({"supersteps": [{"updates": [{"values": {}, "as_node": "a"}]}]}, "graph_id"),
        ({"metadata": {"graph_id": "chain"}, "supersteps": [{"updates": []}]}, "updates"),
    ]
    for body, field in bad:
        r = http.post("/threads", json={"thread_id": tid, **body})
        assert_validation_error(r, "body", field)
    assert_status(http.get(f"/threads/{tid}"), 404)


@pytest.mark.spindle_only
async def test_ttl_is_validated(http):
    """`ttl`: strategy delete or keep_latest, ttl a positive number of minutes (fractions
    allowed); 422 naming the field otherwise, on create and on patch."""
    for ttl, field in [
        ({"strategy": "zap", "ttl": 5}, "strategy"),
        ({"strategy": "delete", "ttl": 0}, "ttl"),
        ({"strategy": "delete", "ttl": -1}, "ttl"),
        ({"strategy": "delete", "ttl": "5"}, "ttl"),
        ({"strategy": "delete"}, "ttl"),
    ]:
        r = http.post("/threads", json={"ttl": ttl})
        detail = assert_validation_error(r, "body", field)
        assert any(item["loc"][:2] == ["body", "ttl"] for item in detail), detail
    ok = http.post("/threads", json={"ttl": {"strategy": "keep_latest", "ttl": 0.5}})
    assert_status(ok, 200)
    tid = ok.json()["thread_id"]
    assert_validation_error(http.patch(f"/threads/{tid}", json={"ttl": {"ttl": 0}}), "body", "ttl")
    assert_status(http.patch(f"/threads/{tid}", json={"ttl": {"ttl": 10}}), 200)


async def wait_until(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.25)
    return False


@pytest.mark.spindle_only
async def test_an_expired_thread_is_deleted_with_its_history(ttl_client, tag):
    """A thread with `ttl` 0.03 minutes (1.8 s, strategy delete) is swept away, runs and
    checkpoints included."""
    thread = await ttl_client.threads.create(metadata={"tag": tag}, ttl={"strategy": "delete", "ttl": 0.03})
    tid = thread["thread_id"]
    await ttl_client.runs.wait(tid, "chain", input={"n": 0})

    async def gone():
        try:
            await ttl_client.threads.get(tid)
            return False
        except NotFoundError:
            return True

    assert await wait_until(gone), "the thread outlived its TTL"


@pytest.mark.spindle_only
async def test_keep_latest_keeps_the_thread_and_its_latest_state(ttl_client, tag):
    """keep_latest (the thread's own, and the server default for threads without one) trims
    the history to the latest checkpoint; the thread and its state stay."""
    own = await ttl_client.threads.create(metadata={"tag": tag}, ttl={"strategy": "keep_latest", "ttl": 0.02})
    plain = await ttl_client.threads.create(metadata={"tag": tag})
    for thread in (own, plain):
        tid = thread["thread_id"]
        await ttl_client.runs.wait(tid, "chain", input={"n": 0})

        async def trimmed(tid=tid):
            return len(await ttl_client.threads.get_history(tid, limit=10)) == 1

        assert await wait_until(trimmed), "the history was not trimmed"
        state = await ttl_client.threads.get_state(tid)
        assert state["values"] == {"n": 3} and state["next"] == []
        assert state["parent_checkpoint"] is None
        assert (await ttl_client.threads.get(tid))["values"] == {"n": 3}


@pytest.mark.spindle_only
async def test_prune_deletes_or_keeps_the_latest(client, http, tag):
    """`POST /threads/prune` answers `{pruned_count}`: delete removes the threads (unknown ids
    are skipped), keep_latest leaves each with its latest checkpoint."""
    doomed = await chain_thread(client, tag)
    kept = await chain_thread(client, tag)
    assert await client.threads.prune([doomed, str(uuid.uuid4())]) == {"pruned_count": 1}
    assert_status(http.get(f"/threads/{doomed}"), 404)
    assert await client.threads.prune([kept], strategy="keep_latest") == {"pruned_count": 1}
    history = await client.threads.get_history(kept, limit=10)
    assert len(history) == 1 and history[0]["values"] == {"n": 3}
    assert await client.threads.prune([]) == {"pruned_count": 0}
    assert_validation_error(http.post("/threads/prune", json={}), "body", "thread_ids")
    assert_validation_error(
        http.post("/threads/prune", json={"thread_ids": [kept], "strategy": "x"}), "body", "strategy"
    )
    assert_validation_error(http.post("/threads/prune", json={"thread_ids": ["not an id"]}), "body")


# --------------------------------------------------------------------------------------------
# a run given a checkpoint; edits of a subgraph's state and as the input
# --------------------------------------------------------------------------------------------


def debug_checkpoints(parts) -> list[tuple]:
    """(source, step, checkpoint id) of the root graph's `debug` checkpoint events."""
    out = []
    for p in parts:
        if p.event == "debug" and p.data["type"] == "checkpoint":
            payload = p.data["payload"]
            out.append((payload["metadata"]["source"], payload["metadata"]["step"],
                        payload["config"]["configurable"]["checkpoint_id"]))
    return out


@pytest.mark.parametrize("given", ["checkpoint_id", "checkpoint"])
async def test_a_run_given_the_latest_edit_continues_from_it(client, tag, given):
    """As the reference: a run given the thread's latest checkpoint, made by an edit, continues
    from it (its debug stream starts with that checkpoint, no `fork` copy is written); given a
    checkpoint the thread has moved past, it branches off with a `fork`."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    await client.runs.wait(tid, "chain", input={"n": 0}, interrupt_before=["b"])
    edit = await client.threads.update_state(tid, {"n": 10})
    cid = edit["checkpoint_id"]
    where = {"checkpoint_id": cid} if given == "checkpoint_id" else {"checkpoint": {"checkpoint_id": cid}}
    parts = [p async for p in client.runs.stream(tid, "chain", input=None, stream_mode="debug", **where)]
    seen = debug_checkpoints(parts)
    assert seen[0] == ("update", 2, cid)
    assert [(s, n) for s, n, _ in seen] == [("update", 2), ("loop", 3), ("loop", 4)]
    history = await client.threads.get_history(tid, limit=20)
    assert brief(history) == [
        ("loop", 4, []), ("loop", 3, ["c"]), ("update", 2, ["b"]),
        ("loop", 1, ["b"]), ("loop", 0, ["a"]), ("input", -1, ["__start__"]),
    ]
    assert history[0]["values"] == {"n": 12}

    again = [p async for p in client.runs.stream(tid, "chain", input=None, stream_mode="debug", **where)]
    source, step, fork_id = debug_checkpoints(again)[0]
    assert (source, step) == ("fork", 3)
    fork = await client.threads.get_state(tid, checkpoint_id=fork_id)
    assert fork["parent_checkpoint_id"] == cid


# `nested_ask` (the reference's twin: crates/graph/tests/fixtures/ref_extra/stream_graph.py):
# `prep`, then `child`, whose `c1` runs and whose `ask` waits at an interrupt.
NESTED_ASK = """
state: {messages: messages}
graphs:
  child:
    state: {messages: messages}
    nodes:
      c1: {kind: script, code: '#{ messages: [ai("c1")] }'}
      ask:
        kind: script
        code: |
          let v = interrupt(#{ question: "approve?" });
          #{ messages: [ai("decision: " + v)] }
    edges:
      - {from: START, to: c1}
      - {from: c1, to: ask}
      - {from: ask, to: END}
nodes:
  prep: {kind: script, code: '#{ messages: [ai("prep")] }'}
  child: {kind: subgraph, graph: child}
edges:
  - {from: START, to: prep}
  - {from: prep, to: child}
  - {from: child, to: END}
"""


@pytest.fixture(scope="module", params=BACKENDS)
def nested_ask_server(request):
    folder = Path(tempfile.mkdtemp(prefix="spindle-e2e-nested-ask-"))
    (folder / "nested_ask.yaml").write_text(NESTED_ASK)
    (folder / "spindle.json").write_text(json.dumps({"graphs": {"nested_ask": "./nested_ask.yaml"}}))
    yield from _session_server(request.param, extra_args=["--config", str(folder / "spindle.json")])


@pytest.fixture
def nested_ask_client(nested_ask_server):
    c = get_client(url=nested_ask_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


async def nested_ask_waiting(client, tag: str) -> tuple[str, str]:
    """A thread whose `child` waits at `ask`; answers it and the subgraph's namespace."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    await client.runs.wait(tid, "nested_ask", input=HI)
    state = await client.threads.get_state(tid, subgraphs=True)
    return tid, state["tasks"][0]["state"]["checkpoint"]["checkpoint_ns"]


def texts(values: dict) -> list[str]:
    return [m["content"] for m in values["messages"]]


async def test_a_subgraph_edited_at_its_interrupt_resumes_from_the_edit(nested_ask_client, tag):
    """As the reference: `update_state` with the subgraph's `checkpoint_ns` writes a checkpoint
    in that namespace (as its node that ran last, `c1`, so `ask` is next); the root state is
    untouched; resumed, the run continues from the edited subgraph state."""
    client = nested_ask_client
    tid, ns = await nested_ask_waiting(client, tag)
    root_before = await client.threads.get_state(tid)
    edited = [{"type": "ai", "content": "edited", "id": "e1"}]
    answer = await client.threads.update_state(tid, {"messages": edited}, checkpoint={"checkpoint_ns": ns})
    assert answer["checkpoint"]["checkpoint_ns"] == ns
    sub = await client.threads.get_state(tid, checkpoint={"checkpoint_ns": ns})
    assert sub["checkpoint_id"] == answer["checkpoint_id"]
    assert texts(sub["values"]) == ["hi", "prep", "c1", "edited"]
    assert sub["next"] == ["ask"]
    assert (sub["metadata"]["source"], sub["metadata"]["step"]) == ("update", 2)
    assert sub["metadata"]["parents"] == {"": root_before["checkpoint_id"]}
    root = await client.threads.get_state(tid)
    assert root["checkpoint_id"] == root_before["checkpoint_id"]
    assert root["interrupts"] == root_before["interrupts"] and root["next"] == ["child"]
    assert (await client.threads.get(tid))["status"] == "interrupted"

    final = await client.runs.wait(tid, "nested_ask", command={"resume": "yes"})
    assert texts(final) == ["hi", "prep", "c1", "edited", "decision: yes"]
    sub_history = await client.threads.get_history(tid, limit=20, checkpoint={"checkpoint_ns": ns})
    assert brief(sub_history) == [
        ("loop", 3, []), ("update", 2, ["ask"]), ("loop", 1, ["ask"]),
        ("loop", 0, ["c1"]), ("input", -1, ["__start__"]),
    ]
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_a_subgraph_edited_as_its_last_node_ends_on_the_next_run(nested_ask_client, tag):
    """Edited as `ask`, the subgraph has nothing left to run: a run without input ends it with
    the edited state, as the reference does."""
    client = nested_ask_client
    tid, ns = await nested_ask_waiting(client, tag)
    x = [{"type": "ai", "content": "x", "id": "x1"}]
    await client.threads.update_state(tid, {"messages": x}, as_node="ask", checkpoint={"checkpoint_ns": ns})
    sub = await client.threads.get_state(tid, checkpoint={"checkpoint_ns": ns})
    assert sub["next"] == []
    final = await client.runs.wait(tid, "nested_ask", input=None)
    assert texts(final) == ["hi", "prep", "c1", "x"]
    assert (await client.threads.get_state(tid))["next"] == []


@pytest.mark.spindle_only
async def test_a_subgraph_edit_refuses_what_the_subgraph_lacks(nested_ask_server, nested_ask_client, tag):
    """422 naming the field, nothing written: a namespace that names no subgraph, a node of the
    parent graph. (The reference answers 400 with the same messages.)"""
    client = nested_ask_client
    tid, ns = await nested_ask_waiting(client, tag)
    http = httpx.Client(base_url=nested_ask_server.base_url, timeout=30)
    try:
        x = {"messages": [{"type": "ai", "content": "x"}]}
        r = http.post(f"/threads/{tid}/state", json={"values": x, "checkpoint": {"checkpoint_ns": "nope:1"}})
        detail = assert_validation_error(r, "body", "checkpoint_ns")
        assert "Subgraph nope not found" in detail[0]["msg"]
        r = http.post(f"/threads/{tid}/state", json={"values": x, "as_node": "prep", "checkpoint": {"checkpoint_ns": ns}})
        assert_validation_error(r, "body", "as_node")
    finally:
        http.close()
    history = await client.threads.get_history(tid, limit=20, checkpoint={"checkpoint_ns": ns})
    assert all(s["metadata"]["source"] != "update" for s in history)


async def test_supersteps_as_the_input(client, tag):
    """As the reference: an update as `__input__` writes the input as a run's input would (an
    `input` checkpoint, `__start__` next, the step after the last or -1); a run without input
    then goes on from there. `update_state` takes it too."""
    steps = [{"updates": [{"values": {"n": 5}, "as_node": "__input__"}]}]
    thread = await client.threads.create(metadata={"tag": tag}, graph_id="chain", supersteps=steps)
    tid = thread["thread_id"]
    assert thread["status"] == "interrupted" and thread["values"] == {}
    [state] = await client.threads.get_history(tid, limit=10)
    assert brief([state]) == [("input", -1, ["__start__"])]
    assert [t["name"] for t in state["tasks"]] == ["__start__"]
    assert await client.runs.wait(tid, "chain", input=None) == {"n": 8}
    assert brief(await client.threads.get_history(tid, limit=10)) == [
        ("loop", 3, []), ("loop", 2, ["c"]), ("loop", 1, ["b"]), ("loop", 0, ["a"]),
        ("input", -1, ["__start__"]),
    ]

    after_c = await client.threads.create(
        metadata={"tag": tag}, graph_id="chain",
        supersteps=[{"updates": [{"values": {"n": 1}, "as_node": "c"}]}, *steps],
    )
    history = await client.threads.get_history(after_c["thread_id"], limit=10)
    assert brief(history) == [("input", 1, ["__start__"]), ("update", 0, [])]
    assert await client.runs.wait(after_c["thread_id"], "chain", input=None) == {"n": 8}

    tid = await chain_thread(client, tag)
    await client.threads.update_state(tid, {"n": 100}, as_node="__input__")
    state = await client.threads.get_state(tid)
    assert brief([state]) == [("input", 4, ["__start__"])] and state["values"] == {"n": 3}
    assert await client.runs.wait(tid, "chain", input=None) == {"n": 103}


@pytest.mark.spindle_only
async def test_supersteps_as_the_input_refuse_what_a_run_would(http, tag):
    """422, nothing created: `__input__` with other updates in its superstep, or values that are
    not an object (the reference answers 400 for both)."""
    tid = str(uuid.uuid4())
    for updates in (
        [{"values": {"n": 5}, "as_node": "__input__"}, {"values": {"n": 5}, "as_node": "a"}],
        [{"values": None, "as_node": "__input__"}],
        [{"values": [1], "as_node": "__input__"}],
    ):
        body = {"thread_id": tid, "metadata": {"graph_id": "chain"}, "supersteps": [{"updates": updates}]}
        assert_validation_error(http.post("/threads", json=body), "body", "supersteps")
    assert_status(http.get(f"/threads/{tid}"), 404)
