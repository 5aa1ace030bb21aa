"""Runs on a thread through the official Python client: wait, stream, interrupts, failures,
multitask strategies, listing, deletion, join and cancel."""

from __future__ import annotations

import json
import re
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
from conftest import BACKENDS, _loop, _session_server
from e2e_util import assert_error_body, assert_status, describe
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError, NotFoundError


async def test_wait_returns_final_values(client, tag):
    """`runs.wait` answers the run's final values: chain adds 1 three times."""
    thread = await client.threads.create(metadata={"tag": tag})
    result = await client.runs.wait(thread["thread_id"], "chain", input={"n": 1})
    assert result == {"n": 4}
    got = await client.threads.get(thread["thread_id"])
    assert got["status"] == "idle"
    assert got["values"] == {"n": 4}


async def test_stream_sends_metadata_then_values(client, tag):
    """A streamed run starts with `metadata {run_id, attempt}` and ends with the final values."""
    thread = await client.threads.create(metadata={"tag": tag})
    parts = [
        part
        async for part in client.runs.stream(
            thread["thread_id"], "echo", input={"messages": [{"role": "user", "content": "hi"}]}
        )
    ]
    assert parts[0].event == "metadata", parts
    assert parts[0].data["attempt"] == 1
    values = [p.data for p in parts if p.event == "values"]
    assert values, parts
    messages = values[-1]["messages"]
    assert [m["type"] for m in messages] == ["human", "ai"]
    assert messages[-1]["content"] == "echo: hi"


async def test_stream_modes_updates(client, tag):
    """`stream_mode=updates` sends one `{node: update}` per node, in order."""
    thread = await client.threads.create(metadata={"tag": tag})
    parts = [
        part
        async for part in client.runs.stream(thread["thread_id"], "chain", input={"n": 0}, stream_mode="updates")
    ]
    updates = [p.data for p in parts if p.event == "updates"]
    assert updates == [{"a": {"n": 1}}, {"b": {"n": 2}}, {"c": {"n": 3}}]


async def test_interrupt_then_resume(client, tag):
    """A run that reaches `interrupt()` leaves the thread interrupted with `__interrupt__` in its
    result; a run with `command.resume` finishes it."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    first = await client.runs.wait(tid, "approval", input={"messages": [{"role": "user", "content": "go"}]})
    assert first["__interrupt__"][0]["value"] == {"question": "approve?"}
    assert (await client.threads.get(tid))["status"] == "interrupted"
    second = await client.runs.wait(tid, "approval", command={"resume": "yes"})
    assert second["messages"][-1]["content"] == "decision: yes"
    assert "__interrupt__" not in second
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_failed_run_reports_its_error(client, tag, http):
    """A failing node ends the run `error`, the thread `error`, and `/wait` answers 200 with
    `__error__ {error, message}`."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    r = http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "fail", "input": {"n": 0}})
    assert_status(r, 200)
    error = r.json()["__error__"]
    assert error["error"] == "ValueError" and error["message"].endswith("boom"), error
    assert (await client.threads.get(tid))["status"] == "error"
    runs = await client.runs.list(tid)
    assert runs[0]["status"] == "error"


async def test_stream_of_a_failed_run_has_an_error_event(client, tag):
    """The SSE stream of a failed run carries an `error` event with `{error, message}`."""
    thread = await client.threads.create(metadata={"tag": tag})
    events = [p async for p in client.runs.stream(thread["thread_id"], "fail", input={"n": 0})]
    errors = [p.data for p in events if p.event == "error"]
    assert [e["error"] for e in errors] == ["ValueError"], events
    assert errors[0]["message"].endswith("boom"), events


