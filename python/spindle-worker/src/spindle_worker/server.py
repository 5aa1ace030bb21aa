"""The worker process: connect to Spindle, answer its requests until the socket closes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import resource
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import langgraph.version

from .connection import Connection
from .custom_auth import CustomAuth, load_auth
from .errors import RequestError
from .loader import Registry, load_all
from .reads import Reads
from .runs import RunManager

log = logging.getLogger("spindle_worker")

DEFAULT_FD = 3
DEFAULT_MAX_RUNS = 10
LAG_PROBE_S = 0.5


class StartupError(Exception):
    """The worker cannot start: the message says why, for stderr."""


class LoopLag:
    """Measures how late the loop runs a timer: a blocked loop shows here first."""

    def __init__(self) -> None:
        self.lag_ms = 0.0

    async def probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            self.lag_ms = max(0.0, (loop.time() - start - LAG_PROBE_S) * 1000)


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        # ru_maxrss is the peak, in KiB on Linux and bytes on macOS: a fallback only.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class Worker:
    def __init__(self, conn: Connection, max_runs: int) -> None:
        self.conn = conn
        self.registry = Registry()
        self.runs = RunManager(conn, self.registry, max_runs)
        self.reads = Reads(conn, self.registry)
        self.lag = LoopLag()
        self.custom_auth: CustomAuth | None = None
        for op, handler in {
            "init": self.init,
            "ping": self.ping,
            "run.start": self.runs.start,
            "run.cancel": self.runs.cancel,
            "state.get": self.reads.state_get,
            "state.history": self.reads.state_history,
            "state.update": self.reads.state_update,
            "graph.schemas": self.reads.graph_schemas,
            "graph.draw": self.reads.graph_draw,
            "graph.subgraphs": self.reads.graph_subgraphs,
            "auth.authenticate": self.authenticate,
            "auth.authorize": self.authorize,
        }.items():
            conn.on(op, handler)

    async def init(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("graphs"), dict):
            raise RequestError("bad_request", "init needs `graphs: {graph_id: spec}`")
        project_dir = Path(body.get("project_dir") or os.getcwd()).resolve()
        # Importing runs user code, which may block: keep the loop free for pings meanwhile.
        registry, report = await asyncio.to_thread(load_all, body["graphs"], project_dir)
        self.registry.graphs.update(registry.graphs)
        self.registry.failed.update(registry.failed)
        for graph_id in registry.graphs:
            self.registry.failed.pop(graph_id, None)
        answer = {"graphs": report, "python": platform.python_version(), "langgraph": langgraph.version.__version__}
        if body.get("auth"):
            answer["auth"] = await self.load_auth(str(body["auth"]), project_dir)
        return answer

    async def load_auth(self, spec: str, project_dir: Path) -> dict[str, Any]:
        """Loads `auth.path`'s Auth object; reports `{ok}` or `{ok: false, error, traceback}`."""
        try:
            auth = await asyncio.to_thread(load_auth, spec, project_dir)
            self.custom_auth = CustomAuth(auth)
            return {"ok": True}
        except Exception as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}

    def _auth(self) -> CustomAuth:
        if self.custom_auth is None:
            raise RequestError("not_found", "this worker has no custom auth loaded (auth.path)")
        return self.custom_auth

    async def authenticate(self, body: Any) -> dict[str, Any]:
        return await self._auth().authenticate(body)

    async def authorize(self, body: Any) -> dict[str, Any]:
        return await self._auth().authorize(body)

    async def ping(self, _body: Any) -> dict[str, Any]:
        return {"active_runs": self.runs.active, "loop_lag_ms": round(self.lag.lag_ms, 3), "rss_bytes": rss_bytes()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spindle_worker",
        description="Runs LangGraph Python graphs for Spindle. Spindle starts it with one end "
        "of a socketpair as fd $SPINDLE_WORKER_FD (default 3).",
    )
    parser.add_argument("--connect", metavar="PATH", help="connect to Spindle's Unix socket at PATH instead")
    return parser.parse_args(argv)


def open_socket(args: argparse.Namespace) -> socket.socket:
    if args.connect:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(args.connect)
        except OSError as e:
            sock.close()
            raise StartupError(f"cannot connect to Spindle at {args.connect!r}: {e.strerror or e}") from e
        return sock
    raw = os.environ.get("SPINDLE_WORKER_FD", str(DEFAULT_FD))
    try:
        fd = int(raw)
    except ValueError:
        raise StartupError(f"SPINDLE_WORKER_FD must be a file descriptor number, got {raw!r}") from None
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise StartupError(
            f"file descriptor {fd} is not a socket from Spindle ({e.strerror or e}); "
            "run this under Spindle, or pass --connect PATH"
        ) from e
    if sock.family != socket.AF_UNIX:
        raise StartupError(f"file descriptor {fd} is not a Unix socket")
    return sock


def max_runs_from_env() -> int:
    raw = os.environ.get("SPINDLE_WORKER_MAX_RUNS", str(DEFAULT_MAX_RUNS))
    try:
        value = int(raw)
    except ValueError:
        raise StartupError(f"SPINDLE_WORKER_MAX_RUNS must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise StartupError(f"SPINDLE_WORKER_MAX_RUNS must be a positive integer, got {value}")
    return value


async def serve(sock: socket.socket, max_runs: int) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    conn = Connection(reader, writer)
    worker = Worker(conn, max_runs)
    probe = asyncio.create_task(worker.lag.probe())
    try:
        await conn.serve()
    finally:
        probe.cancel()
        for run in list(worker.runs.runs.values()):
            if run.task is not None:
                run.task.cancel()
        conn.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("SPINDLE_WORKER_LOG", "WARNING"),
        stream=sys.stderr,
        format="spindle_worker %(levelname)s %(message)s",
    )
    args = parse_args(argv)
    try:
        max_runs = max_runs_from_env()
        sock = open_socket(args)
    except StartupError as e:
        print(f"spindle_worker: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    asyncio.run(serve(sock, max_runs))
    log.info("socket closed after %.1fs; exiting", time.monotonic() - started)
    return 0
