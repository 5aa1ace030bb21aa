"""Existing LangGraph Python projects run unchanged on Spindle, driven by the official clients.

Two projects under ``tests/e2e/projects``, each served by its own Spindle (fixtures
``template_server`` / ``react_server`` in conftest.py), on both backends:

- ``template``: LangGraph's ``new-langgraph-project`` template as ``langgraph new`` writes it (a
  ``Context`` TypedDict read through ``Runtime[Context]``, a ``State`` dataclass, one async node,
  ``compile(name="New Graph")``), plus a variable from its ``.env`` (``"env": ".env"``).
- ``react``: the ``react-agent`` template (a model node bound to tools, a ``ToolNode``, routing on
  tool calls, dataclass state with ``add_messages``) with a scripted fake chat model that streams,
  and long-term memory: the ``save_memory`` tool writes the store with ``get_store()``, the model
  node reads it back through ``runtime.store``.

Every expectation here is what the reference server (``langgraph dev`` in the project folder)
answers too, unless a comment says otherwise; point the suite at it with ``SPINDLE_E2E_URL`` plus
``SPINDLE_E2E_TEMPLATE_URL`` / ``SPINDLE_E2E_REACT_URL``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

JS_DIR = Path(__file__).resolve().parents[1] / "js"

# The template's node, formatted as it formats its answer (".env" gives the greeting).
GREETING = "Hello from .env"


def _template_answer(changeme: str, param: str) -> str:
    return f"{GREETING}: output from call_model (input {changeme!r}). Configured with {param}"


async def _thread(client) -> str:
    return (await client.threads.create())["thread_id"]


async def _default_assistant(client, graph_id: str = "agent") -> dict:
    found = await client.assistants.search(graph_id=graph_id, metadata={"created_by": "system"})
    assert len(found) == 1, found
    return found[0]


def _user() -> str:
    """A user of its own per test, so memories of other tests (and backends) never show."""
    return "user-" + secrets.token_hex(4)


# --------------------------------------------------------------------------------------------
# the new-langgraph-project template
# --------------------------------------------------------------------------------------------


async def test_template_graph_runs_with_the_context_and_the_env_file(template_client):
    """A client passes `context` to a run and the node reads it from `runtime.context`; the
    project's `.env` is in the node's environment; the thread keeps the dataclass state as a
    JSON object, and a run without input or context gets the dataclass's and the node's
    defaults."""
    thread = await _thread(template_client)
    out = await template_client.runs.wait(
        thread, "agent", input={"changeme": "hi"}, context={"my_configurable_param": "ctx-value"}
    )
    expected = {"changeme": _template_answer("hi", "ctx-value")}
    assert out == expected

    state = await template_client.threads.get_state(thread)
    assert state["values"] == expected
    assert state["next"] == []
    assert state["tasks"] == []
    assert state["metadata"]["step"] == 1 and state["metadata"]["source"] == "loop"
    assert state["checkpoint"]["thread_id"] == thread
    got = await template_client.threads.get(thread)
    assert got["status"] == "idle"
    assert got["values"] == expected

    # Stateless, no context: State's default ("example") and the node's "default_value".
    out = await template_client.runs.wait(None, "agent", input={})
    assert out == {"changeme": _template_answer("example", "default_value")}


async def test_template_assistant_context_reaches_the_node(template_client):
    """The template says its context is set "when creating assistants OR when invoking the
    graph": a client creates an assistant of the graph with a context, runs it, and the node
    reads that context; a run's own context then wins over the assistant's."""
    assistant = await template_client.assistants.create(
        "agent", context={"my_configurable_param": "from-assistant"}, name="configured"
    )
    assert assistant["graph_id"] == "agent"
    assert assistant["context"] == {"my_configurable_param": "from-assistant"}
    out = await template_client.runs.wait(None, assistant["assistant_id"], input={})
    assert out == {"changeme": _template_answer("example", "from-assistant")}
    out = await template_client.runs.wait(
        None, assistant["assistant_id"], input={}, context={"my_configurable_param": "from-run"}
    )
    assert out == {"changeme": _template_answer("example", "from-run")}


async def test_template_configurable_reaches_the_context_when_no_context_is_given(template_client):
    """Clients written before LangGraph 0.6 (and tools that still do) pass the settings as
    `config.configurable`; the reference hands a run without `context` its configurable as
    the context, so `runtime.context` of a graph with a context schema sees them."""
    out = await template_client.runs.wait(
        None, "agent", input={}, config={"configurable": {"my_configurable_param": "from-configurable"}}
    )
    assert out == {"changeme": _template_answer("example", "from-configurable")}


async def test_the_default_assistants_are_named_after_the_compiled_graphs(template_client, react_client):
    """A UI (Studio, agent-chat-ui) lists the graph's default assistant by its name: the
    reference names it after `compile(name=...)` ("New Graph", "ReAct Agent"), the graph id
    only for a graph left with LangGraph's default name."""
    assert (await _default_assistant(template_client))["name"] == "New Graph"
    assert (await _default_assistant(react_client))["name"] == "ReAct Agent"


