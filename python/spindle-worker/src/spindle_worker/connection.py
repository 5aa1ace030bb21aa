"""Request/reply correlation in both directions over one framed socket.

Each side numbers its own requests; replies name the request they answer (`re`).
Frames are queued synchronously, in one list, so the order of `send_*` calls is the
order on the wire: the ordering rule (events before the save that follows them) relies
on this. The queue goes to the socket once per turn of the event loop, in one write: a
run's events, its saves and the replies of one turn cost one system call, not one each
(which was the worker's largest single cost under load).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import ConnectionClosed, RemoteError, RequestError
from .framing import encode_frame, read_frame

log = logging.getLogger("spindle_worker")

Handler = Callable[[Any], Awaitable[Any]]


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._handlers: dict[str, Handler] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._queued: list[bytes] = []
        self.closed = False

    def on(self, op: str, handler: Handler) -> None:
        self._handlers[op] = handler

    # -- sending -----------------------------------------------------------------------

    def _write(self, msg: dict[str, Any]) -> None:
        if self.closed:
            raise ConnectionClosed("the connection to Spindle is closed")
        frame = encode_frame(msg)
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._flush)
        self._queued.append(frame)

    def _flush(self) -> None:
        """Writes what this turn of the loop queued, in order, in one write."""
        queued, self._queued = self._queued, []
        if queued and not self._writer.is_closing():
            self._writer.write(b"".join(queued) if len(queued) > 1 else queued[0])

    def send_event(self, op: str, body: Any) -> None:
        """A one-way `ev` frame, queued now: on the wire in the order of the calls."""
        self._write({"k": "ev", "op": op, "b": body})

    def start_request(self, op: str, body: Any) -> asyncio.Future[Any]:
        """Queue a `req` frame now; the future resolves with the reply's body.

        Split from `request` so a caller can queue the frame synchronously right after
        its events (the same order on the wire), then await the answer.
        """
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._write({"k": "req", "id": rid, "op": op, "b": body})
        except BaseException:
            self._pending.pop(rid, None)
            raise
        return fut

    async def request(self, op: str, body: Any) -> Any:
        fut = self.start_request(op, body)
        await self.drain()
        return await fut

    async def drain(self) -> None:
        """Waits while the socket's buffer is over its high-water mark (back-pressure)."""
        if not self.closed:
            try:
                await self._writer.drain()
            except (ConnectionError, OSError):
                pass

    # -- receiving ---------------------------------------------------------------------

    async def serve(self) -> None:
        """Read frames until the socket closes; dispatch requests, resolve replies."""
        try:
            while True:
                msg = await read_frame(self._reader)
                if msg is None:
                    break
                self._dispatch(msg)
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionClosed("the connection to Spindle closed"))
            self._pending.clear()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("k")
        if kind in ("ok", "err"):
            fut = self._pending.pop(msg.get("re", -1), None)
            if fut is None or fut.done():
                log.warning("reply to unknown request %r ignored", msg.get("re"))
            elif kind == "ok":
                fut.set_result(msg.get("b"))
            else:
                fut.set_exception(RemoteError.from_body(msg.get("b")))
        elif kind == "req":
            task = asyncio.create_task(self._answer(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == "ev":
            log.warning("unexpected event %r from Spindle ignored", msg.get("op"))
        else:
            log.warning("frame of unknown kind %r ignored", kind)

    async def _answer(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        op = msg.get("op")
        handler = self._handlers.get(op)  # type: ignore[arg-type]
        try:
            if handler is None:
                raise RequestError("bad_request", f"unknown operation {op!r}")
            result = await handler(msg.get("b"))
            reply = {"k": "ok", "re": rid, "b": result}
        except RequestError as e:
            reply = {"k": "err", "re": rid, "b": _err(e.code, e.message, e.retryable)}
        except Exception as e:
            log.error("request %s failed:\n%s", op, traceback.format_exc())
            reply = {"k": "err", "re": rid, "b": _err("internal", f"{type(e).__name__}: {e}")}
        if not self.closed:
            try:
                self._write(reply)
                await self.drain()
            except ConnectionClosed:
                pass

    def close(self) -> None:
        self._flush()
        self.closed = True
        self._writer.close()


def _err(code: str, message: str, retryable: bool = False) -> dict[str, Any]:
    return {"code": code, "message": message, "retryable": retryable}
