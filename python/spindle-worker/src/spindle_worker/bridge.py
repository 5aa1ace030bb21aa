"""What a saver or store needs to call back into Spindle for one run (or for none)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .connection import Connection
from .errors import FencedError

T = TypeVar("T")


async def _nothing() -> None:
    return None


@dataclass
class Callbacks:
    """The channel a saver and store use: the connection, and the run they belong to.

    `run` is `[run_id, attempt]`, sent with every call so Spindle can fence it; None for
    reads outside a run. `before_save` brings the run's events onto the wire ahead of a
    checkpoint save (the ordering rule); `on_fenced` stops the run.
    """

    conn: Connection
    run: list[Any] | None = None
    before_save: Callable[[], Awaitable[None]] = _nothing
    on_fenced: Callable[[FencedError], None] = lambda _e: None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)

    def body(self, **fields: Any) -> dict[str, Any]:
        if self.run is not None:
            fields["run"] = self.run
        return fields

    async def call(self, op: str, body: dict[str, Any]) -> Any:
        return await self._settle(self.conn.start_request(op, body))

    async def save(self, op: str, body: dict[str, Any]) -> Any:
        """A checkpoint write: the run's pending events go first, then the request.

        Nothing awaits between the events leaving and the request being written, so
        on the wire the save follows exactly the events produced before it.
        """
        await self.before_save()
        return await self._settle(self.conn.start_request(op, body))

    async def _settle(self, fut: asyncio.Future[Any]) -> Any:
        await self.conn.drain()
        try:
            return await fut
        except FencedError as e:
            self.on_fenced(e)
            raise

    def run_sync(self, make: Callable[[], Coroutine[Any, Any, T]], what: str) -> T:
        """Run an async method from a thread that is not the worker's loop thread.

        Called on the loop thread it would wait for itself forever, so it refuses.
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError(
                f"{what} is synchronous and was called on the worker's event loop thread, "
                "where it would deadlock waiting for Spindle. Use its async variant "
                "(e.g. `await saver.aget_tuple(...)`, `await store.aget(...)`) in async "
                "code; sync nodes run on LangGraph's thread pool, where sync calls work."
            )
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result()