async def test_template_schemas_describe_the_dataclass_state(template_client):
    """A client (Studio's input form) reads a graph's schemas: the dataclass State's field
    with its default for input, output and state."""
    assistant = await _default_assistant(template_client)
    schemas = await template_client.assistants.get_schemas(assistant["assistant_id"])
    assert schemas["graph_id"] == "agent"
    for key in ("input_schema", "output_schema", "state_schema"):
        assert list(schemas[key]["properties"]) == ["changeme"], key
    assert schemas["input_schema"]["properties"]["changeme"]["default"] == "example"
    # NOT shared with the reference: on Python < 3.12 pydantic cannot build a schema from the
    # template's `typing.TypedDict` Context, and the reference then answers 500 for the whole
    # endpoint. Spindle's worker answers that one schema as null instead; on Python >= 3.12 it
    # is the Context's.
    context = schemas["context_schema"]
    assert context is None or list(context["properties"]) == ["my_configurable_param"]


# --------------------------------------------------------------------------------------------
# the react-agent project
# --------------------------------------------------------------------------------------------

WEATHER = {"messages": [{"type": "human", "content": "What is the weather in Paris?"}]}


async def test_react_agent_calls_a_tool_then_answers(react_client):
    """`runs.wait` returns the whole conversation: the human message, the model's tool call,
    the ToolNode's result for that call id, and the model's final answer; the thread's state
    and history hold every step of the loop, newest first."""
    thread = await _thread(react_client)
    out = await react_client.runs.wait(thread, "agent", input=WEATHER, context={"user_id": _user()})
    messages = out["messages"]
    assert [m["type"] for m in messages] == ["human", "ai", "tool", "ai"]
    call = messages[1]["tool_calls"][0]
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    assert messages[2]["tool_call_id"] == call["id"]
    assert messages[2]["name"] == "get_weather"
    assert messages[2]["content"] == "It is sunny in Paris."
    assert messages[3]["content"] == "It is sunny in Paris."
    assert messages[3]["tool_calls"] == []
    assert all(m["id"] for m in messages)

    state = await react_client.threads.get_state(thread)
    assert state["values"]["messages"] == messages
    assert state["next"] == []
    history = await react_client.threads.get_history(thread, limit=10)
    assert [h["metadata"]["step"] for h in history] == [3, 2, 1, 0, -1]
    assert [h["next"] for h in history] == [[], ["call_model"], ["tools"], ["call_model"], ["__start__"]]
    assert [len(h["values"].get("messages", [])) for h in history] == [4, 3, 2, 1, 0]