@pytest.mark.spindle_only
async def test_a_raised_errors_message_is_the_scripts_own(client, tag):
    """A graph file's `raise("ValueError", "boom")` reaches clients as exactly that class and
    message, as a LangGraph node's exception does (clients compare messages); where it was
    raised is a field of its own."""
    thread = await client.threads.create(metadata={"tag": tag})
    events = [p async for p in client.runs.stream(thread["thread_id"], "fail", input={"n": 0})]
    [error] = [p.data for p in events if p.event == "error"]
    assert (error["error"], error["message"]) == ("ValueError", "boom"), error
    assert re.fullmatch(r"graph 'fail', node 'boom': line \d+, column \d+ of \S*fail\.yaml",
                        error["location"]), error
    [run] = await client.runs.list(thread["thread_id"])
    joined = await client.runs.join(thread["thread_id"], run["run_id"])
    assert joined["__error__"] == error, joined


async def test_background_run_then_join_and_list(client, tag):
    """A background run is listed newest first; join waits for it and answers its values."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await client.runs.create(tid, "chain", input={"n": 10}, metadata={"who": "e2e"})
    assert run["status"] in ("pending", "running", "success")
    assert run["metadata"] == {"who": "e2e"}
    assert await client.runs.join(tid, run["run_id"]) == {"n": 13}
    got = await client.runs.get(tid, run["run_id"])
    assert got["status"] == "success"
    listed = await client.runs.list(tid)
    assert [r["run_id"] for r in listed] == [run["run_id"]]


async def test_join_stream_replays_a_finished_run(client, tag, http):
    """Joining the stream of a finished run replays its events from the log, with ids; a
    `Last-Event-ID` resumes after that event."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await client.runs.create(tid, "chain", input={"n": 0}, stream_mode=["values", "updates"])
    await client.runs.join(tid, run["run_id"])
    r = http.get(f"/threads/{tid}/runs/{run['run_id']}/stream")
    assert_status(r, 200)
    frames = [f for f in r.text.split("\r\n\r\n") if f.strip()]
    ids = [int(line[4:]) for f in frames for line in f.split("\r\n") if line.startswith("id: ")]
    assert frames[0].startswith("event: metadata"), frames[0]
    assert ids == sorted(ids) and len(ids) == len(frames)
    resumed = http.get(f"/threads/{tid}/runs/{run['run_id']}/stream", headers={"Last-Event-ID": str(ids[2])})
    again = [f for f in resumed.text.split("\r\n\r\n") if f.strip()]
    assert again == frames[3:]


async def test_reject_strategy_conflicts_while_busy(client, tag):
    """With `multitask_strategy=reject` a run on a busy thread is refused with 409."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    slow = await client.runs.create(tid, "slow", input={"delay_ms": 400, "ticks": 0})
    with pytest.raises(ConflictError):
        await client.runs.create(tid, "chain", input={"n": 0}, multitask_strategy="reject")
    await client.runs.join(tid, slow["run_id"])


async def test_enqueue_runs_one_after_another(client, tag):
    """Enqueued runs of a thread run in order, never at the same time."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    first = await client.runs.create(tid, "slow", input={"delay_ms": 200, "ticks": 0})
    second = await client.runs.create(tid, "chain", input={"n": 0}, multitask_strategy="enqueue")
    assert await client.runs.join(tid, second["run_id"]) == {"n": 3}
    a = await client.runs.get(tid, first["run_id"])
    b = await client.runs.get(tid, second["run_id"])
    assert a["status"] == "success" and b["status"] == "success"


async def test_interrupt_strategy_stops_the_running_run(client, tag):
    """`multitask_strategy=interrupt` ends the running run `interrupted` and runs the new one."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    slow = await client.runs.create(tid, "slow", input={"delay_ms": 2000, "ticks": 0})
    time.sleep(0.3)
    new = await client.runs.create(tid, "chain", input={"n": 0}, multitask_strategy="interrupt")
    assert await client.runs.join(tid, new["run_id"]) == {"n": 3}
    assert (await client.runs.get(tid, slow["run_id"]))["status"] == "interrupted"


async def test_delete_active_run_needs_force(client, tag, http):
    """Deleting an active run with force=0 is 409 and the run stays; force=1 cancels then
    deletes it (204)."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await client.runs.create(tid, "slow", input={"delay_ms": 2000, "ticks": 0})
    r = http.delete(f"/threads/{tid}/runs/{run['run_id']}?force=0")
    assert_error_body(r, 409)
    assert_status(http.get(f"/threads/{tid}/runs/{run['run_id']}"), 200)
    r = http.delete(f"/threads/{tid}/runs/{run['run_id']}?force=1")
    assert_status(r, 204)
    assert_status(http.get(f"/threads/{tid}/runs/{run['run_id']}"), 404)


