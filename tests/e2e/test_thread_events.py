"""Agent protocol v2 on a thread: `POST /threads/{id}/stream/events` (the thread event stream)
and `POST /threads/{id}/commands`, with the official client's protocol support
(`langgraph_sdk` `client.threads.stream`) and raw checks of the wire.

What must hold: a client that opens the thread stream, starts runs and answers interrupts
through commands sees every event once, in order, with the same seq on every connection,
also when it reconnects with `since`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import httpx
import pytest
from e2e_util import LocalServer, QuietHandler, assert_status, spindle_serving
from test_run_streams import StreamReader, parse_frames

ALL_CHANNELS = ["values", "updates", "messages", "tools", "lifecycle", "input", "tasks",
                "checkpoints", "custom"]
AGENT_INPUT = {"messages": [{"role": "human", "content": "add 2 and 3"}]}


class EventReader:
    """Reads `POST /threads/{id}/stream/events` in a background thread until `until(frames)`
    holds or `stop()` drops the connection."""

    def __init__(self, base_url: str, thread_id: str, body: dict, until=None):
        self.frames: list[dict] = []
        self.status: int | None = None
        self.first_bytes: float | None = None
        self.opened = threading.Event()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._until = until
        self._started = time.monotonic()
        args = (base_url, f"/threads/{thread_id}/stream/events", body)
        self._thread = threading.Thread(target=self._read, args=args, daemon=True)
        self._thread.start()
        assert self.opened.wait(10), "the stream did not open"

    def _read(self, base_url: str, path: str, body: dict) -> None:
        buffer = ""
        try:
            with httpx.Client(base_url=base_url, timeout=30) as http:
                with http.stream("POST", path, json=body) as r:
                    self.status = r.status_code
                    self.opened.set()
                    if r.status_code != 200:
                        return
                    for chunk in r.iter_text():
                        if self.first_bytes is None:
                            self.first_bytes = time.monotonic() - self._started
                        buffer += chunk
                        while "\r\n\r\n" in buffer:
                            block, buffer = buffer.split("\r\n\r\n", 1)
                            self.frames.extend(parse_frames(block))
                        if self._stop.is_set() or (self._until and self._until(self.frames)):
                            break
        finally:
            self.opened.set()
            self.done.set()

    def wait(self, timeout: float = 30) -> list[dict]:
        assert self.done.wait(timeout), f"stream did not finish; got {[f['event'] for f in self.frames]}"
        return self.frames

    def stop(self) -> None:
        self._stop.set()


def ended(count: int = 1):
    """`until`: the stream has seen `count` root terminal lifecycle events."""
    def check(frames: list[dict]) -> bool:
        return terminals(frames) >= count
    return check


def terminals(frames: list[dict]) -> int:
    return sum(
        1 for f in frames
        if f["data"]["method"] == "lifecycle" and f["data"]["params"]["namespace"] == []
        and f["data"]["params"]["data"]["event"] in ("completed", "failed", "interrupted")
    )


def command(http: httpx.Client, thread_id: str, method: str, params: dict, cid: int = 1) -> dict:
    r = http.post(f"/threads/{thread_id}/commands", json={"id": cid, "method": method, "params": params})
    assert_status(r, 200)
    return r.json()


def ok(answer: dict) -> dict:
    assert answer["type"] == "success", answer
    assert isinstance(answer["meta"]["applied_through_seq"], int)
    return answer["result"]


def new_thread(http: httpx.Client) -> str:
    r = http.post("/threads", json={})
    assert_status(r, 200)
    return r.json()["thread_id"]


def check_envelopes(frames: list[dict]) -> None:
    """Every frame: `event` is the method, `id` the seq; seqs strictly increase."""
    last = 0
    for f in frames:
        e = f["data"]
        assert e["type"] == "event", e
        assert f["event"] == e["method"], f
        assert f["id"] == e["seq"], f
        assert isinstance(e["event_id"], str) and e["event_id"], e
        assert e["seq"] > last, f"seq went back: {last} then {e['seq']}"
        last = e["seq"]
        p = e["params"]
        assert isinstance(p["namespace"], list) and all(isinstance(s, str) for s in p["namespace"])
        assert isinstance(p["timestamp"], int) and p["timestamp"] > 1_600_000_000_000
        assert "data" in p


def events_of(frames, method):
    return [f["data"]["params"]["data"] for f in frames if f["data"]["method"] == method]


# ------------------------------------------------------------------------------------------
# raw wire
# ------------------------------------------------------------------------------------------


def test_agent_run_streams_every_method_in_protocol_shapes(base_url, http):
    """A stream opened first sees a run started through `run.start`: lifecycle running ...
    completed, the tool call as tool-started/tool-finished, values, updates (`{node: update}`,
    node also in `params.node`), tasks and checkpoints. `messages` carries what a chat model
    streams, and agent's model does not stream (`stream: false`): its messages, returned whole
    by its nodes, are not on `messages`, as the reference sends its twin's (see
    `test_a_streaming_models_reply_is_on_messages_and_node_messages_are_not`)."""
    tid = new_thread(http)
    reader = EventReader(base_url, tid, {"channels": ALL_CHANNELS}, until=ended())
    result = ok(command(http, tid, "run.start", {"assistant_id": "agent", "input": AGENT_INPUT}))
    uuid.UUID(result["run_id"])
    frames = reader.wait()
    check_envelopes(frames)

    life = events_of(frames, "lifecycle")
    assert life[0] == {"event": "running", "graph_name": "agent"}
    assert life[-1]["event"] == "completed" and life[-1]["graph_name"] == "agent"
    # The checkpoint to fork from is the last one the run wrote.
    assert life[-1]["checkpoint"]["id"] == events_of(frames, "checkpoints")[-1]["id"]

    assert events_of(frames, "messages") == []

    tools = events_of(frames, "tools")
    assert [t["event"] for t in tools] == ["tool-started", "tool-finished"], tools
    assert tools[0]["tool_call_id"] == "call_add_1" and tools[0]["tool_name"] == "add"
    assert tools[0]["input"] == {"a": 2, "b": 3}
    assert tools[1]["output"]["content"] == "5"

    values = events_of(frames, "values")
    assert values[-1]["messages"][-1]["content"] == "The sum is 5."
    updates = [f["data"] for f in frames if f["data"]["method"] == "updates"]
    assert {u["params"]["node"] for u in updates} >= {"model", "tools"}
    assert all(list(u["params"]["data"]) == [u["params"]["node"]] for u in updates), updates
    tool_update = next(u["params"]["data"] for u in updates if u["params"]["node"] == "tools")
    assert tool_update["tools"]["messages"][0]["content"] == "5"
    assert events_of(frames, "tasks"), "no tasks events"
    checkpoints = events_of(frames, "checkpoints")
    assert checkpoints and all(isinstance(c["id"], str) and isinstance(c["step"], int) for c in checkpoints)
    assert checkpoints[0]["source"] == "input" and checkpoints[0]["step"] == -1


def test_stream_flushes_first_bytes_at_once(base_url, http):
    """The stream's first bytes (a comment) arrive before any event exists."""
    tid = new_thread(http)
    reader = EventReader(base_url, tid, {"channels": ["values"]}, until=lambda _: True)
    deadline = time.monotonic() + 5
    while reader.first_bytes is None and time.monotonic() < deadline:
        time.sleep(0.02)
    reader.stop()
    assert reader.first_bytes is not None and reader.first_bytes < 2, reader.first_bytes