async def test_react_agent_streams_messages_tuple_tokens(react_client):
    """`stream_mode="messages-tuple"`: each event `messages` is `[message chunk, metadata]`;
    the model's tool call streams as tool-call chunks, the tool's message comes whole, the
    answer streams word by word and the chunks join into the text the thread keeps. The
    metadata names the node that produced the chunk."""
    thread = await _thread(react_client)
    chunks = [
        c
        async for c in react_client.runs.stream(
            thread, "agent", input=WEATHER, context={"user_id": _user()}, stream_mode="messages-tuple"
        )
    ]
    assert chunks[0].event == "metadata"
    assert {c.event for c in chunks[1:]} == {"messages"}
    pairs = [c.data for c in chunks[1:]]
    assert all(isinstance(p, list) and len(p) == 2 for p in pairs)

    ai = [(m, meta) for m, meta in pairs if m["type"] == "AIMessageChunk"]
    by_id: dict[str, list[dict]] = {}
    for m, meta in ai:
        assert meta["langgraph_node"] == "call_model"
        by_id.setdefault(m["id"], []).append(m)
    assert len(by_id) == 2, list(by_id)  # the tool-calling turn, then the answer
    calling, answering = by_id.values()
    assert len(calling) > 1 and len(answering) > 1  # streamed, not one final message
    tool_chunks = [tc for m in calling for tc in m["tool_call_chunks"]]
    assert tool_chunks[0]["name"] == "get_weather"
    assert json.loads("".join(tc["args"] for tc in tool_chunks)) == {"city": "Paris"}
    text = "".join(m["content"] for m in answering)
    assert text == "It is sunny in Paris."

    tools = [(m, meta) for m, meta in pairs if m["type"] == "tool"]
    assert [(m["content"], meta["langgraph_node"]) for m, meta in tools] == [("It is sunny in Paris.", "tools")]

    final = (await react_client.threads.get_state(thread))["values"]["messages"]
    assert final[-1]["content"] == text


async def test_react_agent_streams_accumulated_messages(react_client):
    """`stream_mode="messages"`: per message, `messages/metadata` once, then
    `messages/partial` with the message accumulated so far (the last one is the whole
    answer), or `messages/complete` for a message not streamed (the tool's)."""
    thread = await _thread(react_client)
    chunks = [
        c
        async for c in react_client.runs.stream(
            thread, "agent", input=WEATHER, context={"user_id": _user()}, stream_mode="messages"
        )
    ]
    assert chunks[0].event == "metadata"
    assert {c.event for c in chunks[1:]} == {"messages/metadata", "messages/partial", "messages/complete"}

    seen_metadata: set[str] = set()
    partials: dict[str, list[dict]] = {}
    completes: list[dict] = []
    for c in chunks[1:]:
        if c.event == "messages/metadata":
            (msg_id, meta), = c.data.items()
            assert msg_id not in seen_metadata  # once per message
            assert meta["metadata"]["langgraph_node"] in ("call_model", "tools")
            seen_metadata.add(msg_id)
            continue
        (message,) = c.data
        assert message["id"] in seen_metadata  # its metadata came first
        if c.event == "messages/partial":
            partials.setdefault(message["id"], []).append(message)
        else:
            completes.append(message)

    calling, answering = partials.values()
    assert calling[-1]["type"] == "ai"
    assert [(t["name"], t["args"]) for t in calling[-1]["tool_calls"]] == [("get_weather", {"city": "Paris"})]
    texts = [m["content"] for m in answering]
    assert len(texts) > 1 and all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # accumulated
    assert texts[-1] == "It is sunny in Paris."
    assert [(m["type"], m["content"]) for m in completes] == [("tool", "It is sunny in Paris.")]


