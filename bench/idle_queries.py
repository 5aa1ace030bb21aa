#!/usr/bin/env python3
"""What an idle server and its idle streams ask of the database (issue 54, item 3): nothing.

    .venv/bin/python bench/idle_queries.py --spindle-bin target/release/spindle \\
        --postgres-url postgres://postgres@127.0.0.1:5432/postgres --streams 1000

For each backend (`--backend postgres`, `sqlite` or `both`), starts a fresh server (`spindle
serve --examples` on a new PostgreSQL database, dropped afterwards; `spindle dev` on a new data
dir) and measures, over an idle window each (`--window`, 20 s, after `--settle`, 12 s):

- the server with nothing open;
- then, one kind at a time, `--streams` open streams of that kind, each on a thread of its own
  where nothing runs: thread streams (`GET /threads/{id}/stream`), run join streams (`GET
  /threads/{id}/runs/{run}/stream` of a run created far in the future, pending throughout),
  the agent protocol's thread event streams (`POST /threads/{id}/stream/events`, SSE) and its
  WebSocket (`GET /threads/{id}/stream/events`, subscribed to every channel).

Counted: the database's transactions (PostgreSQL: `pg_stat_database` of the server's database,
read from a session on the admin database), the server's calls to its storage (`/metrics`:
`spindle_storage_call_duration_seconds_count`, every method of the storage traits, both
backends), and the server's CPU. Prints a markdown table; `--output` writes it to a file.
The goal is 0 transactions and 0 storage calls in every row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import httpx
import psycopg
import websockets

HERE = Path(__file__).resolve().parent
KINDS = ["thread", "run_join", "protocol_sse", "websocket"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spindle-bin", default=str(HERE.parent / "target" / "release" / "spindle"))
    p.add_argument("--postgres-url", default=os.environ.get("SPINDLE_TEST_POSTGRES_URL", ""),
                   help="an admin URL; a fresh database is made beside it")
    p.add_argument("--backend", choices=["postgres", "sqlite", "both"], default="both")
    p.add_argument("--streams", type=int, default=1000, help="streams of each kind")
    p.add_argument("--window", type=float, default=20.0, help="seconds of each idle window")
    p.add_argument("--settle", type=float, default=12.0,
                   help="seconds before each window: PostgreSQL's sessions report their "
                        "transactions up to 10 s late when they go idle, so the streams' openings "
                        "would count in the window otherwise")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--output", help="write the table here too")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A spindle process on a fresh database."""

    def __init__(self, args, backend: str):
        self.backend, self.port = backend, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"idle-queries-{backend}-"))
        self.dbname = None
        common = ["--host", "127.0.0.1", "--port", str(self.port)]
        if backend == "postgres":
            self.dbname = f"spindle_idle_{secrets.token_hex(4)}"
            admin(args.postgres_url, f'CREATE DATABASE "{self.dbname}"')
            db_url = with_db(args.postgres_url, self.dbname)
            argv = ["serve", "--examples", "--database-url", db_url, *common]
        else:
            argv = ["dev", "--data-dir", str(self.workdir / "data"), *common]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPINDLE_")}
        self.log = open(self.workdir / "server.log", "wb")
        self.proc = subprocess.Popen([str(Path(args.spindle_bin).resolve()), *argv], cwd=self.workdir, env=env,
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/ok", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"spindle did not start: {(self.workdir / 'server.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def storage_calls(self) -> int:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("spindle_storage_call_duration_seconds_count")))

    def stop(self, args) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        if self.dbname:
            admin(args.postgres_url, f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')
        shutil.rmtree(self.workdir, ignore_errors=True)


def with_db(url: str, db: str) -> str:
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path="/" + db))


def admin(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def transactions(args, server: Server) -> int | None:
    if not server.dbname:
        return None
    with psycopg.connect(args.postgres_url, autocommit=True) as conn:
        # Counters reach the shared statistics within a second of a transaction's end.
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = %s", (server.dbname,)).fetchone()
        return int(row[0])


class SseStream:
    """One SSE stream on a raw connection, its bytes read and dropped."""

    def __init__(self, method: str, path: str, body: dict | None = None):
        self.method, self.path, self.body = method, path, body
        self.task = None

    async def open(self, port: int) -> None:
        reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps(self.body).encode() if self.body is not None else b""
        head = (f"{self.method} {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Accept: text/event-stream\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"{self.method} {self.path}: {status!r}")
        self.task = asyncio.create_task(self._drain(reader))

    @staticmethod
    async def _drain(reader) -> None:
        while await reader.read(65536):
            pass

    async def close(self) -> None:
        self.task.cancel()
        self.writer.close()


class Socket:
    """One agent protocol WebSocket, subscribed to every channel."""

    def __init__(self, path: str):
        self.path = path

    async def open(self, port: int) -> None:
        self.ws = await websockets.connect(f"ws://127.0.0.1:{port}{self.path}", max_queue=None)
        await self.ws.send(json.dumps({"id": 1, "method": "subscription.subscribe",
                                       "params": {"channels": ["values", "updates", "messages",
                                                               "lifecycle", "tools", "custom"]}}))
        answer = json.loads(await self.ws.recv())
        if "error" in answer:
            raise RuntimeError(f"subscribe: {answer}")
        self.task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        async for _ in self.ws:
            pass

    async def close(self) -> None:
        self.task.cancel()
        await self.ws.close()


async def streams_of(kind: str, server: Server, count: int) -> list:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        async def one(_):
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            if kind == "thread":
                return SseStream("GET", f"/threads/{tid}/stream")
            if kind == "run_join":
                run = (await http.post(f"/threads/{tid}/runs", json={
                    "assistant_id": "chain", "input": {"n": 0}, "after_seconds": 86400})).json()
                return SseStream("GET", f"/threads/{tid}/runs/{run['run_id']}/stream")
            if kind == "protocol_sse":
                return SseStream("POST", f"/threads/{tid}/stream/events", {"channels": ["values"]})
            return Socket(f"/threads/{tid}/stream/events")
        return await gather_bounded([one(i) for i in range(count)])


async def gather_bounded(coros, limit: int = 32) -> list:
    gate = asyncio.Semaphore(limit)

    async def bounded(c):
        async with gate:
            return await c

    return await asyncio.gather(*(bounded(c) for c in coros))


async def window(args, server: Server) -> dict:
    """What the idle server did over one window: per second. A scrape of /metrics reads the
    queue (one storage call, one transaction): the first is made before the settling time,
    so that its transaction is reported before the window; the last one's own call is not
    counted."""
    c0 = server.storage_calls()
    await asyncio.sleep(args.settle)
    x0, cpu0 = transactions(args, server), server.cpu_seconds()
    started = time.monotonic()
    await asyncio.sleep(args.window)
    elapsed = time.monotonic() - started
    x1, cpu1 = transactions(args, server), server.cpu_seconds()
    c1 = server.storage_calls() - 1
    return {
        "transactions_per_s": None if x0 is None else round((x1 - x0) / elapsed, 2),
        "storage_calls_per_s": round((c1 - c0) / (elapsed + args.settle), 2),
        "cpu_percent": round(100 * (cpu1 - cpu0) / elapsed, 2),
    }


async def measure(args, backend: str) -> list[dict]:
    server = Server(args, backend)
    rows = []
    try:
        rows.append({"backend": backend, "kind": "nothing open", "streams": 0, **await window(args, server)})
        for kind in args.kinds.split(","):
            streams = await streams_of(kind, server, args.streams)
            await gather_bounded([s.open(server.port) for s in streams])
            rows.append({"backend": backend, "kind": kind, "streams": len(streams), **await window(args, server)})
            await asyncio.gather(*(s.close() for s in streams))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop(args)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| backend | open | streams | transactions/s | storage calls/s | server CPU % |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        tx = "-" if r["transactions_per_s"] is None else r["transactions_per_s"]
        lines.append(f"| {r['backend']} | {r['kind']} | {r['streams']} | {tx} | "
                     f"{r['storage_calls_per_s']} | {r['cpu_percent']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    backends = ["postgres", "sqlite"] if args.backend == "both" else [args.backend]
    if "postgres" in backends and not args.postgres_url:
        sys.exit("--postgres-url (or SPINDLE_TEST_POSTGRES_URL) is needed for PostgreSQL")
    rows = []
    for backend in backends:
        rows += asyncio.run(measure(args, backend))
    out = table(rows)
    print(out)
    if args.output:
        Path(args.output).write_text(out + "\n")


if __name__ == "__main__":
    main()
