"""A fake Spindle: the Rust side of the worker protocol, in Python, for tests.

It is also the executable spec for the Rust implementation, so it is written to be read:

- `FakeSpindle` holds what Spindle keeps: checkpoints, blobs, writes, the store, and what
  each run streamed (`events`) and how it ended (`done`). It outlives worker processes, so
  a test can kill a worker and resume the run on a new one.
- `WorkerProcess` is one `python -m spindle_worker` started with one end of a socketpair
  (its number in SPINDLE_WORKER_FD), speaking the framing: u32 big-endian length + msgpack map.
- Checkpoint values stay opaque: a `[type, bytes]` pair is stored as it came and given back
  as it was stored, never decoded.
- The ordering rule is asserted as Spindle relies on it: each save is stored with the count
  of the run's events received before it. LangGraph emits a checkpoint's `checkpoints` /
  `debug` event before any task runs on it, so that event arriving after a save built on
  the checkpoint (writes against it, or its child checkpoint) is a violation: the step
  after it was saved before its events.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import struct
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson
import ormsgpack

_LEN = struct.Struct(">I")
WRITES_IDX_MAP = {"__error__": -1, "__scheduled__": -2, "__interrupt__": -3, "__resume__": -4}
VALUE_TYPES = {"msgpack", "json", "null", "bytes", "bytearray", "empty"}


class WorkerError(Exception):
    """An `err` reply from the worker."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(f"{body.get('code')}: {body.get('message')}")
        self.code = body.get("code")
        self.message = body.get("message")


class Fenced(Exception):
    pass


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass
class Save:
    op: str  # cp.put or cp.writes
    run: tuple[str, int] | None
    events_before: int  # the run's events received before this save: stored with it
    body: dict[str, Any]