def test_interrupt_answered_through_input_respond(base_url, http):
    """`approval` stops with input.requested {interrupt_id, payload} and lifecycle interrupted;
    `input.respond` resumes it on the same stream, which then ends completed."""
    tid = new_thread(http)
    reader = EventReader(base_url, tid, {"channels": ALL_CHANNELS}, until=ended(2))
    ok(command(http, tid, "run.start", {"assistant_id": "approval", "input": AGENT_INPUT}))
    deadline = time.monotonic() + 20
    while not events_of(reader.frames, "input.requested") and time.monotonic() < deadline:
        time.sleep(0.05)
    [asked] = events_of(reader.frames, "input.requested")
    # The protocol's `payload`, and `value`, which the Python client reads.
    assert asked == {"interrupt_id": asked["interrupt_id"], "payload": {"question": "approve?"},
                     "value": {"question": "approve?"}}, asked
    answer = command(http, tid, "input.respond",
                     {"namespace": [], "interrupt_id": "nope", "response": "yes"}, cid=2)
    assert answer["type"] == "error" and answer["error"] == "no_such_interrupt", answer
    ok(command(http, tid, "input.respond",
               {"namespace": [], "interrupt_id": asked["interrupt_id"], "response": "yes"}, cid=3))
    frames = reader.wait()
    check_envelopes(frames)
    life = [(l["event"]) for l in events_of(frames, "lifecycle")]
    assert life == ["running", "interrupted", "running", "completed"], life
    assert events_of(frames, "values")[-1]["messages"][-1]["content"] == "decision: yes"
    # Answered: the same interrupt cannot be answered twice.
    again = command(http, tid, "input.respond",
                    {"namespace": [], "interrupt_id": asked["interrupt_id"], "response": "no"}, cid=4)
    assert again["error"] == "no_such_interrupt", again


def test_input_respond_many(base_url, http):
    """`responses: [...]` answers interrupts in one command."""
    tid = new_thread(http)
    reader = EventReader(base_url, tid, {"channels": ["input", "lifecycle"]}, until=ended(2))
    ok(command(http, tid, "run.start", {"assistant_id": "approval", "input": AGENT_INPUT}))
    deadline = time.monotonic() + 20
    while not events_of(reader.frames, "input.requested") and time.monotonic() < deadline:
        time.sleep(0.05)
    [asked] = events_of(reader.frames, "input.requested")
    ok(command(http, tid, "input.respond", {"responses": [
        {"namespace": [], "interrupt_id": asked["interrupt_id"], "response": "many"}]}))
    reader.wait()
    state = ok(command(http, tid, "state.get", {"namespace": []}))
    assert state["values"]["messages"][-1]["content"] == "decision: many"