async def test_cancel_and_wait(client, tag, http):
    """Cancelling with wait=1 returns once the run stopped; it ends `interrupted`."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await client.runs.create(tid, "slow", input={"delay_ms": 3000, "ticks": 0})
    time.sleep(0.3)
    r = http.post(f"/threads/{tid}/runs/{run['run_id']}/cancel?wait=1")
    assert r.status_code in (202, 204), describe(r)
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    r = http.post(f"/threads/{tid}/runs/{run['run_id']}/cancel")
    assert_error_body(r, 404)


@pytest.mark.spindle_only
async def test_run_metadata_limits(client, tag, http):
    """Run metadata: at most 32 keys matching [A-Za-z0-9_-]{1,64}, primitive values, strings of
    at most 512 characters; anything else is 422 naming the key."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    cases = [
        ({f"k{i}": i for i in range(33)}, "metadata"),
        ({"bad key": 1}, "bad key"),
        ({"k": "x" * 513}, "k"),
        ({"k": {"nested": 1}}, "k"),
    ]
    for metadata, field in cases:
        r = http.post(f"/threads/{tid}/runs", json={"assistant_id": "chain", "metadata": metadata})
        assert_status(r, 422)
        assert any(field in item["loc"] for item in r.json()["detail"]), describe(r)
    assert await client.runs.list(tid) == []


async def test_tools_stream_mode_is_for_protocol_runs_only(client, tag, http):
    """`stream_mode: tools` carries agent-protocol tool events; on a run not started through
    the protocol it is refused with 422 naming the entry, as the reference refuses it, and
    nothing is created."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    body = {"assistant_id": "agent", "input": {"messages": []}, "stream_mode": ["values", "tools"]}
    r = http.post(f"/threads/{tid}/runs/stream", json=body)
    assert_status(r, 422)
    assert any(item["loc"][-2:] == ["stream_mode", "1"] for item in r.json()["detail"]), describe(r)
    assert await client.runs.list(tid) == []


async def test_run_on_missing_thread(client, http):
    """A run on a thread that does not exist is 404, unless `if_not_exists=create`."""
    import uuid

    tid = str(uuid.uuid4())
    r = http.post(f"/threads/{tid}/runs", json={"assistant_id": "chain", "input": {"n": 0}})
    assert_error_body(r, 404)
    result = await client.runs.wait(tid, "chain", input={"n": 0}, if_not_exists="create")
    assert result == {"n": 3}
    assert (await client.threads.get(tid))["metadata"]["graph_id"] == "chain"


async def test_deleting_a_thread_cancels_its_runs(client, tag, http):
    """Deleting a thread with an active run cancels the run first; the thread is gone."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    await client.runs.create(tid, "slow", input={"delay_ms": 3000, "ticks": 0})
    time.sleep(0.2)
    r = http.delete(f"/threads/{tid}")
    assert_status(r, 200)
    assert r.json() == {}
    assert_status(http.get(f"/threads/{tid}"), 404)


