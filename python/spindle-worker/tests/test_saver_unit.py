"""In-process checks of SpindleSaver's own rules (no worker process)."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

import pytest
from conftest import run_async
from langchain_core.messages import AIMessage

from spindle_worker.bridge import Callbacks
from spindle_worker.saver import SpindleSaver


class Recorder:
    """Stands in for the connection: records requests, answers from a dict."""

    closed = False

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, Any]] = []

    def start_request(self, op: str, body: Any) -> asyncio.Future:
        self.sent.append((op, body))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(self.answers.get(op))
        return fut

    async def drain(self) -> None:
        return None


@run_async
async def test_put_sends_only_new_versions_and_round_trips_values() -> None:
    conn = Recorder({"cp.put": {"config": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}}})
    saver = SpindleSaver(Callbacks(conn, ["r", 1]))  # type: ignore[arg-type]
    msg = AIMessage(content="hi", id="m1")
    checkpoint = {"v": 4, "id": "c1", "ts": "now", "channel_values": {"messages": [msg], "n": 3},
                  "channel_versions": {"messages": 2, "n": 1, "gone": 4}, "versions_seen": {}, "updated_channels": ["messages"]}
    out = await saver.aput({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint, {"step": 1},
                           {"messages": 2, "gone": 4})
    assert out == {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    (op, body), = conn.sent
    assert op == "cp.put" and body["run"] == ["r", 1]
    assert [(b[0], b[1], b[2]) for b in body["blobs"]] == [("messages", 2, "msgpack"), ("gone", 4, "empty")]
    assert "channel_values" not in body["checkpoint"]
    # What Spindle gives back decodes to the same Python values (a message stays a message).
    wire = {"config": body["config"] | {"checkpoint_id": "c1"}, "checkpoint": body["checkpoint"], "metadata": {},
            "parent_config": None, "channel_values": body["blobs"], "pending_writes": []}
    conn.answers["cp.get"] = wire
    got = await saver.aget_tuple({"configurable": {"thread_id": "t"}})
    assert got.checkpoint["channel_values"] == {"messages": [msg]}
    assert isinstance(got.checkpoint["channel_values"]["messages"][0], AIMessage)


@run_async
async def test_versions_are_integers_and_copies_keep_the_run() -> None:
    saver = SpindleSaver(Callbacks(Recorder({}), ["r", 2]))  # type: ignore[arg-type]
    # Integers, increasing, and at least the time in microseconds (as Spindle's engine makes
    # them), so a branch from an older checkpoint never reuses a newer branch's version.
    before_us = time.time_ns() // 1000
    first = saver.get_next_version(None, None)
    assert isinstance(first, int) and first >= before_us
    assert saver.get_next_version(7, None) >= before_us
    assert saver.get_next_version(first, None) > first
    far = 2**62
    assert saver.get_next_version(far, None) == far + 1
    clone = saver.with_allowlist([("my.module", "MyType")])
    assert clone.callbacks is saver.callbacks and copy.copy(saver).callbacks.run == ["r", 2]
    with pytest.raises(NotImplementedError):  # pickle is never read
        saver.serde.loads_typed(("pickle", b"\x80\x04N."))


@run_async
async def test_sync_methods_refuse_the_loop_thread_and_work_from_others() -> None:
    conn = Recorder({"cp.get": None})
    saver = SpindleSaver(Callbacks(conn))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="event loop thread"):
        saver.get_tuple({"configurable": {"thread_id": "t"}})
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(saver.get_tuple({"configurable": {"thread_id": "t"}})))
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(0.01)
    assert result == [None] and conn.sent[-1][0] == "cp.get"