def test_resume_with_since_replays_exactly_what_follows(base_url, http):
    """Reconnecting with `since` gives the events after it, with the same seq, event_id and
    data as the first connection; the seq does not depend on the connection."""
    tid = new_thread(http)
    first = EventReader(base_url, tid, {"channels": ALL_CHANNELS}, until=ended())
    ok(command(http, tid, "run.start", {"assistant_id": "agent", "input": AGENT_INPUT}))
    frames = first.wait()
    assert len(frames) > 6
    cut = frames[len(frames) // 2]["id"]
    again = EventReader(base_url, tid, {"channels": ALL_CHANNELS, "since": cut}, until=ended())
    rest = again.wait()
    expected = [f for f in frames if f["id"] > cut]
    assert [(f["id"], f["data"]["event_id"], f["data"]["params"]["data"]) for f in rest] == \
        [(f["id"], f["data"]["event_id"], f["data"]["params"]["data"]) for f in expected]


def test_dropped_connection_resumes_without_gap_or_duplicate(base_url, http):
    """A connection dropped mid-run and reopened with `since` = the last seq it saw: the two
    connections together carry what one uninterrupted connection carries, once each."""
    tid = new_thread(http)
    full = EventReader(base_url, tid, {"channels": ALL_CHANNELS}, until=ended())
    partial = EventReader(base_url, tid, {"channels": ALL_CHANNELS},
                          until=lambda frames: len(frames) >= 4)
    ok(command(http, tid, "run.start",
               {"assistant_id": "slow", "input": {"delay_ms": 300}}))
    first = partial.wait()
    assert terminals(first) == 0, "the run ended before the connection dropped"
    last = first[-1]["id"]
    second = EventReader(base_url, tid, {"channels": ALL_CHANNELS, "since": last}, until=ended()).wait()
    joined = [f["id"] for f in first + second]
    assert joined == [f["id"] for f in full.wait()]
    assert len(joined) == len(set(joined))
    ticks = events_of(first + second, "custom")
    assert ticks == [{"tick": "a"}, {"tick": "b"}]


def test_channel_filters(base_url, http):
    """Channels select methods: `lifecycle` alone, `input` for input.requested, `custom`."""
    tid = new_thread(http)
    life = EventReader(base_url, tid, {"channels": ["lifecycle"]}, until=ended())
    custom = EventReader(base_url, tid, {"channels": ["custom", "lifecycle"]}, until=ended())
    named = EventReader(base_url, tid, {"channels": ["custom:other", "lifecycle"]}, until=ended())
    ok(command(http, tid, "run.start", {"assistant_id": "slow", "input": {"delay_ms": 0}}))
    assert {f["event"] for f in life.wait()} == {"lifecycle"}
    assert {f["event"] for f in custom.wait()} == {"custom", "lifecycle"}
    # The written values themselves.
    assert events_of(custom.frames, "custom") == [{"tick": "a"}, {"tick": "b"}]
    # `custom:NAME` takes only custom events of that name; these have none.
    assert {f["event"] for f in named.wait()} == {"lifecycle"}


def test_runs_started_over_plain_http_show_their_lifecycle(base_url, http):
    """A run created with `POST /threads/{id}/runs` (not through a command) still shows on the
    thread event stream, as the reference shows it: running, the values it streamed, then
    completed, named after its graph. Its own SSE stream and the thread's join stream
    announce it with `metadata` and carry no lifecycle events."""
    tid = new_thread(http)
    life = EventReader(base_url, tid, {"channels": ["lifecycle", "values"]}, until=ended(2))
    joined = EventReader(base_url, tid, {"channels": ["lifecycle"]}, until=ended(2))
    r = http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "slow", "input": {"delay_ms": 0}})
    assert_status(r, 200)
    with http.stream("POST", f"/threads/{tid}/runs/stream",
                     json={"assistant_id": "slow", "input": {"delay_ms": 0},
                           "stream_mode": ["values"]}) as s:
        assert_status(s, 200)
        run_frames = parse_frames(s.read().decode())
    frames = life.wait()
    check_envelopes(frames)
    steps = [f["event"] if f["event"] == "values" else f["data"]["params"]["data"]["event"]
             for f in frames]
    assert steps == ["running", "values", "values", "values", "completed"] * 2, steps
    assert {e["graph_name"] for e in events_of(frames, "lifecycle")} == {"slow"}
    assert events_of(frames, "values")[-1] == {"delay_ms": 0, "ticks": 4}
    lifecycle = [f["id"] for f in frames if f["event"] == "lifecycle"]
    assert [f["id"] for f in joined.wait()] == lifecycle
    assert run_frames[0]["event"] == "metadata"
    assert "lifecycle" not in {f["event"] for f in run_frames}
    assert run_frames[-1]["event"] == "values"
    # The thread's join stream replays both runs, every event of theirs but no lifecycle.
    replayed = StreamReader(base_url, f"/threads/{tid}/stream", headers={"Last-Event-ID": "-1"},
                            until=lambda fs: sum(f["data"].get("status") == "run_done"
                                                 for f in fs) == 2).wait()
    assert "lifecycle" not in {f["event"] for f in replayed}
    assert [f["event"] for f in replayed].count("metadata") == 4


def test_namespace_prefix_and_depth(base_url, http):
    """`namespaces` selects a subgraph by prefix (a segment without `:` matches any task id);
    `depth: 0` keeps that namespace only; root events stay out."""
    tid = new_thread(http)
    child = EventReader(base_url, tid, {"channels": ["values", "updates", "lifecycle"],
                                        "namespaces": [["child"]], "depth": 0},
                        until=lambda frames: any(f["event"] == "updates" and
                                                 f["data"]["params"]["node"] == "c2" for f in frames))
    everything = EventReader(base_url, tid, {"channels": ["values", "updates", "lifecycle"]}, until=ended())
    ok(command(http, tid, "run.start", {"assistant_id": "nested", "input": {"messages": []}}))
    frames = child.wait()
    assert frames
    for f in frames:
        ns = f["data"]["params"]["namespace"]
        assert len(ns) == 1 and ns[0].split(":")[0] == "child", ns
    all_frames = everything.wait()
    assert any(f["data"]["params"]["namespace"] == [] for f in all_frames)
    assert any(f["data"]["params"]["namespace"] for f in all_frames)
    # The subgraph's lifecycle: started when first seen, completed after its parent's update,
    # before the root completes.
    life = [(f["data"]["params"]["namespace"], f["data"]["params"]["data"]["event"],
             f["data"]["params"]["data"]["graph_name"])
            for f in all_frames if f["event"] == "lifecycle"]
    assert [(len(ns), event, name) for ns, event, name in life] == [
        (0, "running", "nested"), (1, "started", "child"), (1, "completed", "child"),
        (0, "completed", "nested")], life