async def test_copied_thread_continues_from_the_history(client, tag):
    """A copy carries the thread's checkpoints: a run on the copy continues its conversation,
    and the original is unchanged."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    await client.runs.wait(tid, "echo", input={"messages": [{"role": "user", "content": "one"}]})
    copy = await client.threads.copy(tid)
    result = await client.runs.wait(copy["thread_id"], "echo", input={"messages": [{"role": "user", "content": "two"}]})
    assert [m["content"] for m in result["messages"]] == ["one", "echo: one", "two", "echo: two"]
    original = await client.threads.get(tid)
    assert len(original["values"]["messages"]) == 2


async def test_stream_wire_format(client, tag, http):
    """The run stream is `text/event-stream` with CRLF-framed events, `metadata` first, and
    `Location`/`Content-Location` naming the run: `Location` is the run's stream, which the
    official clients reconnect to when a stream is cut (LangGraph's too); `/wait` names the
    run's `/join`."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    r = http.post(f"/threads/{tid}/runs/stream", json={"assistant_id": "chain", "input": {"n": 0}})
    assert_status(r, 200)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-store"
    run_path = r.headers["content-location"]
    assert run_path.startswith(f"/threads/{tid}/runs/")
    assert r.headers["location"] == run_path + "/stream"
    assert r.text.startswith("event: metadata\r\ndata: {")
    assert r.text.endswith("\r\n\r\n")
    w = http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "chain", "input": {"n": 0}})
    assert_status(w, 200)
    assert w.headers["location"] == w.headers["content-location"] + "/join"
    s = http.post("/runs/stream", json={"assistant_id": "chain", "input": {"n": 0}})
    assert_status(s, 200)
    assert s.headers["location"] == s.headers["content-location"] + "/stream"
    assert w.json() == {"n": 3}


async def test_stateless_wait_and_stream(client, http):
    """Stateless runs (`thread_id=None` in the client) answer like thread runs and remove their
    temporary thread afterwards (`on_completion=delete`, the default)."""
    assert await client.runs.wait(None, "chain", input={"n": 5}) == {"n": 8}
    parts = [p async for p in client.runs.stream(None, "echo", input={"messages": [{"role": "user", "content": "x"}]})]
    assert parts[0].event == "metadata"
    assert parts[-1].data["messages"][-1]["content"] == "echo: x"
    r = http.post("/runs/wait", json={"assistant_id": "chain", "input": {"n": 0}})
    assert_status(r, 200)
    thread_path = r.headers["content-location"].rsplit("/runs/", 1)[0]
    for _ in range(50):
        if http.get(thread_path).status_code == 404:
            break
        time.sleep(0.05)
    assert_status(http.get(thread_path), 404)


async def test_stateless_keep_and_background(client, http):
    """`on_completion=keep` keeps the thread with the run's state; a background stateless run
    deletes its thread when it ends."""
    r = http.post("/runs/wait", json={"assistant_id": "chain", "input": {"n": 1}, "on_completion": "keep"})
    assert_status(r, 200)
    thread_path = r.headers["content-location"].rsplit("/runs/", 1)[0]
    kept = http.get(thread_path)
    assert_status(kept, 200)
    assert kept.json()["values"] == {"n": 4}
    # A thread made for a run carries the run's metadata (and config's), as LangGraph's does.
    run = await client.runs.create(None, "chain", input={"n": 1}, on_completion="keep",
                                   metadata={"by": "keep"}, config={"metadata": {"via": "config"}})
    await client.runs.join(run["thread_id"], run["run_id"])
    metadata = (await client.threads.get(run["thread_id"]))["metadata"]
    assert metadata["by"] == "keep" and metadata["via"] == "config", metadata
    assert metadata["graph_id"] == "chain", metadata
    run = await client.runs.create(None, "chain", input={"n": 0})
    tid = run["thread_id"]
    for _ in range(100):
        if http.get(f"/threads/{tid}").status_code == 404:
            break
        time.sleep(0.05)
    assert_status(http.get(f"/threads/{tid}"), 404)


