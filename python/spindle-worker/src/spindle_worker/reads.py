"""Reads: thread state, history and updates, graph schemas, drawings and subgraphs.

Each opens the graph (factories included) with a saver that reads through Spindle
without a run, and answers in the reference server's JSON shapes. State reads decode
checkpoints to JSON-friendly values (messages as dicts), as the reference does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.runnables.utils import create_model  # knows `__root__` models, as the reference uses
from langgraph.checkpoint.serde.jsonplus import _msgpack_ext_hook_to_json
from langgraph.errors import InvalidUpdateError
from langgraph.pregel import Pregel
from langgraph.types import StateSnapshot, StateUpdate
from pydantic import TypeAdapter

from .auth import wrap_auth_user
from .bridge import Callbacks
from .connection import Connection
from .errors import RequestError
from .jsonenc import dumpb
from .loader import AccessContext, Registry, open_graph
from .runs import map_command, patch_interrupt
from .saver import SpindleSaver, make_serde
from .store import SpindleStore
from .streaming import checkpoint_ref

# Internal configurable keys the reference leaves out of a graph's config schema.
EXCLUDED_CONFIG_KEYS = ("__pregel_checkpointer", "__pregel_store", "checkpoint_id", "checkpoint_ns", "thread_id")


def runnable_config(raw: Any) -> dict[str, Any]:
    """A request's `config` as a RunnableConfig (a bare `{thread_id, ...}` is accepted too)."""
    if not raw:
        return {"configurable": {}}
    if not isinstance(raw, dict):
        raise RequestError("bad_request", "`config` must be a map")
    if "configurable" not in raw and "thread_id" in raw:
        return {"configurable": dict(raw)}
    config = dict(raw)
    config["configurable"] = dict(config.get("configurable") or {})
    wrap_auth_user(config["configurable"])
    return config


def thread_state(state: StateSnapshot) -> dict[str, Any]:
    """The API's ThreadState for a StateSnapshot."""
    return {
        "values": state.values,
        "next": state.next,
        "tasks": [
            {
                "id": t.id,
                "name": t.name,
                "path": t.path,
                "error": t.error,
                "interrupts": [patch_interrupt(i) for i in t.interrupts],
                "checkpoint": t.state["configurable"]
                if t.state is not None and not isinstance(t.state, StateSnapshot)
                else None,
                "state": thread_state(t.state) if isinstance(t.state, StateSnapshot) else None,
                "result": getattr(t, "result", None),
            }
            for t in state.tasks
        ],
        "metadata": state.metadata,
        "created_at": state.created_at,
        "checkpoint": checkpoint_ref(state.config),
        "parent_checkpoint": checkpoint_ref(state.parent_config),
        "interrupts": [patch_interrupt(i) for i in getattr(state, "interrupts", [])],
        # deprecated fields the API still sends
        "checkpoint_id": state.config["configurable"].get("checkpoint_id") if state.config else None,
        "parent_checkpoint_id": state.parent_config["configurable"]["checkpoint_id"] if state.parent_config else None,
    }


# -- schemas ------------------------------------------------------------------------------


def _state_schema(graph: Pregel) -> dict[str, Any] | None:
    fields: dict[str, Any] = {}
    for name in graph.stream_channels_list:
        update_type = graph.channels[name].UpdateType
        try:
            create_model(name, __root__=(update_type, None)).model_json_schema()
            fields[name] = (update_type, None)
        except Exception:
            fields[name] = (Any, None)
    return create_model(graph.get_name("State"), **fields).model_json_schema()


def _config_schema(graph: Pregel) -> dict[str, Any]:
    """The `configurable` part of the graph's config schema only."""
    schema = graph.config_schema()
    fields = getattr(schema, "model_fields", None) or getattr(schema, "__fields__", None)
    if fields is None or "configurable" not in fields:
        return {}
    out = TypeAdapter(fields["configurable"].annotation).json_schema()
    if out:
        for key in EXCLUDED_CONFIG_KEYS:
            out.get("properties", {}).pop(key, None)
    if getattr(graph, "config_type", None) is not None and hasattr(graph.config_type, "__name__"):
        out["title"] = graph.config_type.__name__
    return out


def _try(fn: Any) -> Any:
    # A schema that cannot be built is reported as null, as the reference does.
    try:
        return fn()
    except Exception:
        return None


def graph_schemas(graph: Pregel) -> dict[str, Any]:
    """The reference's five schemas, keyed as its `/schemas` response keys them."""
    context = _try(graph.get_context_jsonschema)
    return {
        "input_schema": _try(graph.get_input_jsonschema),
        "output_schema": _try(graph.get_output_jsonschema),
        "state_schema": _try(lambda: _state_schema(graph)),
        "config_schema": _try(lambda: _config_schema(graph)),
        "context_schema": context,
    }


# -- handlers -----------------------------------------------------------------------------


