"""Graphs exported as factories, a StateGraph, and one using the store."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TypedDict

from helpers import SUFFIX
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_store, get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph_sdk.runtime import ServerRuntime


class S(TypedDict, total=False):
    text: str


def _graph(text: str):
    def node(state: S):
        return {"text": (state.get("text") or "") + text + SUFFIX}

    return StateGraph(S).add_node("node", node).add_edge(START, "node").add_edge("node", END)


# A StateGraph, not compiled: the worker compiles it.
uncompiled = _graph("uncompiled")


def from_config(config: RunnableConfig):
    return _graph(config["configurable"].get("greeting", "hello")).compile()


async def async_factory():
    return _graph("async").compile()


OPEN: list[str] = []


@asynccontextmanager
async def context_factory(runtime: ServerRuntime):
    """A context manager held open for the run: its node sees it open."""
    OPEN.append(runtime.access_context)

    def node(state: S):
        get_stream_writer()({"open": list(OPEN)})
        return {"text": "cm:" + ",".join(OPEN)}

    try:
        yield StateGraph(S).add_node("node", node).add_edge(START, "node").add_edge("node", END).compile()
    finally:
        OPEN.pop()


def two_params(config: RunnableConfig, runtime: ServerRuntime):
    return _graph(f"{runtime.access_context}/{config['configurable'].get('greeting')}").compile()


async def remember(state: S):
    store = get_store()
    await store.aput(("memories", "u1"), "last", {"text": state.get("text")})
    got = await store.aget(("memories", "u1"), "last")
    found = await store.asearch(("memories",))
    return {"text": f"{got.value['text']}|{len(found)}"}


def remember_sync(state: S):
    # A sync node runs on LangGraph's thread pool: the store's sync API works there.
    store = get_store()
    item = store.get(("memories", "u1"), "last")
    return {"text": state["text"] + "|sync:" + (item.value["text"] if item else "none")}


store_graph = (
    StateGraph(S)
    .add_node("remember", remember)
    .add_node("remember_sync", remember_sync)
    .add_edge(START, "remember")
    .add_edge("remember", "remember_sync")
    .add_edge("remember_sync", END)
    .compile()
)


def whoami_factory(config: RunnableConfig, runtime: ServerRuntime):
    """Reads the user both ways, from the config and from the factory's runtime."""
    user = config["configurable"]["langgraph_auth_user"]

    def node(state: S):
        return {"text": f"{user.identity}/{user['identity']}/{runtime.user.display_name}/{user.permissions}"}

    return StateGraph(S).add_node("node", node).add_edge(START, "node").add_edge("node", END).compile()
