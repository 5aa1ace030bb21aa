"""SpindleSaver: a LangGraph checkpointer whose storage is Spindle, reached over the socket.

Channel values and pending writes are LangGraph's own serialization (`serde.dumps_typed`
pairs), carried opaquely; Spindle never decodes them to run a graph. Versions are
integers, as Spindle's engine makes them (see `get_next_version`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .bridge import Callbacks

# A cleared channel is stored as this type with no bytes, as LangGraph's Postgres saver
# does; it is skipped when a checkpoint is loaded.
EMPTY = "empty"


def make_serde(unpack_ext_hook: Any = None) -> JsonPlusSerializer:
    """LangGraph's serializer with pickle refused (values must be readable outside Python)."""
    return JsonPlusSerializer(pickle_fallback=False, __unpack_ext_hook__=unpack_ext_hook)


def wire_config(config: RunnableConfig | None) -> dict[str, Any] | None:
    """The protocol's `config`: LangGraph's `configurable` checkpoint keys only."""
    if config is None:
        return None
    conf = config.get("configurable", {})
    out: dict[str, Any] = {"thread_id": conf.get("thread_id"), "checkpoint_ns": conf.get("checkpoint_ns", "")}
    if conf.get("checkpoint_id"):
        out["checkpoint_id"] = conf["checkpoint_id"]
    return out


def _runnable(config: dict[str, Any] | None) -> RunnableConfig | None:
    return {"configurable": dict(config)} if config else None


class SpindleSaver(BaseCheckpointSaver[int]):
    def __init__(self, callbacks: Callbacks, *, serde: JsonPlusSerializer | None = None) -> None:
        super().__init__(serde=serde or make_serde())
        self.callbacks = callbacks

    def get_next_version(self, current: int | None, channel: None = None) -> int:  # type: ignore[override]
        """`current + 1`, but at least the current time in microseconds, as Spindle's own
        engine makes versions. Spindle writes a (channel, version) blob once and keeps it, so
        a branch from an older checkpoint (an update or a run at a past `checkpoint_id`) must
        not reuse a version of the newer branch: `current + 1` alone would, and the new
        checkpoint would read back the other branch's values. Still increasing, as LangGraph
        requires."""
        now = time.time_ns() // 1000
        return max((current or 0) + 1, now)

    # -- decoding ------------------------------------------------------------------------

    def _tuple(self, wire: dict[str, Any]) -> CheckpointTuple:
        values = {
            ch: self.serde.loads_typed((typ, data))
            for ch, _version, typ, data in wire.get("channel_values") or []
            if typ != EMPTY
        }
        checkpoint: Checkpoint = {**wire["checkpoint"], "channel_values": values}  # type: ignore[typeddict-item]
        writes = [
            (task_id, ch, self.serde.loads_typed((typ, data)))
            for task_id, ch, typ, data in wire.get("pending_writes") or []
        ]
        return CheckpointTuple(
            config=_runnable(wire["config"]),  # type: ignore[arg-type]
            checkpoint=checkpoint,
            metadata=wire.get("metadata") or {},  # type: ignore[arg-type]
            parent_config=_runnable(wire.get("parent_config")),
            pending_writes=writes,
        )

    # -- async API (what LangGraph calls) --------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        cb = self.callbacks
        wire = await cb.call("cp.get", cb.body(config=wire_config(config)))
        return self._tuple(wire) if wire else None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        cb = self.callbacks
        body = cb.body(config=wire_config(config))
        if filter:
            body["filter"] = filter
        if before is not None and (before_id := before.get("configurable", {}).get("checkpoint_id")):
            body["before"] = before_id
        if limit is not None:
            body["limit"] = limit
        for wire in await cb.call("cp.list", body) or []:
            yield self._tuple(wire)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        values = checkpoint["channel_values"]
        blobs = [
            [ch, version, *(self.serde.dumps_typed(values[ch]) if ch in values else (EMPTY, b""))]
            for ch, version in new_versions.items()
        ]
        skeleton = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        cb = self.callbacks
        body = cb.body(
            config=wire_config(config),
            checkpoint=skeleton,
            metadata=get_serializable_checkpoint_metadata(config, metadata),
            blobs=blobs,
        )
        reply = await cb.save("cp.put", body)
        conf = config["configurable"]
        stored = (reply or {}).get("config") or {
            "thread_id": conf["thread_id"],
            "checkpoint_ns": conf.get("checkpoint_ns", ""),
            "checkpoint_id": checkpoint["id"],
        }
        return {"configurable": dict(stored)}

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        # Spindle gives each write the index LangGraph's savers use: WRITES_IDX_MAP for the
        # special channels (__error__, __interrupt__...: upserted), else its position.
        encoded = [[ch, *self.serde.dumps_typed(value)] for ch, value in writes]
        cb = self.callbacks
        body = cb.body(config=wire_config(config), task_id=task_id, task_path=task_path, writes=encoded)
        await cb.save("cp.writes", body)

    # -- sync API (user code on a thread; refused on the loop thread) -----------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.callbacks.run_sync(lambda: self.aget_tuple(config), "SpindleSaver.get_tuple")

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        return iter(self.callbacks.run_sync(collect, "SpindleSaver.list"))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.callbacks.run_sync(
            lambda: self.aput(config, checkpoint, metadata, new_versions), "SpindleSaver.put"
        )

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self.callbacks.run_sync(lambda: self.aput_writes(config, writes, task_id, task_path), "SpindleSaver.put_writes")
