"""The `messages` and `events` stream modes through the official Python client.

`messages` is LangGraph Platform's accumulated form: `messages/metadata` the first time a
message id is seen, then `messages/partial` (the message so far, while a model streams tokens)
or `messages/complete` (a whole message a node returned). `events` sends LangChain's
`astream_events` v2 dicts as SSE event `events`.
"""

from __future__ import annotations

import pytest
from e2e_util import spindle_serving
from langgraph_sdk import get_client

AGENT_INPUT = {"messages": [{"role": "user", "content": "add 2 and 3"}]}

# A chat model that streams its answer word by word, as LangChain's GenericFakeChatModel does.
STREAMER = """
state: {messages: messages}
models:
  m: {provider: scripted, chunk: word, responses: ["Hello big world"]}
nodes:
  model: {kind: model, model: m}
edges:
  - {from: __start__, to: model}
  - {from: model, to: __end__}
"""


async def stream(client, thread_id, graph, **kwargs):
    return [part async for part in client.runs.stream(thread_id, graph, **kwargs)]


async def test_messages_mode_sends_metadata_then_complete_messages(client, tag):
    """On `agent`, whose nodes return whole messages: each new message is announced once with
    its metadata, then sent complete; the last one is the answer."""
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    parts = await stream(client, tid, "agent", input=AGENT_INPUT, stream_mode="messages")
    assert parts[0].event == "metadata"
    events = [p.event for p in parts[1:]]
    assert events == ["messages/metadata", "messages/complete"] * 3, events
    metas = [p.data for p in parts if p.event == "messages/metadata"]
    completes = [p.data for p in parts if p.event == "messages/complete"]
    for meta, (message,) in zip(metas, completes):
        # `{message_id: {"metadata": {...}}}`, announcing the message that follows.
        assert list(meta) == [message["id"]]
        assert meta[message["id"]]["metadata"]["langgraph_node"] in ("model", "tools")
    assert [m[0]["type"] for m in completes] == ["ai", "tool", "ai"]
    assert completes[0][0]["tool_calls"][0]["name"] == "add"
    assert completes[1][0]["content"] == "5"
    assert completes[-1][0]["content"] == "The sum is 5."


async def test_tasks_mode_task_starts_carry_empty_interrupts(client, tag, backend):
    """`tasks` on `chain`: each task's start has `interrupts: []`, as the JS client's
    `TasksStreamCreateEvent` declares it (the reference leaves it out), and its result the
    interrupts it raised (none)."""
    if backend == "external":
        pytest.skip("the reference's task starts have no `interrupts`")
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    parts = await stream(client, tid, "chain", input={"n": 0}, stream_mode="tasks")
    tasks = [p.data for p in parts if p.event == "tasks"]
    starts = [t for t in tasks if "input" in t]
    results = [t for t in tasks if "result" in t]
    assert [t["name"] for t in starts] == ["a", "b", "c"], tasks
    assert all(t["interrupts"] == [] for t in starts), starts
    assert all(t["interrupts"] == [] for t in results), results
    assert list(starts[0]) == ["id", "name", "interrupts", "input", "triggers", "metadata"]


async def test_messages_mode_a_streamed_reply_ends_with_its_whole_text(streaming_server):
    """As the reference sends a streamed reply (checked live, langgraph-api 0.16.7): metadata,
    then partials only, the last one the whole final AI message; no `messages/complete`
    follows (the message a node returns after streaming it is not sent again)."""
    client = get_client(url=streaming_server.base_url, api_key=None, timeout=30)
    try:
        tid = (await client.threads.create())["thread_id"]
        parts = await stream(client, tid, "streamer",
                             input={"messages": [{"role": "user", "content": "hi"}]},
                             stream_mode="messages")
        events = [p.event for p in parts[1:]]
        assert events == ["messages/metadata"] + ["messages/partial"] * 5, events
        state = await client.threads.get_state(tid)
        final = state["values"]["messages"][-1]
        last = parts[-1].data[0]
        assert (last["id"], last["content"], last["type"]) == (final["id"], final["content"], "ai")
    finally:
        await client.aclose()


async def test_asked_for_both_message_forms_the_tuple_form_is_sent(client, tag):
    """As on LangGraph Platform, `messages-tuple` wins when both forms are asked for."""
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    parts = await stream(
        client,
        tid,
        "echo",
        input={"messages": [{"role": "user", "content": "hi"}]},
        stream_mode=["messages", "messages-tuple"],
    )
    assert [p.event for p in parts[1:]] == ["messages"]
    message, metadata = parts[1].data
    assert message["content"] == "echo: hi"
    assert metadata["langgraph_node"] == "respond"


