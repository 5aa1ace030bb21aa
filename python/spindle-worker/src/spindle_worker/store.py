"""SpindleStore: LangGraph's BaseStore backed by Spindle's store, one `store.batch` per batch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from langgraph.store.base import GetOp, Item, ListNamespacesOp, Op, PutOp, Result, SearchItem, SearchOp
from langgraph.store.base.batch import AsyncBatchedBaseStore

from .bridge import Callbacks


def encode_op(op: Op) -> dict[str, Any]:
    if isinstance(op, GetOp):
        return {"get": {"namespace": list(op.namespace), "key": op.key, "refresh_ttl": op.refresh_ttl}}
    if isinstance(op, SearchOp):
        return {
            "search": {
                "namespace_prefix": list(op.namespace_prefix),
                "filter": op.filter,
                "limit": op.limit,
                "offset": op.offset,
                "query": op.query,
                "refresh_ttl": op.refresh_ttl,
            }
        }
    if isinstance(op, PutOp):
        index = list(op.index) if isinstance(op.index, (list, tuple)) else op.index
        return {
            "put": {"namespace": list(op.namespace), "key": op.key, "value": op.value, "index": index, "ttl": op.ttl}
        }
    if isinstance(op, ListNamespacesOp):
        prefix = suffix = None
        for cond in op.match_conditions or ():
            if cond.match_type == "prefix":
                prefix = list(cond.path)
            elif cond.match_type == "suffix":
                suffix = list(cond.path)
        return {
            "list_namespaces": {
                "prefix": prefix,
                "suffix": suffix,
                "max_depth": op.max_depth,
                "limit": op.limit,
                "offset": op.offset,
            }
        }
    raise TypeError(f"unknown store operation {type(op).__name__}")


def _item(raw: dict[str, Any], cls: type[Item] = Item) -> Item:
    fields = dict(
        namespace=tuple(raw["namespace"]),
        key=raw["key"],
        value=raw["value"],
        created_at=raw["created_at"],
        updated_at=raw["updated_at"],
    )
    if cls is SearchItem:
        return SearchItem(**fields, score=raw.get("score"))
    return Item(**fields)


def decode_result(op: Op, raw: Any) -> Result:
    if isinstance(op, GetOp):
        return _item(raw) if raw else None
    if isinstance(op, SearchOp):
        return [_item(r, SearchItem) for r in raw or []]
    if isinstance(op, ListNamespacesOp):
        return [tuple(ns) for ns in raw or []]
    return None


class SpindleStore(AsyncBatchedBaseStore):
    def __init__(self, callbacks: Callbacks) -> None:
        super().__init__()
        self.callbacks = callbacks

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        cb = self.callbacks
        results = await cb.call("store.batch", cb.body(ops=[encode_op(op) for op in ops]))
        results = list(results or [])
        if len(results) != len(ops):
            raise RuntimeError(f"store.batch answered {len(results)} results for {len(ops)} operations")
        return [decode_result(op, r) for op, r in zip(ops, results)]

    async def aclose(self) -> None:
        """Stops the batching task LangGraph's base class starts for each store. Left to the
        garbage collector, it is destroyed still pending (asyncio logs `Task was destroyed
        but it is pending`): the store's `__del__` only asks it to cancel."""
        task, self._task = self._task, None
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        return self.callbacks.run_sync(lambda: self.abatch(ops), "SpindleStore.batch")