def test_subgraph_lifecycle_names_its_task_and_completes_after_its_parents_update(base_url, http):
    """As the reference sends them: a subgraph's `started` carries its `namespace` and the id of
    the task that runs it (`trigger_call_id`); its `completed` follows the parent's update of
    that node (and the task's result), so a client that reads the state on `completed` sees the
    subgraph's writes; then the parent's values and checkpoint."""
    tid = new_thread(http)
    reader = EventReader(base_url, tid, {"channels": ["lifecycle", "updates", "values", "tasks",
                                                      "checkpoints"]}, until=ended())
    ok(command(http, tid, "run.start", {"assistant_id": "nested", "input": {"messages": []}}))
    frames = reader.wait()
    check_envelopes(frames)
    at = {i: f["data"] for i, f in enumerate(frames)}
    [started] = [i for i, e in at.items() if e["method"] == "lifecycle"
                 and e["params"]["data"]["event"] == "started"]
    ns = at[started]["params"]["namespace"]
    assert at[started]["params"]["data"] == {
        "event": "started", "namespace": ns, "graph_name": "child",
        "trigger_call_id": ns[0].split(":", 1)[1]}
    [completed] = [i for i, e in at.items() if e["method"] == "lifecycle"
                   and e["params"]["namespace"] == ns and e["params"]["data"]["event"] == "completed"]
    assert at[completed]["params"]["data"] == {"event": "completed", "graph_name": "child"}
    [update] = [i for i, e in at.items() if e["method"] == "updates"
                and e["params"]["namespace"] == [] and "child" in e["params"]["data"]]
    root_after = [e["method"] for e in list(at.values())[update + 1:]
                  if e["params"]["namespace"] == [] and e["method"] != "lifecycle"]
    assert update < completed, "completed before the parent's update"
    assert [at[i]["method"] for i in range(update + 1, completed)] == ["tasks"]
    assert root_after[:3] == ["tasks", "values", "checkpoints"], root_after