class Reads:
    def __init__(self, conn: Connection, registry: Registry) -> None:
        self.conn = conn
        self.registry = registry

    def _saver(self, json_values: bool) -> SpindleSaver:
        serde = make_serde(_msgpack_ext_hook_to_json) if json_values else None
        return SpindleSaver(Callbacks(self.conn), serde=serde)

    def _open(self, body: dict[str, Any], access: AccessContext, *, json_values: bool = True) -> Any:
        if not isinstance(body, dict) or not body.get("graph_id"):
            raise RequestError("bad_request", "the request needs `graph_id`")
        loaded = self.registry.get(body["graph_id"])
        config = runnable_config(body.get("config"))
        saver = self._saver(json_values)
        return self._opened(loaded, config, saver, access), config

    @asynccontextmanager
    async def _opened(
        self, loaded: Any, config: dict[str, Any], saver: SpindleSaver, access: AccessContext
    ) -> AsyncIterator[Pregel]:
        # The store is closed with the graph: its batching task must not outlive the request.
        store = SpindleStore(Callbacks(self.conn))
        try:
            async with open_graph(loaded, config, checkpointer=saver, store=store, access_context=access) as graph:
                yield graph
        finally:
            await store.aclose()

    async def state_get(self, body: Any) -> bytes:
        opener, config = self._open(body, "threads.read")
        async with opener as graph:
            state = await graph.aget_state(config, subgraphs=bool(body.get("subgraphs")))
        if state.metadata is not None and state.metadata.get("checkpoint_ns") == "":
            state.metadata.pop("checkpoint_ns")
        return dumpb(thread_state(state))

    async def state_history(self, body: Any) -> list[bytes]:
        opener, config = self._open(body, "threads.read")
        before = body.get("before")
        if isinstance(before, str):
            before = {"configurable": {"checkpoint_id": before}}
        elif isinstance(before, dict) and "configurable" not in before:
            before = {"configurable": before}
        limit = body.get("limit", 10)
        async with opener as graph:
            states = [
                s async for s in graph.aget_state_history(config, limit=limit, filter=body.get("filter"), before=before)
            ]
        return [dumpb(thread_state(s)) for s in states]

    async def state_update(self, body: Any) -> dict[str, Any]:
        # Updates run the graph's reducers on live values, so this saver decodes normally.
        opener, config = self._open(body, "threads.update", json_values=False)
        supersteps = body.get("updates")
        if not isinstance(supersteps, list) or not all(isinstance(s, list) for s in supersteps):
            raise RequestError("bad_request", "`updates` must be a list of supersteps, each a list of updates")
        config["configurable"].setdefault("checkpoint_ns", "")
        # The reference gives the update's config the thread's graph id, so LangGraph copies it
        # into the new checkpoint's metadata as it does for every run's checkpoints (a history
        # filtered on `graph_id` then finds updates too).
        config["configurable"].setdefault("graph_id", body["graph_id"])
        steps = [[_state_update(u) for u in step] for step in supersteps]
        async with opener as graph:
            try:
                next_config = await graph.abulk_update_state(config, steps)
            except InvalidUpdateError as e:
                # The request's fault (an unknown `as_node`, an ambiguous update): Spindle
                # answers it as a 422, as for a graph file's thread.
                raise RequestError("bad_request", f"InvalidUpdateError: {e}") from None
        return {"config": dict(next_config["configurable"])}

    async def graph_schemas(self, body: Any) -> dict[str, Any]:
        opener, _ = self._open(body, "assistants.read")
        async with opener as graph:
            schemas = graph_schemas(graph)
        # Each schema travels as its own JSON (or nil), under the protocol's short names.
        return {k.removesuffix("_schema"): (dumpb(v) if v is not None else None) for k, v in schemas.items()}

    async def graph_draw(self, body: Any) -> bytes:
        opener, _ = self._open(body, "assistants.read")
        xray = body.get("xray", False)
        async with opener as graph:
            try:
                drawing = (await graph.aget_graph(xray=xray)).to_json()
            except NotImplementedError:
                raise RequestError("bad_request", "the graph does not support visualization") from None
        for node in drawing.get("nodes", []):
            if isinstance(node.get("data"), dict):
                node["data"].pop("id", None)
        return dumpb(drawing)

    async def graph_subgraphs(self, body: Any) -> bytes:
        opener, _ = self._open(body, "assistants.read")
        async with opener as graph:
            found = {
                ns: graph_schemas(sub)
                async for ns, sub in graph.aget_subgraphs(
                    namespace=body.get("namespace"), recurse=bool(body.get("recurse"))
                )
            }
        return dumpb(found)


def _state_update(raw: Any) -> StateUpdate:
    if not isinstance(raw, dict):
        raise RequestError("bad_request", "each update must be a map `{values, as_node, task_id?}`")
    values = map_command(raw["command"]) if raw.get("command") else raw.get("values")
    return StateUpdate(values, raw.get("as_node"), raw.get("task_id"))