def _iso(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


async def test_react_agent_streams_updates_debug_tasks_and_checkpoints(react_client):
    """Several modes at once, as LangGraph Studio asks for them: `updates` per node,
    `debug` events `{type, step, timestamp, payload}`, `tasks` (a start with `input`, an
    end with `result`), and `checkpoints` with `values`/`next`/`config`, the last one being
    the thread's current checkpoint."""
    thread = await _thread(react_client)
    chunks = [
        c
        async for c in react_client.runs.stream(
            thread,
            "agent",
            input=WEATHER,
            context={"user_id": _user()},
            stream_mode=["updates", "debug", "tasks", "checkpoints"],
        )
    ]
    assert chunks[0].event == "metadata"
    assert {c.event for c in chunks[1:]} == {"updates", "debug", "tasks", "checkpoints"}

    updates = [c.data for c in chunks if c.event == "updates"]
    assert [list(u) for u in updates] == [["call_model"], ["tools"], ["call_model"]]
    assert updates[1]["tools"]["messages"][0]["content"] == "It is sunny in Paris."

    debug = [c.data for c in chunks if c.event == "debug"]
    for d in debug:
        assert set(d) == {"type", "step", "timestamp", "payload"}, d
        _iso(d["timestamp"])
    assert [d["step"] for d in debug if d["type"] == "checkpoint"] == [-1, 0, 1, 2, 3]
    assert [d["payload"]["name"] for d in debug if d["type"] == "task"] == ["call_model", "tools", "call_model"]
    assert [d["payload"]["name"] for d in debug if d["type"] == "task_result"] == ["call_model", "tools", "call_model"]

    tasks = [c.data for c in chunks if c.event == "tasks"]
    starts = [t for t in tasks if "input" in t]
    ends = [t for t in tasks if "result" in t]
    assert len(starts) + len(ends) == len(tasks) == 6
    assert [(t["name"], t["triggers"]) for t in starts] == [
        ("call_model", ["branch:to:call_model"]),
        ("tools", ["branch:to:tools"]),
        ("call_model", ["branch:to:call_model"]),
    ]
    assert [t["id"] for t in ends] == [t["id"] for t in starts]
    assert all(t["error"] is None and t["interrupts"] == [] for t in ends)
    assert starts[0]["input"]["messages"][0]["content"] == "What is the weather in Paris?"
    assert ends[0]["result"]["messages"][0]["tool_calls"][0]["name"] == "get_weather"

    checkpoints = [c.data for c in chunks if c.event == "checkpoints"]
    assert len(checkpoints) == 5
    for cp in checkpoints:
        assert {"values", "next", "config", "metadata", "parent_config", "tasks"} <= set(cp)
        assert cp["config"]["configurable"]["thread_id"] == thread
    assert [cp["metadata"]["step"] for cp in checkpoints] == [-1, 0, 1, 2, 3]
    assert [cp["next"] for cp in checkpoints] == [["__start__"], ["call_model"], ["tools"], ["call_model"], []]
    assert checkpoints[0]["parent_config"] is None
    for parent, child in zip(checkpoints, checkpoints[1:]):
        assert child["parent_config"]["configurable"]["checkpoint_id"] == parent["config"]["configurable"]["checkpoint_id"]
    last = checkpoints[-1]
    assert [m["type"] for m in last["values"]["messages"]] == ["human", "ai", "tool", "ai"]
    state = await react_client.threads.get_state(thread)
    assert state["checkpoint"]["checkpoint_id"] == last["config"]["configurable"]["checkpoint_id"]
    # The debug view of the same checkpoint names it as the API's `checkpoint` object.
    last_debug = [d for d in debug if d["type"] == "checkpoint"][-1]["payload"]
    assert last_debug["checkpoint"] == {
        "thread_id": thread,
        "checkpoint_ns": "",
        "checkpoint_id": state["checkpoint"]["checkpoint_id"],
    }


async def test_react_agent_streams_langchain_events(react_client):
    """`stream_mode="events"` gives LangChain's astream_events v2: the graph's and nodes'
    chain events, the chat model's start/stream/end (whose tokens join into the answer) and
    the tool's start/end."""
    thread = await _thread(react_client)
    chunks = [
        c
        async for c in react_client.runs.stream(
            thread, "agent", input=WEATHER, context={"user_id": _user()}, stream_mode="events"
        )
    ]
    assert chunks[0].event == "metadata"
    assert {c.event for c in chunks[1:]} == {"events"}
    events = [c.data for c in chunks[1:]]
    kinds = [e["event"] for e in events]
    for kind in ("on_chain_start", "on_chain_end", "on_chat_model_start", "on_chat_model_stream",
                 "on_chat_model_end", "on_tool_start", "on_tool_end"):
        assert kind in kinds, kind
    assert (events[0]["event"], events[0]["name"]) == ("on_chain_start", "ReAct Agent")
    assert (events[-1]["event"], events[-1]["name"]) == ("on_chain_end", "ReAct Agent")
    tool_start = next(e for e in events if e["event"] == "on_tool_start")
    assert tool_start["name"] == "get_weather"
    assert tool_start["data"]["input"] == {"city": "Paris"}

    model_runs = [e["run_id"] for e in events if e["event"] == "on_chat_model_start"]
    assert len(model_runs) == 2
    tokens = [e["data"]["chunk"]["content"] for e in events
              if e["event"] == "on_chat_model_stream" and e["run_id"] == model_runs[1]]
    assert len(tokens) > 1
    assert "".join(tokens) == "It is sunny in Paris."
    for e in events:
        assert {"event", "name", "run_id", "data", "metadata", "tags"} <= set(e), e


async def test_react_agent_memories_go_through_the_store(react_client):
    """Long-term memory across threads: an item a client puts is read by the model node
    (`runtime.store`); an item the agent's tool puts (`get_store()`) is then visible to the
    client (`store.search_items`, `store.get_item`) and read by the agent in a new thread."""
    user = _user()
    namespace = ["memories", user]
    await react_client.store.put_item(namespace, "seed", {"fact": "I like green tea"})

    thread = await _thread(react_client)
    out = await react_client.runs.wait(thread, "agent", input=WEATHER, context={"user_id": user})
    assert out["messages"][-1]["content"] == "It is sunny in Paris. You told me: I like green tea."

    remember = {"messages": [{"type": "human", "content": "Remember that I live in Lyon"}]}
    out = await react_client.runs.wait(thread, "agent", input=remember, context={"user_id": user})
    # The same thread goes on: both turns, each with its tool call.
    assert [m["type"] for m in out["messages"]] == ["human", "ai", "tool", "ai"] * 2
    assert out["messages"][5]["tool_calls"][0]["name"] == "save_memory"
    assert out["messages"][-1]["content"] == "Saved: I live in Lyon"

    found = (await react_client.store.search_items(namespace))["items"]
    assert sorted(i["value"]["fact"] for i in found) == ["I like green tea", "I live in Lyon"]
    written = next(i for i in found if i["key"] != "seed")
    assert written["namespace"] == namespace
    item = await react_client.store.get_item(namespace, written["key"])
    assert item["value"] == {"fact": "I live in Lyon"}
    assert item["key"] == written["key"] and item["namespace"] == namespace
    _iso(item["created_at"])
    # Nothing leaked to the default user's namespace.
    assert (await react_client.store.search_items(["memories", "default-user"]))["items"] == []

    # A new thread of the same user: the agent reads both memories, oldest first.
    out = await react_client.runs.wait(None, "agent", input=WEATHER, context={"user_id": user})
    assert out["messages"][-1]["content"] == (
        "It is sunny in Paris. You told me: I like green tea; I live in Lyon."
    )


async def test_react_agent_stops_before_its_tools_for_review_and_goes_on(react_client):
    """Human in the loop the agent-inbox way: `interrupt_before=["tools"]` stops the run with
    the model's tool call pending (thread `interrupted`, next `tools`); a run with no input
    then executes the tool and answers."""
    user = _user()
    thread = await _thread(react_client)
    out = await react_client.runs.wait(
        thread, "agent", input=WEATHER, context={"user_id": user}, interrupt_before=["tools"]
    )
    assert [m["type"] for m in out["messages"]] == ["human", "ai"]
    assert out["messages"][-1]["tool_calls"][0]["args"] == {"city": "Paris"}
    state = await react_client.threads.get_state(thread)
    assert state["next"] == ["tools"]
    assert [(t["name"], t["interrupts"]) for t in state["tasks"]] == [("tools", [])]
    assert (await react_client.threads.get(thread))["status"] == "interrupted"

    out = await react_client.runs.wait(thread, "agent", input=None, context={"user_id": user})
    assert [m["type"] for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    assert out["messages"][-1]["content"] == "It is sunny in Paris."
    assert (await react_client.threads.get(thread))["status"] == "idle"


async def test_react_agent_background_run_replays_its_tokens_to_a_late_joiner(react_client):
    """A client starts a run in the background with the modes it wants, and joins it later:
    `join_stream` gives every event from the start, tokens included, then the end."""
    thread = await _thread(react_client)
    run = await react_client.runs.create(
        thread, "agent", input=WEATHER, context={"user_id": _user()}, stream_mode=["messages-tuple", "values"]
    )
    chunks = [c async for c in react_client.runs.join_stream(thread, run["run_id"])]
    assert chunks[0].event == "metadata"
    assert chunks[0].data["run_id"] == run["run_id"]
    assert {c.event for c in chunks[1:]} == {"messages", "values"}
    values = [c.data for c in chunks if c.event == "values"]
    assert [len(v["messages"]) for v in values] == [1, 2, 3, 4]
    ai = [c.data[0] for c in chunks if c.event == "messages" and c.data[0]["type"] == "AIMessageChunk"]
    last_id = ai[-1]["id"]
    assert "".join(m["content"] for m in ai if m["id"] == last_id) == "It is sunny in Paris."
    assert (await react_client.runs.get(thread, run["run_id"]))["status"] == "success"


async def test_react_agent_concurrent_runs_keep_to_their_threads(react_client):
    """Several users at once: runs on different threads execute together (over the server's
    Python workers) and each thread ends with its own conversation."""
    cities = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo"]

    async def ask(city: str) -> tuple[str, dict]:
        thread = await _thread(react_client)
        question = {"messages": [{"type": "human", "content": f"What is the weather in {city}?"}]}
        return thread, await react_client.runs.wait(thread, "agent", input=question, context={"user_id": _user()})

    results = await asyncio.gather(*(ask(city) for city in cities))
    for city, (thread, out) in zip(cities, results):
        assert out["messages"][-1]["content"] == f"It is sunny in {city}."
        state = await react_client.threads.get_state(thread)
        assert state["values"]["messages"][0]["content"] == f"What is the weather in {city}?"
        assert len(state["values"]["messages"]) == 4


async def test_react_schemas_describe_the_input_and_the_context(react_client):
    """Studio builds its input and context forms from `/schemas`: the input is `InputState`
    (messages only), the context the `Context` dataclass with its defaults."""
    assistant = await _default_assistant(react_client)
    schemas = await react_client.assistants.get_schemas(assistant["assistant_id"])
    assert schemas["graph_id"] == "agent"
    assert list(schemas["input_schema"]["properties"]) == ["messages"]
    assert list(schemas["state_schema"]["properties"]) == ["messages"]
    context = schemas["context_schema"]
    assert context["title"] == "Context"
    assert set(context["properties"]) == {"system_prompt", "model", "user_id"}
    assert context["properties"]["user_id"]["default"] == "default-user"


# --------------------------------------------------------------------------------------------
# the JS client
# --------------------------------------------------------------------------------------------


def test_js_client_runs_the_python_projects(template_server, react_server):
    """Clients written with the JS SDK stream the ReAct agent's tokens and wait for the
    template graph unchanged (tests/js/python_graphs.test.mjs)."""
    node = shutil.which("node")
    if node is None or not (JS_DIR / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
        if os.environ.get("SPINDLE_TEST_REQUIRE_JS") == "1":
            pytest.fail("node or tests/js/node_modules is missing (run `npm ci` in tests/js)")
        pytest.skip("node or tests/js/node_modules is missing (run `npm ci` in tests/js)")
    r = subprocess.run(
        [node, "--test", "python_graphs.test.mjs"],
        cwd=JS_DIR,
        env={
            **os.environ,
            "SPINDLE_TEMPLATE_URL": template_server.base_url,
            "SPINDLE_REACT_URL": react_server.base_url,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"node --test failed:\n{r.stdout}\n{r.stderr}"