def test_bad_requests_are_refused(base_url, http):
    tid = new_thread(http)
    path = f"/threads/{tid}/stream/events"
    for body in [{}, {"channels": []}, {"channels": ["values", "bogus"]}, {"channels": "values"}]:
        r = http.post(path, json=body)
        assert r.status_code == 400, (body, r.text)
        assert "channels" in r.text
    for body in [{"channels": ["values"], "since": -1}, {"channels": ["values"], "depth": -2},
                 {"channels": ["values"], "depth": "x"}]:
        r = http.post(path, json=body)
        assert r.status_code == 422, (body, r.text)
    r = http.post(path, content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = http.post(f"/threads/{uuid.uuid4()}/stream/events", json={"channels": ["values"]})
    assert r.status_code == 404

    cpath = f"/threads/{tid}/commands"
    r = http.post(cpath, json={"id": "x", "method": "run.start"})
    assert r.status_code == 400 and r.json()["error"] == "invalid_argument"
    r = http.post(cpath, content=b"nope", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert command(http, tid, "bogus.method", {})["error"] == "unknown_command"
    answer = command(http, tid, "run.start", {})
    assert answer["error"] == "invalid_argument" and "assistant_id" in answer["message"]
    answer = command(http, tid, "run.start", {"assistant_id": "no-such-graph"})
    assert answer["error"] == "invalid_argument", answer
    assert command(http, tid, "input.respond", {"interrupt_id": 5})["error"] == "invalid_argument"
    assert command(http, tid, "input.respond", {"responses": []})["error"] == "invalid_argument"
    # Nothing was created by the refused commands.
    assert http.get(f"/threads/{tid}/runs").json() == []


def test_state_commands(base_url, http):
    """`state.get`, `state.listCheckpoints`, `state.fork`, `agent.getTree` after a run."""
    tid = new_thread(http)
    assert command(http, tid, "agent.getTree", {})["error"] == "no_such_run"
    reader = EventReader(base_url, tid, {"channels": ["lifecycle"]}, until=ended())
    ok(command(http, tid, "run.start", {"assistant_id": "agent", "input": AGENT_INPUT}))
    reader.wait()
    state = ok(command(http, tid, "state.get", {"namespace": []}))
    assert state["values"]["messages"][-1]["content"] == "The sum is 5."
    assert isinstance(state["checkpoint"]["id"], str)
    picked = ok(command(http, tid, "state.get", {"namespace": [], "keys": ["nothing"]}))
    assert picked["values"] == {}
    listed = ok(command(http, tid, "state.listCheckpoints", {"limit": 2}))["checkpoints"]
    assert len(listed) == 2 and listed[0]["id"] == state["checkpoint"]["id"]
    assert all(isinstance(c["timestamp"], str) and isinstance(c["step"], int) for c in listed)
    older = ok(command(http, tid, "state.listCheckpoints", {"limit": 1, "before": listed[0]["id"]}))
    assert older["checkpoints"][0]["id"] == listed[1]["id"]
    tree = ok(command(http, tid, "agent.getTree", {}))["tree"]
    assert tree["namespace"] == [] and tree["status"] == "completed" and tree["graph_name"] == "agent"

    bad = command(http, tid, "state.fork", {"checkpoint_id": str(uuid.uuid4())})
    assert bad["error"] == "no_such_checkpoint", bad
    assert command(http, tid, "state.fork", {})["error"] == "invalid_argument"
    first = ok(command(http, tid, "state.listCheckpoints", {"limit": 100}))["checkpoints"][-1]
    forked = ok(command(http, tid, "state.fork", {"checkpoint_id": first["id"], "input": AGENT_INPUT}))
    assert forked["thread_id"] == tid
    uuid.UUID(forked["run_id"])


# ------------------------------------------------------------------------------------------
# the official client
# ------------------------------------------------------------------------------------------


async def collect_until_completed(thread, seen: list[dict]) -> None:
    """Appends the client's events to `seen` until the root lifecycle completes. Over the
    WebSocket the client also hands through the answer to its own subscribe command (so it
    does with the reference): only events are kept."""
    async for event in thread.events:
        if event.get("type") != "event":
            continue
        seen.append(event)
        if (event["method"] == "lifecycle" and event["params"]["namespace"] == []
                and event["params"]["data"]["event"] == "completed"):
            return


async def test_official_client_agent_messages_and_tools(client, http):
    """`client.threads.stream`: values, messages and tool calls of the agent graph."""
    async with client.threads.stream(assistant_id="agent") as thread:
        await thread.run.start(input=AGENT_INPUT)
        output = await thread.output.with_timeout(30)
        assert output["messages"][-1]["content"] == "The sum is 5."
    tid = thread.thread_id
    frames = EventReader(http.base_url, tid, {"channels": ALL_CHANNELS}, until=ended()).wait()
    assert events_of(frames, "tools")


async def test_official_client_events_and_messages(client):
    """The client's event iterator sees lifecycle, tools, values and updates, in seq order; no
    messages, since agent's model does not stream. (The thread exists first: a stream on a
    thread that is not visible is refused with 404 before it opens.)"""
    created = await client.threads.create()
    async with client.threads.stream(created["thread_id"], assistant_id="agent") as thread:
        seen: list[dict] = []
        task = asyncio.create_task(collect_until_completed(thread, seen))
        await asyncio.sleep(0.2)
        await thread.run.start(input=AGENT_INPUT)
        await asyncio.wait_for(task, 30)
    methods = [e["method"] for e in seen]
    for m in ("lifecycle", "tools", "values", "updates"):
        assert m in methods, methods
    assert "messages" not in methods, methods
    seqs = [e["seq"] for e in seen]
    assert seqs == sorted(set(seqs))


async def until_interrupted(thread, every: float) -> None:
    """Waits (looking every `every` s, at most 20 s) until the client's thread shows an
    interrupt."""
    deadline = time.monotonic() + 20
    while not thread.interrupted and time.monotonic() < deadline:
        await asyncio.sleep(every)
    assert thread.interrupted


async def test_official_client_answers_an_interrupt(client):
    """`approval`: the client sees the interrupt (`thread.interrupted`, `thread.interrupts`),
    answers it with `run.respond`, and gets the final output."""
    async with client.threads.stream(assistant_id="approval") as thread:
        await thread.run.start(input=AGENT_INPUT)
        await until_interrupted(thread, every=0.05)
        # The client reads `data.value`; the protocol (and the reference) name it `payload`:
        # both are sent.
        [asked] = thread.interrupts
        assert asked["interrupt_id"] and asked["namespace"] == []
        assert asked["value"] == {"question": "approve?"}
        await thread.run.respond("ok")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            state = await client.threads.get_state(thread.thread_id)
            if state["values"]["messages"][-1]["content"] == "decision: ok":
                break
            await asyncio.sleep(0.1)
        assert state["values"]["messages"][-1]["content"] == "decision: ok"


async def test_input_sent_as_soon_as_the_interrupt_is_seen_resumes_it(client):
    """A client that answers with `run.start` the moment it sees `input.requested` (as
    LangGraph's `RemoteGraph` sends `Command(resume=...)`) resumes the interrupt, though the
    thread may still read `busy` until the asking run's end is committed: the run's logged
    question decides, never the thread's status at that moment. Several tries, since the
    answer used to race the run's end."""
    for attempt in range(5):
        async with client.threads.stream(assistant_id="approval") as thread:
            await thread.run.start(input=AGENT_INPUT)
            await until_interrupted(thread, every=0.005)
            answer = f"yes {attempt}"
            await thread.run.start(input=answer)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                state = await client.threads.get_state(thread.thread_id)
                if state["values"]["messages"][-1]["content"] == f"decision: {answer}":
                    break
                await asyncio.sleep(0.05)
            assert state["values"]["messages"][-1]["content"] == f"decision: {answer}", state
            # The question's run and the answer's: neither failed.
            runs = await client.runs.list(thread.thread_id)
            assert [r["status"] for r in runs] == ["success", "success"], runs


# ------------------------------------------------------------------------------------------
# the WebSocket
# ------------------------------------------------------------------------------------------


class WebSocketSession:
    """A raw protocol WebSocket: `call` sends a command and returns its answer, keeping the
    events that arrive meanwhile in `events`."""

    def __init__(self, ws):
        self.ws = ws
        self.events: list[dict] = []
        self.next_id = 1

    async def call(self, method: str, params: dict) -> dict:
        cid = self.next_id
        self.next_id += 1
        await self.ws.send(json.dumps({"id": cid, "method": method, "params": params}))
        while True:
            message = json.loads(await asyncio.wait_for(self.ws.recv(), 20))
            if message.get("type") != "event":
                assert message["id"] == cid, message
                return message
            self.events.append(message)

    async def until_terminals(self, count: int) -> None:
        """Reads events until `count` root runs have ended."""
        while terminals([{"data": e} for e in self.events]) < count:
            message = json.loads(await asyncio.wait_for(self.ws.recv(), 20))
            assert message["type"] == "event", message
            self.events.append(message)

    def seqs(self) -> list[int]:
        return [e["seq"] for e in self.events]


def ws_url(base_url: str, thread_id: str) -> str:
    return base_url.replace("http://", "ws://") + f"/threads/{thread_id}/stream/events"


ECHO_RUN = {"assistant_id": "echo", "input": {"messages": [{"role": "user", "content": "hi"}]}}


async def test_websocket_carries_commands_and_events(base_url, http):
    """On the WebSocket: subscribe, start a run, get the command answers and each event once
    (two overlapping subscriptions), then unsubscribe; bad commands get protocol errors."""
    from websockets.asyncio.client import connect

    tid = new_thread(http)
    async with connect(ws_url(base_url, tid)) as ws:
        session = WebSocketSession(ws)
        sub = await session.call("subscription.subscribe", {"channels": ["lifecycle", "values"]})
        assert sub["type"] == "success" and sub["result"]["subscription_id"]
        again = await session.call("subscription.subscribe", {"channels": ["lifecycle"]})
        assert again["type"] == "success"
        bad = await session.call("subscription.subscribe", {"channels": ["bogus"]})
        assert bad["type"] == "error" and bad["error"] == "invalid_argument"
        started = await session.call("run.start", ECHO_RUN)
        assert started["type"] == "success"
        await session.until_terminals(1)
        seqs = session.seqs()
        assert seqs == sorted(set(seqs)), seqs
        assert {e["method"] for e in session.events} == {"lifecycle", "values"}
        gone = await session.call("subscription.unsubscribe",
                                  {"subscription_id": sub["result"]["subscription_id"]})
        assert gone["type"] == "success"
        assert gone["meta"]["applied_through_seq"] == seqs[-1]
        missing = await session.call("subscription.unsubscribe", {"subscription_id": "nope"})
        assert missing["error"] == "no_such_subscription"
        state = await session.call("state.get", {"namespace": []})
        assert state["result"]["values"]["messages"]
        await ws.send("not json")
        garbled = json.loads(await asyncio.wait_for(ws.recv(), 20))
        assert garbled["type"] == "error" and garbled["id"] is None


async def test_websocket_subscription_added_later_replays_then_continues_in_order(base_url, http):
    """A subscription added after a run replays that run's events it selects from its `since`,
    once each; after it the socket sends every later event in seq order, whichever
    subscription selects it, and each event once."""
    from websockets.asyncio.client import connect

    tid = new_thread(http)
    async with connect(ws_url(base_url, tid)) as ws:
        session = WebSocketSession(ws)
        assert (await session.call("subscription.subscribe", {"channels": ["values"]}))["type"] == "success"
        assert (await session.call("run.start", ECHO_RUN))["type"] == "success"
        while not any(e["method"] == "values" for e in session.events):
            session.events.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
        first_run = list(session.events)
        later = await session.call("subscription.subscribe", {"channels": ["lifecycle"], "since": 0})
        assert later["type"] == "success"
        await session.until_terminals(1)
        replayed = session.events[len(first_run):]
        assert replayed and {e["method"] for e in replayed} <= {"lifecycle", "values"}
        for _ in range(3):
            assert (await session.call("run.start", ECHO_RUN))["type"] == "success"
        await session.until_terminals(4)
        live = [e for e in session.events if e["seq"] > max(e["seq"] for e in first_run + replayed)]
        assert [e["seq"] for e in live] == sorted({e["seq"] for e in live})
        assert {e["method"] for e in live} == {"lifecycle", "values"}
        seqs = session.seqs()
        assert len(seqs) == len(set(seqs)), "an event was sent twice"
        # The log holds the same events: every lifecycle and values event of the thread.
        reader = EventReader(base_url, tid, {"channels": ["lifecycle", "values"], "since": 0},
                             until=ended(4))
        assert sorted(seqs) == [f["data"]["seq"] for f in reader.wait()]


async def test_websocket_reconnect_restores_a_dropped_sockets_subscription(base_url, http):
    """`subscription.reconnect` on a new socket, with the subscription id and the last seq the
    dropped socket handled, restores that subscription: the two sockets together carry what
    one uninterrupted stream carries, once each and in order."""
    from websockets.asyncio.client import connect

    tid = new_thread(http)
    full = EventReader(base_url, tid, {"channels": ["lifecycle", "custom"]}, until=ended())
    async with connect(ws_url(base_url, tid)) as ws:
        first = WebSocketSession(ws)
        sub = await first.call("subscription.subscribe", {"channels": ["lifecycle", "custom"]})
        sub_id = sub["result"]["subscription_id"]
        started = await first.call("run.start", {"assistant_id": "slow", "input": {"delay_ms": 300}})
        assert started["type"] == "success"
        while len(first.events) < 2:
            first.events.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
    assert terminals([{"data": e} for e in first.events]) == 0, "the run ended too soon"
    async with connect(ws_url(base_url, tid)) as ws:
        second = WebSocketSession(ws)
        answer = await second.call("subscription.reconnect", {
            "run_id": started["result"]["run_id"],
            "last_event_id": str(first.seqs()[-1]),
            "subscriptions": [sub_id],
        })
        assert answer["type"] == "success", answer
        assert answer["result"]["restored"] is True
        await second.until_terminals(1)
        unknown = await second.call("subscription.reconnect", {
            "run_id": started["result"]["run_id"], "subscriptions": ["not-an-id"]})
        assert unknown["result"]["restored"] is False
    assert first.seqs() + second.seqs() == [f["id"] for f in full.wait()]


async def test_official_client_over_websocket(client):
    """`transport="websocket"`: the client's events arrive over the socket."""
    created = await client.threads.create()
    async with client.threads.stream(created["thread_id"], assistant_id="agent",
                                     transport="websocket") as thread:
        seen: list[dict] = []
        task = asyncio.create_task(collect_until_completed(thread, seen))
        await asyncio.sleep(0.3)
        await thread.run.start(input=AGENT_INPUT)
        await asyncio.wait_for(task, 30)
    assert "tools" in {e["method"] for e in seen}
    seqs = [e["seq"] for e in seen]
    assert seqs == sorted(set(seqs))


# ------------------------------------------------------------------------------------------
# a model cut off mid-stream
# ------------------------------------------------------------------------------------------


class CutOffModel(LocalServer):
    """An OpenAI-compatible `/chat/completions` that streams one token and then drops the
    connection, as a model server that crashes mid-answer does."""

    def __init__(self):
        class Handler(QuietHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", "100000")  # promised, never sent
                self.end_headers()
                chunk = {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        super().__init__(Handler)
        self.url = f"{self.origin}/v1"


@pytest.fixture(scope="module")
def cut_off_server():
    """A Spindle serving a graph whose streaming model is cut off mid-answer."""
    model = CutOffModel()
    graph = f"""
state: {{messages: messages}}
models:
  m: {{provider: openai, base_url: "{model.url}", model: fake}}
nodes:
  model: {{kind: model, model: m, stream: true}}
edges:
  - {{from: __start__, to: model}}
  - {{from: model, to: __end__}}
"""
    try:
        with spindle_serving("cutoff", graph) as srv:
            yield srv
    finally:
        model.close()


def test_message_cut_off_by_a_failed_model_ends_with_a_messages_error(cut_off_server):
    """A message whose model fails mid-stream gets no `message-finish`: its last messages event
    is `error` with the failure's message, and then the run's lifecycle is `failed`."""
    with httpx.Client(base_url=cut_off_server.base_url, timeout=30) as http:
        tid = new_thread(http)
        reader = EventReader(cut_off_server.base_url, tid, {"channels": ["messages", "lifecycle"]},
                             until=ended())
        ok(command(http, tid, "run.start", {"assistant_id": "cutoff", "input": AGENT_INPUT}))
        frames = reader.wait()
    check_envelopes(frames)
    msgs = events_of(frames, "messages")
    assert [m["event"] for m in msgs] == [
        "message-start", "content-block-start", "content-block-delta", "error"
    ], msgs
    assert "failed" in msgs[-1]["message"], msgs[-1]
    life = events_of(frames, "lifecycle")
    assert life[-1]["event"] == "failed", life
    assert [f["data"]["method"] for f in frames][-1] == "lifecycle"


# ------------------------------------------------------------------------------------------
# a tool whose output arrives in parts
# ------------------------------------------------------------------------------------------

JOB_PARTS = ["building...\n", "testing...\n", "done: 42 passed\n"]


class ChunkedJobServer(LocalServer):
    """An HTTP endpoint that answers in parts, 100 ms apart (chunked transfer encoding), as a
    job runner streaming its log does."""

    def __init__(self):
        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in JOB_PARTS:
                    data = part.encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.1)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        super().__init__(Handler)
        self.url = self.origin


@pytest.fixture(scope="module")
def job_server():
    """A Spindle serving a graph whose model calls an HTTP tool that answers in parts."""
    jobs = ChunkedJobServer()
    graph = f"""
state: {{messages: messages}}
models:
  m:
    provider: scripted
    responses:
      - content: ""
        tool_calls: [{{name: run_job, args: {{}}, id: call_job}}]
      - "The job passed."
tools:
  run_job: {{kind: http, method: GET, url: "{jobs.url}/job", parameters: {{type: object}}}}
nodes:
  model: {{kind: model, model: m, tools: [run_job]}}
  tools: {{kind: tools, tools: [run_job]}}
edges:
  - {{from: __start__, to: model}}
  - {{from: model, route: tools_condition, to: [tools, __end__]}}
  - {{from: tools, to: model}}
"""
    try:
        with spindle_serving("jobs", graph) as srv:
            yield srv
    finally:
        jobs.close()


async def test_tool_output_arrives_as_deltas_before_the_tool_finishes(job_server):
    """A tool whose output arrives in parts is streamed as `tool-output-delta` events between
    `tool-started` and `tool-finished`: the official client's tool-call handle yields each part
    while the tool runs, and its output is the whole text."""
    from langgraph_sdk import get_client

    client = get_client(url=job_server.base_url)
    async def collect(deltas) -> list[str]:
        return [d async for d in deltas]

    created = await client.threads.create()
    async with client.threads.stream(created["thread_id"], assistant_id="jobs") as thread:
        # The projection feeds its handles while it is iterated: it runs on, apart from the
        # handle's reader.
        handles: asyncio.Queue = asyncio.Queue()

        async def watch():
            async for handle in thread.tool_calls:
                handles.put_nowait(handle)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.2)
        await thread.run.start(input={"messages": [{"role": "human", "content": "run the job"}]})
        handle = await asyncio.wait_for(handles.get(), 30)
        deltas = await asyncio.wait_for(collect(handle.deltas), 30)
        output = await asyncio.wait_for(handle.output, 30)
        assert (await thread.output.with_timeout(30))["messages"][-1]["content"] == "The job passed."
        watcher.cancel()
    assert (handle.tool_call_id, handle.name) == ("call_job", "run_job")
    assert deltas == JOB_PARTS, deltas
    assert output["content"] == "".join(JOB_PARTS), output

    # The same events, replayed from the thread's log.
    frames = EventReader(job_server.base_url, thread.thread_id, {"channels": ["tools"], "since": 0},
                         until=lambda fs: any(f["data"]["params"]["data"]["event"] == "tool-finished"
                                              for f in fs)).wait()
    check_envelopes(frames)
    assert [f["data"]["params"]["data"]["event"] for f in frames] == (
        ["tool-started"] + ["tool-output-delta"] * len(JOB_PARTS) + ["tool-finished"]
    )


# ------------------------------------------------------------------------------------------
# what the `messages` and `custom` channels carry
# ------------------------------------------------------------------------------------------

# agent, with a model that streams: its tool call, then its answer word by word.
STREAMING_AGENT = """
state: {messages: messages}
models:
  m:
    provider: scripted
    chunk: word
    responses:
      - content: ""
        tool_calls: [{name: add, args: {a: 2, b: 3}, id: call_add_1}]
      - "The sum is 5."
tools:
  add:
    kind: script
    description: Add two integers.
    parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}}
    code: "args.a + args.b"
nodes:
  model: {kind: model, model: m, tools: [add]}
  tools: {kind: tools, tools: [add]}
edges:
  - {from: __start__, to: model}
  - {from: model, route: tools_condition, to: [tools, __end__]}
  - {from: tools, to: model}
"""

# One node that writes a named custom value, an unnamed one and a value that is not a dict.
CUSTOM_WRITER = """
state: {ticks: integer}
nodes:
  a:
    kind: script
    code: |
      emit(#{ name: "progress", pct: 50 });
      emit(#{ tick: "a" });
      emit("plain");
      #{ ticks: 1 }
edges:
  - {from: __start__, to: a}
  - {from: a, to: __end__}
"""


@pytest.fixture(scope="module")
def streaming_agent_server():
    with spindle_serving("streamagent", STREAMING_AGENT) as srv:
        yield srv


@pytest.fixture(scope="module")
def custom_server():
    with spindle_serving("writer", CUSTOM_WRITER) as srv:
        yield srv


def test_a_streaming_models_reply_is_on_messages_and_node_messages_are_not(streaming_agent_server):
    """As the reference sends it: `messages` carries the model's two streamed replies (the tool
    call as a tool_call block, the answer as text deltas), and not the tool message the tools
    node returned; the tool call is on `tools`."""
    base_url = streaming_agent_server.base_url
    with httpx.Client(base_url=base_url, timeout=30) as http:
        tid = new_thread(http)
        reader = EventReader(base_url, tid, {"channels": ["messages", "tools", "lifecycle"]},
                             until=ended())
        ok(command(http, tid, "run.start", {"assistant_id": "streamagent", "input": AGENT_INPUT}))
        frames = reader.wait()
    check_envelopes(frames)
    msgs = events_of(frames, "messages")
    starts = [m for m in msgs if m["event"] == "message-start"]
    assert [m["role"] for m in starts] == ["ai", "ai"], msgs
    assert [m["event"] for m in msgs].count("message-finish") == 2, msgs
    finished = [m["content"] for m in msgs if m["event"] == "content-block-finish"]
    assert finished == [
        {"type": "tool_call", "id": "call_add_1", "name": "add", "args": {"a": 2, "b": 3}},
        {"type": "text", "text": "The sum is 5."},
    ], finished
    deltas = [m["delta"]["text"] for m in msgs if m["event"] == "content-block-delta"
              and m["delta"]["type"] == "text-delta"]
    assert deltas == ["The", " ", "sum", " ", "is", " ", "5."], deltas
    tools = events_of(frames, "tools")
    assert [t["event"] for t in tools] == ["tool-started", "tool-finished"], tools
    assert tools[1]["output"]["content"] == "5"


def test_custom_events_carry_the_written_value_and_custom_name_selects_by_its_name(custom_server):
    """`custom` data is the value the node wrote, as the reference sends it; `custom:progress`
    selects the dicts whose `name` is `progress`, and nothing else."""
    base_url = custom_server.base_url
    with httpx.Client(base_url=base_url, timeout=30) as http:
        tid = new_thread(http)
        every = EventReader(base_url, tid, {"channels": ["custom", "lifecycle"]}, until=ended())
        named = EventReader(base_url, tid, {"channels": ["custom:progress", "lifecycle"]},
                            until=ended())
        ok(command(http, tid, "run.start", {"assistant_id": "writer", "input": {}}))
        assert events_of(every.wait(), "custom") == [
            {"name": "progress", "pct": 50}, {"tick": "a"}, "plain"]
        assert events_of(named.wait(), "custom") == [{"name": "progress", "pct": 50}]


async def test_official_client_reads_a_named_custom_stream(custom_server):
    """`thread.extensions["progress"]` (custom events whose `data.name` is `progress`)."""
    from langgraph_sdk import get_client

    client = get_client(url=custom_server.base_url, api_key=None, timeout=30)
    try:
        created = await client.threads.create()
        async with client.threads.stream(created["thread_id"], assistant_id="writer") as thread:
            got: asyncio.Queue = asyncio.Queue()

            async def watch():
                async for item in thread.extensions["progress"]:
                    got.put_nowait(item)

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0.2)
            await thread.run.start(input={})
            item = await asyncio.wait_for(got.get(), 20)
            await thread.output.with_timeout(30)
            watcher.cancel()
        assert item == {"name": "progress", "pct": 50}
        assert got.empty()
    finally:
        await client.aclose()