async def test_a_refused_batch_item_leaves_no_run_behind(client, tag, http):
    """A batch whose second item names an assistant that does not exist is a 404, and its first
    item, valid on its own, was not started either."""
    assistant = await client.assistants.create("chain", metadata={"tag": tag})
    aid = assistant["assistant_id"]
    missing = "00000000-0000-4000-8000-000000000000"
    # `keep`, so that a started run's thread would still be there to count.
    first = {"assistant_id": aid, "input": {"n": 1}, "on_completion": "keep"}
    r = http.post("/runs/batch", json=[first, {"assistant_id": missing, "input": {"n": 2}}])
    assert_status(r, 404)
    r = http.post("/threads/count", json={"metadata": {"assistant_id": aid}})
    assert_status(r, 200)
    assert r.json() == 0, "no thread (and so no run) of the batch was created"
    # The same first item alone is started, and its thread carries that assistant.
    [run] = await client.runs.create_batch([first])
    assert run["assistant_id"] == aid
    r = http.post("/threads/count", json={"metadata": {"assistant_id": aid}})
    assert r.json() == 1, describe(r)


async def test_batch_and_cancel_many(client, tag, http):
    """`runs.create_batch` starts stateless runs (one thread each); `runs.cancel_many` stops runs
    of a thread by id; a bad item of a batch is a 422 naming its index."""
    runs = await client.runs.create_batch(
        [{"assistant_id": "chain", "input": {"n": i}} for i in range(3)]
    )
    assert len(runs) == 3 and len({r["thread_id"] for r in runs}) == 3
    r = http.post("/runs/batch", json=[{"assistant_id": "chain"}, {"assistant_id": "chain", "stream_mode": "bogus"}])
    assert_status(r, 422)
    assert r.json()["detail"][0]["loc"][:2] == ["body", 1], describe(r)

    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await client.runs.create(tid, "slow", input={"delay_ms": 3000, "ticks": 0})
    time.sleep(0.2)
    await client.runs.cancel_many(thread_id=tid, run_ids=[run["run_id"]])
    assert await client.runs.join(tid, run["run_id"]) is not None
    assert (await client.runs.get(tid, run["run_id"]))["status"] == "interrupted"


# --------------------------------------------------------------------------------------------
# what the graph sees of its config
# --------------------------------------------------------------------------------------------

# `whoami` answers the `configurable` its node was given.
WHOAMI_GRAPH = """
state:
  seen: {type: object}
nodes:
  who: {kind: script, code: '#{ seen: config.configurable }'}
edges:
  - {from: __start__, to: who}
  - {from: who, to: __end__}
"""


@pytest.fixture(scope="module", params=BACKENDS)
def whoami_server(request):
    folder = Path(tempfile.mkdtemp(prefix="spindle-e2e-whoami-graph-"))
    (folder / "whoami.yaml").write_text(WHOAMI_GRAPH)
    (folder / "spindle.json").write_text(json.dumps({"graphs": {"whoami": "./whoami.yaml"}}))
    yield from _session_server(request.param, extra_args=["--config", str(folder / "spindle.json")])


