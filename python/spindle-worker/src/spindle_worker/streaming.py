"""Turning LangGraph stream chunks into the API's named events, as the reference does.

A chunk `(ns, mode, payload)` becomes the event `mode`, or `mode|ns1|ns2` for a
subgraph's when subgraphs were asked for. `messages-tuple` streams LangGraph's
`(message, metadata)` pairs as `messages`; plain `messages` accumulates chunks by
message id into `messages/metadata` (once per message), then `messages/partial` or
`messages/complete`. `debug` checkpoints are reshaped (checkpoint / parent_checkpoint
fields). LangGraph's `checkpoints` mode is always asked for: its last root checkpoint gives
the run's final state (cheaper than `debug`, which adds every task's start and result).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import (
    AIMessageChunk,
    BaseMessage,
    BaseMessageChunk,
    ToolMessageChunk,
    convert_to_messages,
    message_chunk_to_message,
)
from langgraph.version import __version__ as LANGGRAPH_VERSION

Event = tuple[str, Any]


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".")[:3] if p.isdigit())


# Up to langgraph 1.0.3 an interrupt only surfaced in `updates`; the reference then
# streams `updates` too and forwards its interrupts as `values` events.
UPDATES_NEEDED_FOR_INTERRUPTS = _version_tuple(LANGGRAPH_VERSION) <= (1, 0, 3)


def graph_stream_modes(requested: Iterable[str]) -> tuple[list[str], bool]:
    """The modes to ask LangGraph for, and whether `updates` is there only for interrupts."""
    modes = set(requested) - {"events"}
    modes.add("checkpoints")  # the last root one gives the run's final state
    if "messages-tuple" in modes:
        modes.remove("messages-tuple")
        modes.add("messages")
    only_interrupts = False
    if "updates" not in modes and UPDATES_NEEDED_FOR_INTERRUPTS:
        modes.add("updates")
        only_interrupts = True
    return sorted(modes), only_interrupts


def checkpoint_ref(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """The API's `checkpoint` object for a RunnableConfig (None without an id)."""
    conf = (config or {}).get("configurable") or {}
    if not conf.get("thread_id") or not conf.get("checkpoint_id"):
        return None
    ref: dict[str, Any] = {"checkpoint_id": conf["checkpoint_id"], "thread_id": conf["thread_id"]}
    if "checkpoint_ns" in conf:
        ref["checkpoint_ns"] = conf["checkpoint_ns"] or ""
    if "checkpoint_map" in conf:
        ref["checkpoint_map"] = conf["checkpoint_map"]
    return ref


def _debug_checkpoint(payload: dict[str, Any] | None) -> dict[str, Any] | None:
    if not payload:
        return None
    tasks = []
    for task in payload.get("tasks", []):
        state = task.get("state")
        if state and isinstance(state, dict) and state.get("configurable"):
            task = {k: v for k, v in task.items() if k != "state"}
            task["checkpoint"] = state["configurable"]
        tasks.append(task)
    return {
        **payload,
        "checkpoint": checkpoint_ref(payload.get("config")),
        "parent_checkpoint": checkpoint_ref(payload.get("parent_config")),
        "tasks": tasks,
    }


def _as_message(raw: Any) -> tuple[BaseMessage, bool]:
    """A message from a `messages` chunk, and whether it is a chunk given as a dict."""
    if not isinstance(raw, dict):
        return raw, False
    kind = str(raw.get("type", "")).lower()
    role = str(raw.get("role", "")).lower()
    if "chunk" in kind or "chunk" in role:
        if "ai" in role:
            return AIMessageChunk(**raw), True
        if "tool" in role:
            return ToolMessageChunk(**raw), True
        return BaseMessageChunk(**raw), True
    return convert_to_messages([raw])[0], False


@dataclass
class StreamTranslator:
    stream_mode: list[str]
    subgraphs: bool
    only_interrupt_updates: bool = False
    final_checkpoint: dict[str, Any] | None = None
    _messages: dict[Any, BaseMessage] = field(default_factory=dict)

    def _name(self, mode: str, ns: tuple[str, ...] | None) -> str:
        return f"{mode}|{'|'.join(ns)}" if self.subgraphs and ns else mode

    def handle(self, ns: tuple[str, ...] | None, mode: str, chunk: Any) -> list[Event]:
        if mode == "checkpoints" and not ns:
            self.final_checkpoint = chunk
        elif mode == "debug" and chunk.get("type") == "checkpoint":
            chunk["payload"] = _debug_checkpoint(chunk.get("payload"))
        if mode == "messages":
            if "messages-tuple" in self.stream_mode:
                return [(self._name("messages", ns), chunk)]
            return self._accumulate(chunk)
        if mode in self.stream_mode:
            return [(self._name(mode, ns), chunk)]
        if mode == "updates" and self.only_interrupt_updates and isinstance(chunk, dict) and chunk.get("__interrupt__"):
            return [(self._name("values", ns), chunk)]
        return []

    def _accumulate(self, chunk: Any) -> list[Event]:
        raw, meta = chunk
        msg, is_chunk = _as_message(raw)
        events: list[Event] = []
        if msg.id in self._messages:
            self._messages[msg.id] = self._messages[msg.id] + msg  # type: ignore[assignment,operator]
        else:
            self._messages[msg.id] = msg
            events.append(("messages/metadata", {msg.id: {"metadata": meta}}))
        acc = self._messages[msg.id]
        name = "messages/partial" if isinstance(msg, BaseMessageChunk) else "messages/complete"
        events.append((name, [acc if is_chunk else message_chunk_to_message(acc)]))  # type: ignore[arg-type]
        return events
