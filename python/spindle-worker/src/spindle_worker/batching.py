"""A run's outgoing events, batched into `run.events` frames (at most 5 ms or 64 KiB)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

MAX_DELAY_S = 0.005
MAX_BYTES = 64 * 1024


class EventBatcher:
    """Collects `[name, json_bytes]` pairs; `flush` writes them as one frame, synchronously.

    `flush` is called by the timer, when the batch is full, before every checkpoint save
    of the run and before `run.done`.
    """

    def __init__(self, send: Callable[[list[list[Any]]], None]) -> None:
        self._send = send
        self._events: list[list[Any]] = []
        self._bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.sent = 0

    def add(self, name: str, payload: bytes) -> None:
        if self.closed:
            return
        self._events.append([name, payload])
        self._bytes += len(payload) + len(name)
        if self._bytes >= MAX_BYTES:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(MAX_DELAY_S, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._events or self.closed:
            return
        events, self._events, self._bytes = self._events, [], 0
        self.sent += len(events)
        self._send(events)

    def close(self) -> None:
        """Drop what is pending and send nothing more (the run was fenced)."""
        self.closed = True
        self._events = []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
