"""Python twins of Spindle's example graphs, for the LangGraph reference server.

Copied from shared/ref/graphs for the benchmark: bench/run copies the folder above to a
temporary directory and runs `langgraph dev --no-browser --no-reload --port P` in it. The
benchmark runs `chain`; its twin must keep doing what examples/graphs/chain.yaml does. Spindle ships
graphs with the same ids and the same observable behaviour (final values, interrupts, errors,
the order of nodes), so one client script can run against both servers side by side.

- echo:     {"messages"} with add_messages. Node `respond` appends AI "echo: <last message text>".
- chain:    {"n": int}. Nodes a -> b -> c, each adds 1.
- approval: {"messages"}. Node `ask` interrupts with {"question": "approve?"}; after resuming
            with value V it appends AI "decision: V".
- agent:    {"messages"}. A tool-calling loop with a deterministic model: on a human message the
            `model` node answers with one tool call add(a=2, b=3) (id "call_add_1"); the `tools`
            node answers with tool message "5"; on a tool message the model answers
            "The sum is 5." and the graph ends.
- fanout:   {"items": [str], "results": [str] (appended)}. One `work` task per item, sent in
            parallel with Send; each appends the item upper-cased. Order follows the items.
- nested:   {"messages"}. Node `prep` appends AI "prep", then node `child` runs a subgraph whose
            nodes c1 then c2 append AI "c1" and AI "c2".
- slow:     {"delay_ms": int, "ticks": int}. Nodes a -> b; each emits a custom event
            {"tick": <node>}, sleeps delay_ms, and adds 1 to ticks.
- fail:     node `boom` raises ValueError("boom").
"""
import asyncio
import operator
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send, interrupt


class Chat(TypedDict):
    messages: Annotated[list, add_messages]


def _text(m) -> str:
    return m.content if hasattr(m, "content") else m.get("content", "")


def respond(state: Chat):
    msgs = state.get("messages") or []
    return {"messages": [AIMessage(content=f"echo: {_text(msgs[-1]) if msgs else ''}")]}


echo = StateGraph(Chat).add_node("respond", respond).add_edge(START, "respond").add_edge("respond", END).compile()


class Counter(TypedDict):
    n: int


def inc(state: Counter):
    return {"n": state.get("n", 0) + 1}


chain = (
    StateGraph(Counter)
    .add_node("a", inc).add_node("b", inc).add_node("c", inc)
    .add_edge(START, "a").add_edge("a", "b").add_edge("b", "c").add_edge("c", END)
    .compile()
)


def ask(state: Chat):
    decision = interrupt({"question": "approve?"})
    return {"messages": [AIMessage(content=f"decision: {decision}")]}


approval = StateGraph(Chat).add_node("ask", ask).add_edge(START, "ask").add_edge("ask", END).compile()


def model(state: Chat):
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(content=f"The sum is {last.content}.")]}
    call = {"name": "add", "args": {"a": 2, "b": 3}, "id": "call_add_1", "type": "tool_call"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def tools(state: Chat):
    out = []
    for call in state["messages"][-1].tool_calls:
        result = call["args"]["a"] + call["args"]["b"]
        out.append(ToolMessage(content=str(result), tool_call_id=call["id"], name=call["name"]))
    return {"messages": out}


def route(state: Chat):
    return "tools" if state["messages"][-1].tool_calls else END


agent = (
    StateGraph(Chat)
    .add_node("model", model).add_node("tools", tools)
    .add_edge(START, "model").add_conditional_edges("model", route, ["tools", END])
    .add_edge("tools", "model")
    .compile()
)


class Fan(TypedDict):
    items: list
    results: Annotated[list, operator.add]


def dispatch(state: Fan):
    return [Send("work", {"item": x}) for x in state["items"]]


def work(arg: dict):
    return {"results": [arg["item"].upper()]}


fanout = (
    StateGraph(Fan)
    .add_node("work", work)
    .add_conditional_edges(START, dispatch, ["work"])
    .add_edge("work", END)
    .compile()
)


def prep(state: Chat):
    return {"messages": [AIMessage(content="prep")]}


child = (
    StateGraph(Chat)
    .add_node("c1", lambda s: {"messages": [AIMessage(content="c1")]})
    .add_node("c2", lambda s: {"messages": [AIMessage(content="c2")]})
    .add_edge(START, "c1").add_edge("c1", "c2").add_edge("c2", END)
    .compile()
)

nested = (
    StateGraph(Chat)
    .add_node("prep", prep).add_node("child", child)
    .add_edge(START, "prep").add_edge("prep", "child").add_edge("child", END)
    .compile()
)


class Slow(TypedDict):
    delay_ms: int
    ticks: int


def _ticker(name: str):
    async def tick(state: Slow):
        get_stream_writer()({"tick": name})
        await asyncio.sleep(state.get("delay_ms", 0) / 1000)
        return {"ticks": state.get("ticks", 0) + 1}

    return tick


slow = (
    StateGraph(Slow)
    .add_node("a", _ticker("a")).add_node("b", _ticker("b"))
    .add_edge(START, "a").add_edge("a", "b").add_edge("b", END)
    .compile()
)


def boom(state: Counter):
    raise ValueError("boom")


fail = StateGraph(Counter).add_node("boom", boom).add_edge(START, "boom").add_edge("boom", END).compile()