@pytest.fixture
def whoami_client(whoami_server):
    c = get_client(url=whoami_server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


async def test_configurable_user_id_is_the_clients(whoami_client):
    """`configurable.user_id` is the client's to set (in config or context), as on the
    reference; the caller's identity is in `langgraph_auth_user_id` and `langgraph_auth_user`,
    which a client cannot set. Without a user_id from the client it is the caller's."""
    async def seen(**kwargs):
        return (await whoami_client.runs.wait(None, "whoami", input={}, **kwargs))["seen"]

    given = await seen(config={"configurable": {"user_id": "alice", "langgraph_auth_user_id": "mallory"}})
    assert given["user_id"] == "alice", given
    caller = given["langgraph_auth_user_id"]
    assert caller != "mallory", given
    assert given["langgraph_auth_user"]["identity"] == caller, given
    assert (await seen(context={"user_id": "bob"}))["user_id"] == "bob"
    default = await seen()
    assert default["user_id"] == caller == default["langgraph_auth_user_id"], default


# --------------------------------------------------------------------------------------------
# unknown assistants, the interface's Run fields, Last-Event-ID
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("assistant_id", ["no-such-graph", "00000000-0000-4000-8000-00000000abcd"])
async def test_a_run_of_an_unknown_assistant_is_404_naming_it(client, http, assistant_id):
    """A run (thread or stateless; create, stream, wait, batch) or a cron of an assistant or
    graph id that names nothing is 404 `No assistant found for "<id>"`, and nothing starts."""
    thread = await client.threads.create()
    tid = thread["thread_id"]
    body = {"assistant_id": assistant_id, "input": {}}
    cron = {**body, "schedule": "0 0 1 1 *"}
    for path, payload in [
        (f"/threads/{tid}/runs", body), (f"/threads/{tid}/runs/stream", body),
        (f"/threads/{tid}/runs/wait", body), ("/runs", body), ("/runs/stream", body),
        ("/runs/wait", body), ("/runs/batch", [body]), (f"/threads/{tid}/runs/crons", cron),
        ("/runs/crons", cron),
    ]:
        r = http.post(path, json=payload)
        error = assert_error_body(r, 404)
        assert error["message"] == f'No assistant found for "{assistant_id}"', describe(r)
    # The client's create maps the 404 to NotFoundError; wait reads its body as a stream and
    # raises the plain HTTP error.
    with pytest.raises(NotFoundError):
        await client.runs.create(tid, assistant_id, input={})
    with pytest.raises(httpx.HTTPStatusError) as waited:
        await client.runs.wait(tid, assistant_id, input={})
    assert waited.value.response.status_code == 404
    assert await client.runs.list(tid) == []
    assert await client.crons.search(thread_id=tid) == []


async def test_runs_carry_input_output_error_message_config_and_context(client, tag):
    """The interface's Run fields beside LangGraph's: `input`, `config` and `context` as the
    run was given them; `output` null until the run ends, then its final values;
    `error_message` null unless the run failed."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    config = {"configurable": {"k": "v"}, "tags": ["t"]}
    run = await client.runs.create(
        tid, "slow", input={"delay_ms": 300}, config=config, context={"c": 1}
    )
    assert run["input"] == {"delay_ms": 300}
    assert run["config"] == config and run["context"] == {"c": 1}
    assert run["output"] is None and run["error_message"] is None
    final = await client.runs.join(tid, run["run_id"])
    ended = await client.runs.get(tid, run["run_id"])
    assert ended["status"] == "success"
    assert ended["output"] == final == {"delay_ms": 300, "ticks": 2}
    assert ended["error_message"] is None
    assert (await client.runs.list(tid))[0]["output"] == final

    failed = await client.runs.create(tid, "fail", input={"n": 0})
    await client.runs.join(tid, failed["run_id"])
    failed = await client.runs.get(tid, failed["run_id"])
    assert failed["status"] == "error" and failed["error_message"].endswith("boom"), failed

    resumed = await client.runs.create(tid, "chain", input=None)
    assert resumed["input"] is None and resumed["context"] is None


async def test_a_last_event_id_naming_no_event_replays_from_the_start(client, tag, http):
    """A join stream's `Last-Event-ID` that is not an event id (a client's own naming) reads as
    none: the run's events from its first, not a 422."""
    thread = await client.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    run = await client.runs.create(tid, "chain", input={"n": 0}, stream_mode=["values", "updates"])
    await client.runs.join(tid, run["run_id"])
    path = f"/threads/{tid}/runs/{run['run_id']}/stream"
    everything = http.get(path)
    r = http.get(path, headers={"Last-Event-ID": "mock_event_20"})
    assert_status(r, 200)
    assert r.text == everything.text and r.text.startswith("event: metadata"), r.text[:200]
    stateless = http.get(f"/runs/{run['run_id']}/stream", headers={"Last-Event-ID": "mock_event_20"})
    assert_status(stateless, 200)
    assert stateless.text == everything.text