async def test_events_mode_wraps_the_graph_run(client, tag):
    """`events` on `chain`: the graph's `on_chain_start` comes first and its `on_chain_end`,
    with the final values, last; each node is a run below the graph."""
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    parts = await stream(client, tid, "chain", input={"n": 0}, stream_mode="events")
    assert parts[0].event == "metadata"
    run_id = parts[0].data["run_id"]
    events = [p.data for p in parts[1:]]
    assert all(p.event == "events" for p in parts[1:]), [p.event for p in parts]
    first, last = events[0], events[-1]
    assert (first["event"], first["name"], first["run_id"]) == ("on_chain_start", "chain", run_id)
    assert first["data"] == {"input": {"n": 0}}
    assert (last["event"], last["name"], last["run_id"]) == ("on_chain_end", "chain", run_id)
    assert last["data"]["output"] == {"n": 3}
    nodes = [(e["event"], e["name"]) for e in events[1:-1]]
    assert nodes == [
        (kind, node) for node in "abc" for kind in ("on_chain_start", "on_chain_stream", "on_chain_end")
    ]
    ends = [e for e in events if e["event"] == "on_chain_end" and e["name"] == "a"]
    assert ends[0]["data"] == {"output": {"n": 1}, "input": {"n": 0}}
    assert all(e["parent_ids"] == [run_id] for e in events[1:-1])
    assert all(set(e) >= {"event", "name", "run_id", "tags", "metadata", "data", "parent_ids"} for e in events)


async def test_events_mode_shows_routers_tools_and_models(client, tag, backend):
    """`events` on `agent`: the router after the model, the tool call and the model calls are
    runs below their nodes. (The reference's twin of `agent` calls no model or tool.)"""
    if backend == "external":
        pytest.skip("the reference's agent twin has no chat model or tool runs")
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    parts = await stream(client, tid, "agent", input=AGENT_INPUT, stream_mode=["events"])
    events = [p.data for p in parts if p.event == "events"]
    by_kind = [(e["event"], e["name"]) for e in events]
    assert by_kind[0] == ("on_chain_start", "agent")
    assert by_kind[-1] == ("on_chain_end", "agent")
    assert ("on_chain_end", "tools_condition") in by_kind
    tool_end = next(e for e in events if e["event"] == "on_tool_end")
    assert tool_end["name"] == "add"
    assert tool_end["data"]["input"] == {"a": 2, "b": 3}
    assert tool_end["data"]["output"]["content"] == "5"
    tools_node = next(e for e in events if e["event"] == "on_chain_start" and e["name"] == "tools")
    assert tool_end["parent_ids"] == [parts[0].data["run_id"], tools_node["run_id"]]
    model_ends = [e for e in events if e["event"] == "on_chat_model_end"]
    assert [e["data"]["output"]["content"] for e in model_ends] == ["", "The sum is 5."]


@pytest.fixture(scope="module")
def streaming_server():
    """A Spindle serving a graph whose model streams tokens (not among the examples)."""
    with spindle_serving("streamer", STREAMER) as srv:
        yield srv


async def test_messages_mode_sends_the_message_so_far_while_a_model_streams(streaming_server):
    """Each token chunk becomes `messages/partial` with the whole message so far, as a plain
    `ai` message; the last partial is the full answer."""
    client = get_client(url=streaming_server.base_url, api_key=None, timeout=30)
    try:
        tid = (await client.threads.create())["thread_id"]
        parts = await stream(
            client,
            tid,
            "streamer",
            input={"messages": [{"role": "user", "content": "hi"}]},
            stream_mode="messages",
        )
        assert [p.event for p in parts[1:3]] == ["messages/metadata", "messages/partial"]
        partials = [p.data[0] for p in parts if p.event == "messages/partial"]
        assert [m["content"] for m in partials] == ["Hello", "Hello ", "Hello big", "Hello big ", "Hello big world"]
        assert {m["type"] for m in partials} == {"ai"}
        assert len({m["id"] for m in partials}) == 1
        (meta,) = [p.data for p in parts if p.event == "messages/metadata"]
        assert meta[partials[0]["id"]]["metadata"]["ls_model_type"] == "chat"

        tid = (await client.threads.create())["thread_id"]
        parts = await stream(
            client,
            tid,
            "streamer",
            input={"messages": [{"role": "user", "content": "hi"}]},
            stream_mode="events",
        )
        kinds = [p.data["event"] for p in parts if p.event == "events"]
        assert kinds.count("on_chat_model_stream") == 5
        assert kinds[0] == "on_chain_start" and kinds[-1] == "on_chain_end"
    finally:
        await client.aclose()