@dataclass
class FakeSpindle:
    project_dir: str
    # checkpoints[(thread, ns)][checkpoint_id] = {checkpoint, metadata, parent_id}
    checkpoints: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    blobs: dict[tuple[str, str, str, int], tuple[str, bytes]] = field(default_factory=dict)
    # writes[(thread, ns, checkpoint_id)][(task_id, idx)] = (task_id, channel, type, bytes, task_path)
    writes: dict[tuple[str, str, str], dict[tuple[str, int], tuple]] = field(default_factory=lambda: defaultdict(dict))
    store: dict[tuple[tuple[str, ...], str], dict[str, Any]] = field(default_factory=dict)
    events: dict[tuple[str, int], list[tuple[str, bytes]]] = field(default_factory=lambda: defaultdict(list))
    done: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    saves: list[Save] = field(default_factory=list)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    fenced: set[tuple[str, int]] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    _done_waiters: dict[tuple[str, int], asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    # per run: the checkpoints a save was built on (writes against them, or children of them)
    _built_on: dict[tuple[str, int], set[str]] = field(default_factory=lambda: defaultdict(set))

    async def spawn(self, env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(self)
        await worker.start(env or {})
        return worker

    # -- what a run produced ------------------------------------------------------------

    async def wait_done(self, run: tuple[str, int], timeout: float = 30) -> dict[str, Any]:
        await asyncio.wait_for(self._done_waiters[run].wait(), timeout)
        return self.done[run]

    def event_names(self, run: tuple[str, int]) -> list[str]:
        return [name for name, _ in self.events[run]]

    def event_payloads(self, run: tuple[str, int], name: str | None = None) -> list[Any]:
        return [orjson.loads(data) for n, data in self.events[run] if name is None or n == name]

    # -- worker -> Spindle: events ----------------------------------------------------------

    def on_event(self, op: str, body: dict[str, Any]) -> None:
        run = (body["run"][0], body["run"][1])
        if run in self.done:
            self.violations.append(f"{op} for run {run} after its run.done")
        if op == "run.events":
            for name, data in body["events"]:
                assert isinstance(data, bytes), "event payloads travel as bin"
                self._check_not_after_save(run, name, data)
                self.events[run].append((name, data))
        elif op == "run.done":
            self.done[run] = body
            self._done_waiters[run].set()
        else:
            self.violations.append(f"unknown event {op}")

    def _check_not_after_save(self, run: tuple[str, int], name: str, data: bytes) -> None:
        mode = name.split("|")[0]
        if mode not in ("checkpoints", "debug"):
            return
        payload = orjson.loads(data)
        if mode == "debug":
            if payload.get("type") != "checkpoint":
                return
            payload = payload["payload"]
        conf = (payload.get("config") or {}).get("configurable") or {}
        cid = conf.get("checkpoint_id")
        if cid and cid in self._built_on[run]:
            self.violations.append(f"{name} event for checkpoint {cid} arrived after a save built on it")

    # -- worker -> Spindle: requests --------------------------------------------------------

    def answer(self, op: str, body: Any) -> Any:
        self.calls.append((op, body))
        run = tuple(body["run"]) if isinstance(body, dict) and body.get("run") else None
        if run is not None and run in self.fenced:
            raise Fenced()
        if run is not None and run in self.done:
            self.violations.append(f"{op} for run {run} after its run.done")
        handler = {
            "cp.get": self.cp_get,
            "cp.list": self.cp_list,
            "cp.put": self.cp_put,
            "cp.writes": self.cp_writes,
            "store.batch": self.store_batch,
        }[op]
        if op in ("cp.put", "cp.writes"):
            self.saves.append(Save(op, run, len(self.events[run]) if run else 0, body))
            if run is not None and (base := body["config"].get("checkpoint_id")):
                self._built_on[run].add(base)
        return handler(body)

    def _tuple(self, thread: str, ns: str, cid: str) -> dict[str, Any]:
        saved = self.checkpoints[(thread, ns)][cid]
        versions = saved["checkpoint"]["channel_versions"]
        blobs = [
            [ch, ver, *self.blobs[(thread, ns, ch, ver)]]
            for ch, ver in versions.items()
            if (thread, ns, ch, ver) in self.blobs
        ]
        stored = self.writes.get((thread, ns, cid), {})
        ordered = sorted(stored.items(), key=lambda kv: (kv[1][4], kv[0][0], kv[0][1]))
        parent = saved["parent_id"]
        return {
            "config": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cid},
            "checkpoint": saved["checkpoint"],
            "metadata": saved["metadata"],
            "parent_config": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": parent} if parent else None,
            "channel_values": blobs,
            "pending_writes": [[t, ch, typ, data] for (t, ch, typ, data, _path) in (v for _, v in ordered)],
        }

    def cp_get(self, body: dict[str, Any]) -> Any:
        cfg = body["config"]
        thread, ns = cfg["thread_id"], cfg.get("checkpoint_ns", "")
        saved = self.checkpoints.get((thread, ns)) or {}
        cid = cfg.get("checkpoint_id") or (max(saved) if saved else None)
        return self._tuple(thread, ns, cid) if cid in saved else None

    def cp_list(self, body: dict[str, Any]) -> list[Any]:
        cfg = body.get("config") or {}
        out = []
        for (thread, ns), saved in self.checkpoints.items():
            if thread != cfg.get("thread_id") or ("checkpoint_ns" in cfg and ns != cfg["checkpoint_ns"]):
                continue
            for cid in sorted(saved, reverse=True):
                if cfg.get("checkpoint_id") and cid != cfg["checkpoint_id"]:
                    continue
                if body.get("before") and cid >= body["before"]:
                    continue
                meta = saved[cid]["metadata"]
                if any(meta.get(k) != v for k, v in (body.get("filter") or {}).items()):
                    continue
                out.append(self._tuple(thread, ns, cid))
        out.sort(key=lambda t: t["config"]["checkpoint_id"], reverse=True)
        return out[: body["limit"]] if body.get("limit") else out

    def cp_put(self, body: dict[str, Any]) -> dict[str, Any]:
        cfg, skeleton = body["config"], body["checkpoint"]
        thread, ns, cid = cfg["thread_id"], cfg.get("checkpoint_ns", ""), skeleton["id"]
        assert "channel_values" not in skeleton, "a checkpoint travels without its values"
        for ch, ver, typ, data in body["blobs"]:
            assert isinstance(ver, int), f"versions are integers, got {ver!r}"
            assert skeleton["channel_versions"][ch] == ver, "a blob is the checkpoint's version of its channel"
            assert typ in VALUE_TYPES, f"value type {typ!r} (pickle is never sent)"
            assert isinstance(data, bytes)
            # As Spindle stores them: a (channel, version) blob is written once and never
            # replaced (`ON CONFLICT DO NOTHING`), so a version reused for another value (a
            # fork from an older checkpoint) would read back the first branch's value.
            kept = self.blobs.setdefault((thread, ns, ch, ver), (typ, data))
            if kept != (typ, data):
                self.violations.append(f"cp.put reused version {ver} of channel {ch!r} for another value")
        self.checkpoints[(thread, ns)][cid] = {
            "checkpoint": skeleton,
            "metadata": body["metadata"],
            "parent_id": cfg.get("checkpoint_id"),
        }
        return {"config": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cid}}

    def cp_writes(self, body: dict[str, Any]) -> None:
        cfg = body["config"]
        key = (cfg["thread_id"], cfg.get("checkpoint_ns", ""), cfg["checkpoint_id"])
        stored = self.writes[key]
        for pos, (ch, typ, data) in enumerate(body["writes"]):
            assert typ in VALUE_TYPES and isinstance(data, bytes)
            idx = WRITES_IDX_MAP.get(ch, pos)
            inner = (body["task_id"], idx)
            if idx >= 0 and inner in stored:
                continue  # a regular write is kept as first stored; special ones are upserted
            stored[inner] = (body["task_id"], ch, typ, data, body.get("task_path", ""))
        return None

    def store_batch(self, body: dict[str, Any]) -> list[Any]:
        return [self._store_op(op) for op in body["ops"]]

    def _store_op(self, op: dict[str, Any]) -> Any:
        ((kind, args),) = op.items()
        if kind == "get":
            return self._item(tuple(args["namespace"]), args["key"])
        if kind == "put":
            ns, key = tuple(args["namespace"]), args["key"]
            if args["value"] is None:
                self.store.pop((ns, key), None)
            else:
                created = self.store.get((ns, key), {}).get("created_at", _now())
                self.store[(ns, key)] = {"value": args["value"], "created_at": created, "updated_at": _now()}
            return None
        if kind == "search":
            prefix = tuple(args["namespace_prefix"])
            hits = [
                {**self._item(ns, key), "score": None}
                for (ns, key) in sorted(self.store)
                if ns[: len(prefix)] == prefix
                and all(self.store[(ns, key)]["value"].get(k) == v for k, v in (args.get("filter") or {}).items())
            ]
            return hits[args.get("offset", 0) : args.get("offset", 0) + args.get("limit", 10)]
        if kind == "list_namespaces":
            spaces = sorted({ns for ns, _ in self.store})
            if args.get("prefix"):
                spaces = [ns for ns in spaces if list(ns[: len(args["prefix"])]) == args["prefix"]]
            if args.get("max_depth"):
                spaces = sorted({ns[: args["max_depth"]] for ns in spaces})
            return [list(ns) for ns in spaces]
        raise ValueError(f"unknown store op {kind}")

    def _item(self, ns: tuple[str, ...], key: str) -> dict[str, Any] | None:
        got = self.store.get((ns, key))
        return {"namespace": list(ns), "key": key, **got} if got else None


