"""Graphs exported the other ways LangGraph Platform accepts, and a node searching the store
by meaning. Spindle-only: the store's index uses Spindle's deterministic `spindle:hash`
embedder, which needs no model or network."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_store, get_stream_writer
from langgraph.graph import END, START, StateGraph, add_messages
from langgraph.types import interrupt
from langgraph_sdk.runtime import ServerRuntime


class S(TypedDict, total=False):
    text: str
    found: list


def _one_node(node) -> StateGraph:
    return StateGraph(S).add_node("node", node).add_edge(START, "node").add_edge("node", END)


def from_config(config: RunnableConfig):
    """A factory given the run's config: the graph it builds depends on the assistant's."""
    greeting = config["configurable"].get("greeting", "hello")

    def node(state: S):
        return {"text": f"{greeting}, {state.get('text', '')}"}

    return _one_node(node).compile()


OPEN: list[str] = []


@asynccontextmanager
async def held_open(runtime: ServerRuntime):
    """A context manager factory: held open while the run executes, closed after."""
    OPEN.append(runtime.access_context)

    def node(state: S):
        get_stream_writer()({"open": list(OPEN)})
        return {"text": "opened for " + ",".join(OPEN)}

    try:
        yield _one_node(node).compile()
    finally:
        OPEN.pop()


async def search(state: S):
    """Searches the store by meaning from inside a node (`get_store()`)."""
    items = await get_store().asearch(("docs",), query=state["text"], limit=3)
    return {"found": [{"key": i.key, "score": i.score} for i in items]}


recall = _one_node(search).compile()


class Blocking(TypedDict, total=False):
    text: str
    seconds: float


async def block(state: Blocking):
    """What a careless synchronous call in an async node does: blocks the worker's loop. (It
    yields once first, so the checkpoint of the run's input reaches Spindle before.)"""
    await asyncio.sleep(0.2)
    time.sleep(state["seconds"])
    return {"text": "unblocked"}


blocker = StateGraph(Blocking).add_node("block", block).add_edge(START, "block").add_edge("block", END).compile()


def ask(state: S):
    return {"text": f"{state.get('text', '')}|{interrupt('value?')}"}


def after(state: S):
    return {"text": state.get("text", "") + "|after"}


_child = (
    StateGraph(S).add_node("ask", ask).add_node("after", after)
    .add_edge(START, "ask").add_edge("ask", "after").add_edge("after", END).compile()
)
# A subgraph stopped at an interrupt: its own state can be updated (namespace `child:<task>`).
nest = StateGraph(S).add_node("child", _child).add_edge(START, "child").add_edge("child", END).compile()


class QuietChatModel(BaseChatModel):
    """A chat model that cannot stream (no `_stream`): its reply arrives whole."""

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=f"quietly: {messages[-1].content}"))])

    @property
    def _llm_type(self) -> str:
        return "quiet"


class Chat(TypedDict):
    messages: Annotated[list, add_messages]


async def reply(state: Chat):
    return {"messages": [await QuietChatModel().ainvoke(state["messages"])]}


def note(state: Chat):
    """A message the node writes itself, not a model's reply."""
    return {"messages": [AIMessage(content="noted")]}


# A model's reply that is not streamed, then a node's own message (protocol v2's `messages`).
quiet_model = (
    StateGraph(Chat).add_node("reply", reply).add_node("note", note)
    .add_edge(START, "reply").add_edge("reply", "note").add_edge("note", END).compile()
)


class APIConnectionError(Exception):
    """What a model's client raises when it cannot reach its host."""


def call_api(state: S):
    try:
        raise OSError(-2, "Name or service not known")
    except OSError as e:
        raise APIConnectionError("Connection error.") from e


# A run failing as one whose model's host cannot be reached does (the `run failed` log line).
unreachable = _one_node(call_api).compile()