class WorkerProcess:
    """One worker process and the Spindle end of its socket."""

    def __init__(self, spindle: FakeSpindle) -> None:
        self.spindle = spindle
        self.proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader_task: asyncio.Task[None] | None = None

    async def start(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "spindle_worker",
            cwd=self.spindle.project_dir,
            env={**os.environ, **env, "SPINDLE_WORKER_FD": str(theirs.fileno())},
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self.reader, self.writer = await asyncio.open_unix_connection(sock=ours)
        self._reader_task = asyncio.create_task(self._read())

    def _send(self, msg: dict[str, Any]) -> None:
        data = ormsgpack.packb(msg)
        self.writer.write(_LEN.pack(len(data)) + data)

    async def request(self, op: str, body: Any = None, timeout: float = 30) -> Any:
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self._send({"k": "req", "id": rid, "op": op, "b": body})
        return await asyncio.wait_for(fut, timeout)

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(4)
                msg = ormsgpack.unpackb(await self.reader.readexactly(_LEN.unpack(head)[0]))
                self._dispatch(msg)
        except (asyncio.IncompleteReadError, ConnectionError):
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("worker closed the socket"))

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg["k"]
        if kind in ("ok", "err"):
            fut = self._pending.pop(msg["re"])
            if kind == "ok":
                fut.set_result(msg.get("b"))
            else:
                fut.set_exception(WorkerError(msg["b"]))
        elif kind == "ev":
            self.spindle.on_event(msg["op"], msg["b"])
        elif kind == "req":
            try:
                reply = {"k": "ok", "re": msg["id"], "b": self.spindle.answer(msg["op"], msg.get("b"))}
            except Fenced:
                reply = {
                    "k": "err",
                    "re": msg["id"],
                    "b": {"code": "fenced", "message": "attempt is not live", "retryable": False},
                }
            except Exception as e:  # a bug in the worker's call: tell it, and remember
                self.spindle.violations.append(f"{msg['op']} failed in the fake: {e!r}")
                reply = {
                    "k": "err",
                    "re": msg["id"],
                    "b": {"code": "bad_request", "message": repr(e), "retryable": False},
                }
            self._send(reply)

    async def init(self, graphs: dict[str, str]) -> dict[str, Any]:
        return await self.request("init", {"graphs": graphs, "project_dir": self.spindle.project_dir})

    async def start_run(self, run: tuple[str, int], graph_id: str, thread_id: str, **kw: Any) -> Any:
        config = kw.pop("config", None) or run_config(run, graph_id, thread_id)
        body = {
            "run": list(run),
            "graph_id": graph_id,
            "config": config,
            "context": kw.pop("context", None),
            "stream_mode": kw.pop("stream_mode", ["values"]),
            "subgraphs": kw.pop("subgraphs", False),
            "checkpointer": kw.pop("checkpointer", True),
            **kw,
        }
        return await self.request("run.start", body)

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        await self.proc.wait()
        self.writer.close()

    async def close(self) -> int:
        """Close Spindle's end: the worker must see EOF and exit by itself."""
        self.writer.close()
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), 15)


def run_config(run: tuple[str, int], graph_id: str, thread_id: str) -> dict[str, Any]:
    """The RunnableConfig Spindle builds for a run (`run_id` on the first attempt only)."""
    config: dict[str, Any] = {
        "configurable": {
            "thread_id": thread_id,
            "run_id": run[0],
            "graph_id": graph_id,
            "assistant_id": f"assistant-{graph_id}",
        },
        "metadata": {"graph_id": graph_id, "assistant_id": f"assistant-{graph_id}", "run_attempt": run[1]},
        "recursion_limit": 25,
    }
    if run[1] == 1:
        config["run_id"] = run[0]
    return config
