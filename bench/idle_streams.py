#!/usr/bin/env python3
"""Idle streams (issue 29, item 3): what N open event streams cost Spindle while no run executes.

    bench/.venv/bin/python bench/idle_streams.py --spindle-bin target/release/spindle \\
        --postgres-url postgres://postgres@127.0.0.1:5432/postgres --streams 10000

Starts `spindle serve` on a fresh PostgreSQL database (created and dropped here; or, with
`--backend sqlite`, `spindle dev` on a fresh data dir) and:

1. measures the native load generator (scenario wait) on the fresh server (for reference only,
   not vacuumed: see below);
2. creates the threads, and a run far in the future (`after_seconds`, pending throughout) on
   each thread of the run join streams; measures the load generator with no stream open (the
   first load point, streams closed);
3. opens N streams: a third each of thread streams (`GET /threads/{id}/stream`), run join
   streams (`GET /threads/{id}/runs/{run}/stream` of the pending runs) and protocol v2 thread
   event streams (`POST /threads/{id}/stream/events`, the SSE transport; its GET is the
   WebSocket one); every one must answer 200, SSE. All but the wake-up thread's are held by
   `spindle-loadgen hold` (the `--loadgen-bin` binary; a process of its own on one runtime
   thread, reading and dropping the bodies, their frames counted), the wake-up thread's (step 5)
   here with raw asyncio (a hand-written HTTP/1.1 request per connection, chunked), since their
   first event is what the wake-up times;
4. lets them settle, then over an idle window counts the transactions the server's database
   had (pg_stat_database, read from an admin session on the `--postgres-url` database, never
   the measured one), samples pg_stat_activity to see which queries the server sent, and reads
   the server's CPU, its memory (VmRSS, VmHWM), PostgreSQL's CPU and the holder's from /proc;
5. starts runs on the thread that some thread and protocol streams follow and times how long
   until each of those streams has the run's first event; on PostgreSQL also with the runs
   created on a second `spindle serve` process, so that the streams can only learn of them
   through the database's notifications;
6. measures the other clients' latency with the streams open and closed, `--pairs` times
   (default 3), in mirrored pairs: closed, open | open, closed | closed, open ... (the first
   pair's closed point is the one of step 2), closing the streams and reopening the same ones
   (same threads, same pending runs; the holder stopped, then started again) when the condition
   changes; compares the median p99 with the streams open against the median with them closed:
   within 10 % or not;
7. prints a markdown table and writes it to `--output`.

Why the pairs, the VACUUM and the order: every load point adds runs, threads and checkpoints to
the database, and the runs' updates leave dead rows that nothing removes while autovacuum is off
(as on this machine), so the p99 climbs from point to point whatever else happens. A single
"before the streams" point against a later "with the streams" one mixed the streams' cost with
that growth (in bench/RESULTS.md the p99 after the streams were closed again was ×1.18 and
×1.35 the one before they opened). So, on PostgreSQL, before each load run the server's database gets a plain
`VACUUM` and a `CHECKPOINT` (`--no-vacuum`: not), from a `psql` connected to it for that
alone and gone before the load starts: every point starts with no dead rows and no dirty pages.
What VACUUM leaves is the growth of the live rows, slow and steady: the mirrored order weighs it
on both conditions alike (over two pairs, the closed points' mean position equals the open
ones'), and the medians over the pairs keep one noisy point from deciding. The fresh server's
point gets no VACUUM: there is nothing to clean, and VACUUM of the empty tables records them as
empty (reltuples 0), which the planner then believes while the point fills them (smoke runs:
p99 ~350 ms and ~130 runs/s with it, 63 ms and 451 runs/s without). Reopening the streams costs
what opening them did (600 in 0.2 s here; the table lists each reopening), and the mirrored
order needs it only every other pair, so the streams are really closed and reopened rather than
compared against one closed point.

Why the holder: 10,000 streams get a keepalive comment every 5 s each, 2,000 frames a second.
Read by this process's Python they took about 10 % of a core, on the same 2 cores the load and
the server share, so the open points' p99 carried the harness's cost as well as the server's
(the ×1.14 measured that way mixed the two). The native holder reads them for a fraction of it;
its CPU (while idle, during each open load point, in all) is reported as its own figure, so
that what holding cost can be read against the difference.

Everything it starts (servers, the holder, the database, the admin psql session) is stopped
and dropped at the end, also on failure or Ctrl-C. Only the standard library, httpx (in
bench/.venv) for the set-up requests, `psql`, `spindle-loadgen` and bench/servers.py.
"""
import argparse
import asyncio
import json
import math
import os
import resource
import shlex
import shutil
import signal
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import httpx

import servers
from harness import base_facts, compiling_now

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
KINDS = ("thread", "run_join", "protocol")
# pg_stat_database is fed by each backend when it goes idle, at most once a second and at the
# latest 10 s after its last transaction (PostgreSQL 15's cumulative statistics): a quiet
# spell longer than that before the window makes the counter hold everything done before.
STATS_FLUSH = 10.0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/idle_streams.py", description=__doc__.splitlines()[0])
    p.add_argument("--spindle-bin", type=Path, default=ROOT / "target/release/spindle")
    p.add_argument("--loadgen-bin", type=Path, default=ROOT / "target/release/spindle-loadgen",
                   help="the load generator, also the streams' holder (`spindle-loadgen hold`) "
                        "[target/release/spindle-loadgen]")
    p.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--postgres-url", default="postgres://postgres@127.0.0.1:5432/postgres",
                   help="an existing database: the fresh one is created from it, and the idle "
                        "window's statistics are read through it")
    p.add_argument("--streams", type=int, default=10_000, help="streams held open, a third of each kind [10000]")
    p.add_argument("--streams-per-thread", type=int, default=1,
                   help="streams of one kind on each thread (run join streams: on each pending run) [1]")
    p.add_argument("--wake-streams", type=int, default=10,
                   help="thread streams and as many protocol streams that follow the thread the "
                        "wake-up runs start on (part of --streams) [10]")
    p.add_argument("--wake-runs", type=int, default=5, help="wake-up runs, one after the other, per process [5]")
    p.add_argument("--channels", default="lifecycle,values,updates",
                   help="channels of the protocol streams, comma-separated [lifecycle,values,updates]")
    p.add_argument("--idle", type=float, default=20.0, help="seconds of the idle window [20]")
    p.add_argument("--settle", type=float, default=STATS_FLUSH + 2,
                   help=f"seconds of quiet between the last stream opened and the window [{STATS_FLUSH + 2:g}]")
    p.add_argument("--load-clients", type=int, default=16, help="clients of the load generator [16]")
    p.add_argument("--load-duration", type=float, default=5.0, help="seconds measured per load run [5]")
    p.add_argument("--load-warmup", type=float, default=1.0, help="warm-up of each load run [1]")
    p.add_argument("--load-repeat", type=int, default=1,
                   help="load runs at each point; their medians are reported [1]")
    p.add_argument("--pairs", type=int, default=3,
                   help="load points with the streams closed and with them open, alternated "
                        "(closed, open | open, closed | closed, open ...); the medians are compared [3]")
    p.add_argument("--reopen-settle", type=float, default=2.0,
                   help="seconds between reopening (or closing) the streams and a load point [2]")
    p.add_argument("--no-vacuum", dest="vacuum", action="store_false",
                   help="PostgreSQL: no VACUUM and CHECKPOINT of the server's database before "
                        "each load run (the database's dead rows then grow from point to point)")
    # Below the server's listen backlog (128 here): a native holder connects faster than the
    # server accepts when both share 2 busy cores, and every connection the full accept queue
    # drops waits 1 s for its SYN to be sent again (200 at once: 1 s instead of 0.1 s, often).
    p.add_argument("--open-concurrency", type=int, default=64,
                   help="streams being opened at once, by the holder and by the harness each [64]")
    p.add_argument("--keepalive-interval-secs", type=int,
                   help="passed to the server [the server's default, 5 s]")
    p.add_argument("--no-second-process", dest="second_process", action="store_false",
                   help="PostgreSQL: skip the wake-up by runs created on a second process")
    p.add_argument("--output", type=Path, default=BENCH / "IDLE-STREAMS.md", help="[bench/IDLE-STREAMS.md]")
    args = p.parse_args(argv)
    if args.streams < 3:
        p.error("--streams must be at least 3 (one of each kind)")
    if args.streams_per_thread < 1:
        p.error("--streams-per-thread must be at least 1")
    if args.pairs < 1 or args.load_repeat < 1:
        p.error("--pairs and --load-repeat must be at least 1")
    args.wake_streams = max(0, min(args.wake_streams, args.streams // 3))
    args.channels = [c for c in args.channels.split(",") if c]
    if args.backend == "sqlite":
        args.second_process = False
        args.vacuum = False
    return args


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Streams: one connection each, a hand-written request, the chunked SSE body read and dropped.
# Here only the wake-up thread's (the harness times their first event); the holder below holds
# the rest.


class Refused(Exception):
    pass


class Stream:
    """One open SSE stream. Counts heartbeats and events; `waiter`, when set, gets the first
    event (not a heartbeat) that arrives after it was set."""

    __slots__ = ("kind", "thread_id", "run_id", "method", "path", "body", "reader", "writer",
                 "task", "buf", "heartbeats", "events", "first_events", "waiter", "error",
                 "closed_by_server", "closing")

    def __init__(self, kind: str, thread_id: str, path: str, method: str = "GET",
                 body: bytes = b"", run_id: str | None = None):
        self.kind, self.thread_id, self.run_id = kind, thread_id, run_id
        self.method, self.path, self.body = method, path, body
        self.reader = self.writer = self.task = None
        self.buf = b""
        self.heartbeats = self.events = 0
        self.first_events = []
        self.waiter = None
        self.error = None
        self.closed_by_server = False
        self.closing = False

    async def open(self, host: str, port: int, timeout: float = 60.0) -> None:
        # Also a reopening after close(): a new connection; the counts and closed_by_server
        # (once the server closed it, the stream counts as closed by it) carry on.
        self.closing = False
        self.buf = b""
        self.task = None
        self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        head = (f"{self.method} {self.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Accept: text/event-stream\r\nUser-Agent: idle-streams\r\n")
        if self.method != "GET":
            head += f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + self.body)
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if status != 200:
            try:
                body = await asyncio.wait_for(self.reader.read(500), 2)
            except (asyncio.TimeoutError, ConnectionError):
                body = b""
            raise Refused(f"{self.method} {self.path}: {lines[0]} {body[:300]!r}")
        if not headers.get("content-type", "").startswith("text/event-stream"):
            raise Refused(f"{self.method} {self.path}: content-type {headers.get('content-type')!r}")
        if headers.get("transfer-encoding", "").lower() != "chunked":
            raise Refused(f"{self.method} {self.path}: transfer-encoding {headers.get('transfer-encoding')!r}")
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        reader = self.reader
        try:
            while True:
                size_line = await reader.readline()
                if not size_line:
                    break
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    break
                chunk = await reader.readexactly(size + 2)
                self._feed(chunk[:-2])
        except asyncio.CancelledError:
            raise
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, OSError) as err:
            self.error = f"{type(err).__name__}: {err}"
        if not self.closing:
            self.closed_by_server = True

    def _feed(self, data: bytes) -> None:
        self.buf = (self.buf + data).replace(b"\r\n", b"\n")
        while (end := self.buf.find(b"\n\n")) >= 0:
            frame, self.buf = self.buf[:end], self.buf[end + 2:]
            self._frame(frame)

    def _frame(self, frame: bytes) -> None:
        lines = [line for line in frame.split(b"\n") if line]
        if not lines:
            return
        if all(line.startswith(b":") for line in lines):
            self.heartbeats += 1
            return
        at = time.perf_counter()
        event = next((line[6:].strip().decode() for line in lines if line.startswith(b"event:")), "")
        data = b"\n".join(line[5:].strip() for line in lines if line.startswith(b"data:")).decode(errors="replace")
        self.events += 1
        if len(self.first_events) < 3:
            self.first_events.append((event, data[:300]))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((at, event, data))

    def close(self) -> None:
        self.closing = True
        if self.task is not None:
            self.task.cancel()
        if self.writer is not None:
            self.writer.transport.abort()


async def open_all(streams: list, host: str, port: int, concurrency: int) -> list:
    """Opens every stream, `concurrency` at a time; answers the failures (stream, error)."""
    pending = iter(streams)
    failures = []

    async def opener():
        for stream in pending:
            try:
                await stream.open(host, port)
            except (Refused, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as err:
                failures.append((stream, f"{type(err).__name__}: {err}"))
                stream.close()

    await asyncio.gather(*(opener() for _ in range(concurrency)))
    return failures


class Holder:
    """The bulk of the streams, held by `spindle-loadgen hold` (bench/loadgen/src/hold.rs): a
    process of its own on one runtime thread, reading and dropping the bodies.

    Read here, 10,000 streams' keepalives (2,000 frames/s at the default 5 s) took about 10 % of
    a core from the cores the server and the measured load share, and that cost counted in the
    comparison with the streams closed as if it were the server's. Natively it is a fraction of
    that, and its own figure (`cpu_seconds`, from /proc) says how much.

    `start` opens every stream of the file and `stop` closes them all (the process exits):
    stopping and starting again is closing and reopening the same streams. The counts and the
    CPU add up over the processes, as a Stream's counts carry over a reopening."""

    FIELDS = ("heartbeats", "events", "closed_by_server", "errors")

    def __init__(self, binary: Path, specs: Path, concurrency: int, log_path: Path):
        self.binary, self.specs, self.concurrency, self.log_path = binary, specs, concurrency, log_path
        self.proc = None
        self.starts = 0
        self.past_cpu = 0.0  # CPU seconds of the processes that exited
        self.past = {}  # kind -> {field: count} of the processes that exited
        self.first_error = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> list:
        """Opens the streams; answers the failures ({kind, url, error}), once every one was tried."""
        self.starts += 1
        with open(self.log_path, "ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                str(self.binary), "hold", "--streams", str(self.specs), "--concurrency", str(self.concurrency),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err)
        line = await asyncio.wait_for(self.proc.stdout.readline(), 600)
        if not line:
            raise RuntimeError(f"the stream holder exited ({await self.proc.wait()}); see {self.log_path}")
        return json.loads(line)["failed"]

    def cpu_seconds(self) -> float:
        """User + system CPU of every holder process so far."""
        return self.past_cpu + (servers._cpu_seconds([self.proc.pid]) if self.running() else 0.0)

    async def counts(self) -> dict:
        """kind -> heartbeats, events, closed_by_server, errors so far (over every process), and
        open: the live process's streams still open (0 when stopped)."""
        out = {kind: {**counts, "open": 0} for kind, counts in self.past.items()}
        if self.running():
            # A line on its stdin asks for a snapshot.
            self.proc.stdin.write(b"\n")
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
            if not line:
                raise RuntimeError(f"the stream holder exited ({await self.proc.wait()}); see {self.log_path}")
            for report in json.loads(line)["snapshot"]:
                self._add(out, report)
                out[report["kind"]]["open"] = report["open"]
        return out

    def total(self, counts: dict, field: str) -> int:
        return sum(c[field] for c in counts.values())

    def _add(self, into: dict, report: dict) -> None:
        counts = into.setdefault(report["kind"], {field: 0 for field in self.FIELDS})
        for field in self.FIELDS:
            counts[field] += report[field]
        self.first_error = self.first_error or report.get("first_error")

    async def stop(self) -> None:
        """Closes the streams: stdin closed, the holder prints its counts and exits."""
        if not self.running():
            return
        # Read before it exits: afterwards /proc has nothing of it.
        cpu = servers._cpu_seconds([self.proc.pid])
        self.proc.stdin.close()
        try:
            out = await asyncio.wait_for(self.proc.stdout.read(), 30)
            await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise RuntimeError(f"the stream holder did not stop; see {self.log_path}")
        finally:
            self.past_cpu += cpu
        for line in out.decode().splitlines():
            report = json.loads(line)
            if "kind" in report:
                self._add(self.past, report)


def held_spec(url: str, s: Stream) -> str:
    """A stream as a line of the holder's `--streams` file."""
    return json.dumps({"kind": s.kind, "method": s.method, "url": url + s.path,
                       "body": json.loads(s.body) if s.body else None})


# ---------------------------------------------------------------------------------------------
# The admin session: one psql on the --postgres-url database, never on the measured one.


class Psql:
    def __init__(self, url: str, log_path: Path):
        self.url, self.log_path = url, log_path
        self.proc = None
        self.lock = asyncio.Lock()
        self.n = 0

    async def start(self) -> None:
        if not shutil.which("psql"):
            raise RuntimeError("--backend postgres needs `psql`")
        self.err = open(self.log_path, "wb")
        self.proc = await asyncio.create_subprocess_exec(
            "psql", self.url, "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=0",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self.err)

    async def rows(self, sql: str) -> list:
        async with self.lock:
            self.n += 1
            marker = f"__idle_streams_{self.n}__"
            self.proc.stdin.write(f"{sql};\n\\echo {marker}\n".encode())
            await self.proc.stdin.drain()
            out = []
            while True:
                line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
                if not line:
                    raise RuntimeError(f"psql exited; see {self.log_path}")
                line = line.decode().rstrip("\n")
                if line == marker:
                    return [row.split("\t") for row in out]
                out.append(line)

    async def value(self, sql: str) -> float:
        rows = await self.rows(sql)
        if len(rows) != 1 or not rows[0][0]:
            raise RuntimeError(f"psql: {sql!r} answered {rows!r}; see {self.log_path}")
        return float(rows[0][0])

    async def close(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            self.proc.stdin.close()
            await asyncio.wait_for(self.proc.wait(), 5)
        except (asyncio.TimeoutError, OSError):
            self.proc.kill()
            await self.proc.wait()
        self.err.close()


def transactions_sql(db: str) -> str:
    return f"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '{db}'"


class ActivitySampler:
    """Samples pg_stat_activity of the measured database every `every` s: each new
    (backend, query_start) after `since` is a statement that backend began (two begun by one
    backend within one interval count as one: a lower bound)."""

    def __init__(self, psql: Psql, db: str, every: float = 0.1):
        self.psql, self.db, self.every = psql, db, every
        self.seen = {}  # pid -> query_start last seen
        self.queries = {}  # (backend_type, query) -> count
        self.new_backends = {}  # (backend_type, application_name) -> count
        self.samples = 0
        self.since = None
        self.task = None
        # (seconds since the start, the database's transactions) about once a second: when
        # they happened, give or take PostgreSQL's delay in reporting them.
        self.xacts = []

    async def start(self) -> None:
        self.since = await self.psql.value("SELECT extract(epoch FROM clock_timestamp())")
        await self._sample(count=False)
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        await self._sample(count=True)

    async def _run(self) -> None:
        started = time.monotonic()
        while True:
            await asyncio.sleep(self.every)
            await self._sample(count=True)
            if self.samples % round(1 / self.every) == 0:
                xacts = await self.psql.value(transactions_sql(self.db))
                self.xacts.append((time.monotonic() - started, int(xacts)))

    async def _sample(self, count: bool) -> None:
        rows = await self.psql.rows(
            "SELECT pid, backend_type, coalesce(application_name, ''), "
            "coalesce(extract(epoch FROM query_start)::text, ''), "
            "coalesce(extract(epoch FROM backend_start)::text, ''), "
            "left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 160) "
            f"FROM pg_stat_activity WHERE datname = '{self.db}'")
        self.samples += count
        for row in rows:
            if len(row) < 6:
                continue
            pid, kind, app, started, born, query = row[:6]
            if count and pid not in self.seen and born and float(born) >= self.since:
                key = (kind, app)
                self.new_backends[key] = self.new_backends.get(key, 0) + 1
            if started and self.seen.get(pid) != started:
                self.seen[pid] = started
                if count and float(started) >= self.since:
                    key = (kind, query)
                    self.queries[key] = self.queries.get(key, 0) + 1

    def total(self) -> int:
        return sum(self.queries.values())


# ---------------------------------------------------------------------------------------------
# The server's API, for the set-up and the wake-up runs.


async def in_parallel(items, work, concurrency: int = 16) -> list:
    """`work(item)` for every item, `concurrency` at once; answers the results in order."""
    items = list(items)
    results = [None] * len(items)
    pending = iter(enumerate(items))

    async def worker():
        for i, item in pending:
            results[i] = await work(item)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def create_thread(client: httpx.AsyncClient, _=None) -> str:
    resp = await client.post("/threads", json={"metadata": {"bench": "idle_streams"}})
    resp.raise_for_status()
    return resp.json()["thread_id"]


async def create_pending_run(client: httpx.AsyncClient, thread_id: str) -> str:
    resp = await client.post(f"/threads/{thread_id}/runs",
                             json={"assistant_id": "chain", "input": {"n": 1}, "after_seconds": 3600})
    resp.raise_for_status()
    run = resp.json()
    if run["status"] != "pending":
        raise RuntimeError(f"a run created with after_seconds 3600 is {run['status']}, not pending")
    return run["run_id"]


def plan_streams(args) -> dict:
    """How many streams of each kind, and on how many threads (see the README)."""
    n = args.streams
    counts = {"thread": n // 3 + (n % 3 > 0), "run_join": n // 3 + (n % 3 > 1), "protocol": n // 3}
    per, wake = args.streams_per_thread, args.wake_streams
    threads = {
        "thread": math.ceil((counts["thread"] - wake) / per),
        "protocol": math.ceil((counts["protocol"] - wake) / per),
        "run_join": math.ceil(counts["run_join"] / per),
    }
    return {"counts": counts, "threads": threads, "total_threads": sum(threads.values()) + (wake > 0)}


async def set_up(args, url: str) -> tuple:
    """Creates the threads and pending runs; answers (streams not yet open, the wake thread)."""
    plan = plan_streams(args)
    per, wake = args.streams_per_thread, args.wake_streams
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        started = time.monotonic()
        thread_ids = await in_parallel(range(plan["total_threads"]), lambda _: create_thread(client))
        log(f"    {len(thread_ids)} threads in {time.monotonic() - started:.1f} s")
        wake_thread = thread_ids.pop() if wake else None
        of_kind = {}
        for kind in ("thread", "protocol", "run_join"):
            of_kind[kind] = thread_ids[:plan["threads"][kind]]
            thread_ids = thread_ids[plan["threads"][kind]:]
        started = time.monotonic()
        run_ids = await in_parallel(of_kind["run_join"], lambda t: create_pending_run(client, t))
        log(f"    {len(run_ids)} pending runs (after_seconds 3600) in {time.monotonic() - started:.1f} s")
    body = json.dumps({"channels": args.channels}).encode()

    def thread_stream(t):
        return Stream("thread", t, f"/threads/{t}/stream")

    def protocol_stream(t):
        return Stream("protocol", t, f"/threads/{t}/stream/events", "POST", body)

    by_kind = {
        "thread": [thread_stream(wake_thread) for _ in range(wake)]
        + [thread_stream(t) for t in of_kind["thread"] for _ in range(per)],
        "protocol": [protocol_stream(wake_thread) for _ in range(wake)]
        + [protocol_stream(t) for t in of_kind["protocol"] for _ in range(per)],
        "run_join": [Stream("run_join", t, f"/threads/{t}/runs/{r}/stream", run_id=r)
                     for t, r in zip(of_kind["run_join"], run_ids) for _ in range(per)],
    }
    for kind in KINDS:
        del by_kind[kind][plan["counts"][kind]:]
    # Interleaved, so that the kinds open side by side.
    longest = max(len(v) for v in by_kind.values())
    streams = [by_kind[k][i] for i in range(longest) for k in KINDS if i < len(by_kind[k])]
    return streams, wake_thread, plan


# ---------------------------------------------------------------------------------------------
# Measurements.


async def loadgen(args, urls: list, label: str) -> dict:
    """One run of the native load generator (scenario wait); the event loop keeps reading the
    streams meanwhile."""
    cmd = [str(args.loadgen_bin), "--url", ",".join(urls), "--scenario", "wait",
           "--clients", str(args.load_clients), "--duration", str(args.load_duration),
           "--warmup", str(args.load_warmup), "--input", '{"n": 1}', "--expect", '{"n": 4}']
    busy = compiling_now()
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), args.load_duration + args.load_warmup + 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode}): {shlex.join(cmd)}\n{err.decode()}")
    report = json.loads(out.decode().strip().splitlines()[-1])
    report["machine_compiling"] = busy or compiling_now()
    lat = report["latency_ms"] or {}
    log(f"    load {label}: {report['runs_per_s']:.0f} runs/s, p50 {lat.get('p50', 0):.2f} ms, "
        f"p99 {lat.get('p99', 0):.2f} ms, errors {report['errors']}"
        + (" (someone was compiling)" if report["machine_compiling"] else ""))
    if report["errors"]:
        raise RuntimeError(f"load generator: {report['errors']} errors ({report.get('first_error')})")
    return report


class Vacuum:
    """Before each load run: `VACUUM` (plain, not FULL) and `CHECKPOINT` of the server's
    database, through a `psql` of its own connected to it (VACUUM works on the database it is
    connected to), made and gone before the load starts.

    Every load run adds runs, threads and checkpoints, and the runs' updates leave dead rows;
    with autovacuum off (as on this machine) they pile up, and the latency climbs from point to
    point whatever else happens. After a VACUUM every point starts with no dead rows, and after
    a CHECKPOINT with no dirty pages and the next timed checkpoint `checkpoint_timeout` away.
    What VACUUM cannot undo is the growth of the live rows: the order of the points
    (`measure`) takes care of that."""

    def __init__(self, url: str):
        self.url = url
        self.checkpoint = True
        self.seconds = []
        self.dead_rows = []  # n_dead_tup of the database's tables before each VACUUM

    async def _psql(self, *sql: str) -> tuple:
        cmd = ["psql", self.url, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        for statement in sql:
            cmd += ["-c", statement]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 600)
        return proc.returncode, out.decode(), err.decode()

    async def __call__(self) -> None:
        started = time.monotonic()
        code, out, err = await self._psql(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables", "VACUUM")
        if code != 0:
            raise RuntimeError(f"VACUUM of the server's database failed: {err.strip()}")
        self.dead_rows.append(int(out.split()[0]) if out.split() else 0)
        if self.checkpoint:
            code, _, err = await self._psql("CHECKPOINT")
            if code != 0:
                log(f"    CHECKPOINT refused ({err.strip()}); VACUUM only from now on")
                self.checkpoint = False
        self.seconds.append(time.monotonic() - started)


async def load(args, url: str, label: str, vacuum: Vacuum | None = None) -> dict:
    """`--load-repeat` runs of the load generator, each after `vacuum()` when given: the median
    of each figure, and every p99."""
    reports = []
    for _ in range(args.load_repeat):
        if vacuum:
            await vacuum()
        reports.append(await loadgen(args, [url], label))
    return {
        "p99": statistics.median(r["latency_ms"]["p99"] for r in reports),
        "p50": statistics.median(r["latency_ms"]["p50"] for r in reports),
        "runs_per_s": statistics.median(r["runs_per_s"] for r in reports),
        "p99s": [r["latency_ms"]["p99"] for r in reports],
        "machine_compiling": any(r["machine_compiling"] for r in reports),
    }


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def db_backends_cpu(pg: dict | None, db: str) -> dict:
    return {pid: s for pid, (name, s) in (pg or {}).get("backends", {}).items() if name == db}


async def idle_window(args, server, watchers: list, holder: Holder, psql: Psql | None,
                      db: str | None) -> dict:
    """The idle window: CPU (the server's, the holder's, the harness's), memory, heartbeats, and
    on PostgreSQL the database's transactions and the statements seen in pg_stat_activity."""
    sampler = ActivitySampler(psql, db) if psql else None
    xact0 = await psql.value(transactions_sql(db)) if psql else None
    if sampler:
        await sampler.start()
    held0 = await holder.counts()
    beats0 = sum(s.heartbeats for s in watchers)
    events0 = sum(s.events for s in watchers)
    busy = compiling_now()
    t0, cpu0, me0, pg0 = time.monotonic(), server.cpu_seconds(), self_cpu(), servers.postgres_cpu()
    holder0 = holder.cpu_seconds()
    await asyncio.sleep(args.idle)
    t1, cpu1, me1, pg1 = time.monotonic(), server.cpu_seconds(), self_cpu(), servers.postgres_cpu()
    holder1 = holder.cpu_seconds()
    span = t1 - t0
    held1 = await holder.counts()
    held_beats = holder.total(held1, "heartbeats") - holder.total(held0, "heartbeats")
    watched_beats = sum(s.heartbeats for s in watchers) - beats0
    out = {
        "seconds": span,
        "server_cpu_pct": 100 * (cpu1 - cpu0) / span,
        "client_cpu_pct": 100 * (me1 - me0) / span,
        "holder_cpu_pct": 100 * (holder1 - holder0) / span,
        "heartbeats_per_s": (held_beats + watched_beats) / span,
        "held_heartbeats_per_s": held_beats / span,
        "events": sum(s.events for s in watchers) - events0
        + holder.total(held1, "events") - holder.total(held0, "events"),
        "machine_compiling": busy or compiling_now(),
        **server.memory_mb(),
    }
    if psql:
        await sampler.stop()
        xact1 = await psql.value(transactions_sql(db))
        out.update(transactions=int(xact1 - xact0), queries_seen=sampler.total(),
                   queries=sorted(((k[0], k[1], n) for k, n in sampler.queries.items()), key=lambda q: -q[2]),
                   new_backends=sampler.new_backends, samples=sampler.samples,
                   xact_series=[(round(at, 1), n - int(xact0)) for at, n in sampler.xacts])
        if pg0 and pg1:
            out["pg_cpu_pct"] = 100 * (pg1["total"] - pg0["total"]) / span
            before, after = db_backends_cpu(pg0, db), db_backends_cpu(pg1, db)
            out["pg_db_cpu_pct"] = 100 * sum(s - before.get(pid, 0) for pid, s in after.items()) / span
    return out


async def wake_up(args, url: str, wake_thread: str, watchers: list, label: str) -> dict:
    """`--wake-runs` runs on the wake thread, created through `url` one after the other (each
    joined before the next): the time from sending the POST until each watching stream has the
    run's first event."""
    latencies, missing, wrong, posts, after_answer = [], 0, [], [], []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await client.get("/ok")  # the connection is open before the clock starts
        for _ in range(args.wake_runs):
            loop = asyncio.get_running_loop()
            for s in watchers:
                s.waiter = loop.create_future()
            sent = time.perf_counter()
            resp = await client.post(f"/threads/{wake_thread}/runs",
                                     json={"assistant_id": "chain", "input": {"n": 1}})
            answered = time.perf_counter()
            posts.append((answered - sent) * 1000)
            resp.raise_for_status()
            run_id = resp.json()["run_id"]
            waiters = [s.waiter for s in watchers]
            await asyncio.wait(waiters, timeout=10)
            for s in watchers:
                if not s.waiter.done():
                    missing += 1
                    s.waiter.cancel()
                    continue
                at, event, data = s.waiter.result()
                expected = ("metadata", run_id) if s.kind == "thread" else ("lifecycle", '"running"')
                if event != expected[0] or expected[1] not in data:
                    wrong.append(f"{s.kind}: {event} {data[:120]}")
                latencies.append((at - sent) * 1000)
                after_answer.append(at > answered)
            for s in watchers:
                s.waiter = None
            joined = await client.get(f"/threads/{wake_thread}/runs/{run_id}/join")
            joined.raise_for_status()
            await asyncio.sleep(0.2)
    expected = len(watchers) * args.wake_runs
    out = {"label": label, "expected": expected, "received": len(latencies), "missing": missing,
           "wrong": wrong[:5], "wrong_count": len(wrong), "post_ms_p50": statistics.median(posts)}
    if latencies:
        latencies.sort()
        out.update(p50_ms=statistics.median(latencies), max_ms=latencies[-1], min_ms=latencies[0],
                   after_answer=sum(after_answer))
    log(f"    wake-up ({label}): {len(latencies)}/{expected} streams had the run's first event, "
        f"min {out.get('min_ms', float('nan')):.2f} ms, p50 {out.get('p50_ms', float('nan')):.2f} ms, "
        f"max {out.get('max_ms', float('nan')):.2f} ms, {out.get('after_answer', 0)} after the POST's "
        f"answer (which took {out['post_ms_p50']:.2f} ms, p50)")
    return out


def streams_open_metric(url: str) -> dict:
    """spindle_streams_open by kind, as the server's /metrics says."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("spindle_streams_open{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def pair_order(pairs: int) -> list:
    """The conditions of the load points, pair by pair: closed, open | open, closed | closed,
    open ... Each pair is the other's mirror image, so a steady drift of the machine or of the
    data's size (what VACUUM leaves: the live rows every point adds) weighs on the two
    conditions alike over two pairs instead of always on the second; and the streams change
    state only every other point (open, open: no reopening in between)."""
    return [("closed", "open") if i % 2 == 0 else ("open", "closed") for i in range(pairs)]


def close_streams(streams: list) -> None:
    for s in streams:
        s.close()


def stream_failures(failures: list, held_failures: list) -> str:
    """Both kinds of failures, the harness's (stream, error) and the holder's, told as one."""
    told = [f"{s.kind} {s.method} {s.path}: {err}" for s, err in failures]
    told += [f"{f['kind']} {f['url']}: {f['error']}" for f in held_failures]
    return f"{len(told)} failed; the first: {told[0]}"


async def measure(args, workdir: Path, live: list) -> dict:
    res = {"kinds": {}, "points": [], "reopen_s": []}
    database = None
    if args.backend == "postgres":
        database = servers.PostgresDatabase(args.postgres_url, suffix="idle")
        server = servers.spindle_server(args.spindle_bin, workdir / "spindle", database.url)
        server.database = database.name
        server.after_stop.append(database.drop)
    else:
        server = servers.spindle_server(args.spindle_bin, workdir / "spindle", None)
    if args.keepalive_interval_secs is not None:
        server.argv += ["--keepalive-interval-secs", str(args.keepalive_interval_secs)]
    live.append(server)
    if database:
        database.create()
    log(f"==> spindle ready in {server.start(60):.1f} s at {server.url} ({shlex.join(server.argv)})")
    res["rss_ready_mb"] = server.memory_mb()["rss_mb"]
    vacuum = Vacuum(database.url) if database and args.vacuum else None
    res["vacuum"] = vacuum
    psql = None
    watchers = []
    # The holder's file is written once the streams are planned; until then it holds nothing
    # and stopping it is a no-op.
    holder = Holder(args.loadgen_bin, workdir / "held-streams.jsonl", args.open_concurrency,
                    workdir / "holder.log")
    try:
        if database:
            psql = Psql(args.postgres_url, workdir / "psql.log")
            await psql.start()
            res["autovacuum"] = (await psql.rows("SHOW autovacuum"))[0][0]
        log("==> load on the fresh server")
        # Not vacuumed: there is nothing to clean yet, and VACUUM of the empty tables would
        # record them as empty (reltuples 0), which the planner then believes while the point
        # fills them (smoke runs: p99 ×6, a quarter of the runs/s).
        res["load_fresh"] = await load(args, server.url, "on the fresh server")

        log(f"==> set-up: threads and pending runs for {args.streams} streams")
        started = time.monotonic()
        streams, wake_thread, plan = await set_up(args, server.url)
        res["setup_s"] = time.monotonic() - started
        res["plan"] = plan
        for kind in KINDS:
            res["kinds"][kind] = sum(s.kind == kind for s in streams)
        # Only the streams whose first event the wake-up times stay here (their reader's time
        # is the measurement); the holder takes the rest.
        watchers = [s for s in streams if s.thread_id == wake_thread]
        held = [s for s in streams if s.thread_id != wake_thread]
        holder.specs.write_text("".join(held_spec(server.url, s) + "\n" for s in held))
        res["held"] = len(held)
        n = len(streams)

        async def open_streams() -> float:
            """Opens the watchers here and the rest in the holder, side by side; answers how
            long it took, or raises with the failures."""
            started = time.monotonic()
            failures, held_failures = await asyncio.gather(
                open_all(watchers, "127.0.0.1", port_of(server.url), args.open_concurrency), holder.start())
            took = time.monotonic() - started
            if failures or held_failures:
                raise RuntimeError(f"of {n} streams, {stream_failures(failures, held_failures)}")
            return took

        async def first_open() -> None:
            """Opens the streams; the idle window; the wake-ups."""
            log(f"==> opening {n} streams, {args.open_concurrency} at a time: {len(held)} in "
                f"`spindle-loadgen hold`, {len(watchers)} here")
            res["open_s"] = await open_streams()
            log(f"    all {n} open (200, text/event-stream) in {res['open_s']:.1f} s: "
                + ", ".join(f"{count} {kind}" for kind, count in res["kinds"].items()))

            log(f"==> settling {args.settle:g} s, then the idle window of {args.idle:g} s")
            await asyncio.sleep(args.settle)
            res["idle"] = await idle_window(args, server, watchers, holder, psql,
                                            database.name if database else None)
            idle = res["idle"]
            log(f"    server CPU {idle['server_cpu_pct']:.1f} %, RSS {idle['rss_mb']:.0f} MB (peak "
                f"{idle['peak_mb']:.0f} MB), heartbeats {idle['heartbeats_per_s']:.0f}/s, holder CPU "
                f"{idle['holder_cpu_pct']:.1f} %, harness CPU {idle['client_cpu_pct']:.1f} %"
                + (f", database transactions {idle['transactions']}, statements seen "
                   f"{idle['queries_seen']}" if psql else ""))
            for kind, query, count in idle.get("queries", []):
                log(f"      {count} x [{kind}] {query}")
            for (kind, app), count in idle.get("new_backends", {}).items():
                log(f"      {count} new connection(s): {kind} {app}")
            if idle.get("xact_series"):
                log("      transactions since the window opened, about every second: "
                    + " ".join(f"{at:g}s:{count}" for at, count in idle["xact_series"]))
            res["metric_open"] = streams_open_metric(server.url)
            log(f"    /metrics spindle_streams_open: {res['metric_open']}")

            res["wake"] = []
            if watchers:
                log(f"==> wake-up: runs on the thread {len(watchers)} streams follow")
                res["wake"].append(await wake_up(args, server.url, wake_thread, watchers,
                                                 "run created on the same process"))
                if args.second_process:
                    other = servers.spindle_server(args.spindle_bin, workdir / "spindle-2", database.url)
                    live.append(other)
                    log(f"==> a second process ready in {other.start(60):.1f} s at {other.url}")
                    res["wake"].append(await wake_up(args, other.url, wake_thread, watchers,
                                                     "run created on another process"))
                    other.stop()

        async def reopen() -> None:
            log(f"==> reopening the {n} streams")
            res["reopen_s"].append(await open_streams())
            log(f"    all {n} open again in {res['reopen_s'][-1]:.1f} s")

        state = "closed"
        for i, order in enumerate(pair_order(args.pairs)):
            for condition in order:
                if condition != state:
                    if condition == "closed":
                        log(f"==> closing the {n} streams")
                        close_streams(watchers)
                        await holder.stop()
                    elif "idle" not in res:
                        await first_open()
                    else:
                        await reopen()
                    state = condition
                    await asyncio.sleep(args.reopen_settle)
                label = f"pair {i + 1} of {args.pairs}, streams {condition}"
                log(f"==> load, {label}")
                holder_cpu, started = holder.cpu_seconds(), time.monotonic()
                point = await load(args, server.url, label, vacuum)
                point.update(pair=i + 1, streams=condition)
                if state == "open":
                    # What holding cost while the load ran, as a share of one core (over the
                    # VACUUMs' seconds too, on PostgreSQL: a little diluted).
                    point["holder_cpu_pct"] = (100 * (holder.cpu_seconds() - holder_cpu)
                                               / (time.monotonic() - started))
                    held_now = await holder.counts()
                    point["open_now"] = (sum(s.task is not None and not s.task.done() for s in watchers)
                                         + holder.total(held_now, "open"))
                res["points"].append(point)
                if i == 0 and condition == "closed":
                    # After the set-up and a load run: the base of the memory per stream.
                    res["rss_before_mb"] = server.memory_mb()["rss_mb"]
        held_counts = await holder.counts()
        # The holder holds every stream but the wake-up thread's.
        res["stray_events"] = holder.total(held_counts, "events")
        # A held stream that ended in an error (a reset) is one the server closed too, as here.
        res["closed_by_server"] = (sum(s.closed_by_server for s in watchers)
                                   + holder.total(held_counts, "closed_by_server")
                                   + holder.total(held_counts, "errors"))
        res["holder_error"] = holder.first_error
        res["peak_mb"] = server.memory_mb()["peak_mb"]
    finally:
        close_streams(watchers)
        try:
            await holder.stop()
        finally:
            res["holder_cpu_s"], res["holder_starts"] = holder.cpu_seconds(), holder.starts
            await asyncio.sleep(0.5)
            if psql:
                await psql.close()

    await asyncio.sleep(2)
    res["rss_end_mb"] = server.memory_mb()["rss_mb"]
    return res


# ---------------------------------------------------------------------------------------------
# The report.


def facts(args) -> dict:
    return {
        **base_facts(args.spindle_bin),
        "Load": f"load average {os.getloadavg()[0]:.1f} at the end",
        "Backend": "SQLite (`spindle dev`)" if args.backend == "sqlite" else "PostgreSQL (`spindle serve`)",
    }


def fmt_ms(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def compare(res: dict) -> dict:
    """Other clients' p99 with the streams open against closed: each pair's, and the medians
    over the pairs."""
    pts = res["points"]
    pairs = sorted({pt["pair"] for pt in pts})
    of = {(pt["pair"], pt["streams"]): pt["p99"] for pt in pts}
    closed = [of[i, "closed"] for i in pairs]
    opened = [of[i, "open"] for i in pairs]
    out = {"pairs": list(zip(closed, opened)), "pair_ratios": [o / c for c, o in zip(closed, opened)],
           "closed": statistics.median(closed), "open": statistics.median(opened)}
    out["ratio"] = out["open"] / out["closed"]
    return out


def verdict(res: dict) -> str:
    cmp = compare(res)
    n = sum(res["kinds"].values())
    ok = cmp["ratio"] <= 1.10
    return (f"- other clients' p99 with {n} streams open is within 10 % of without: "
            f"{'yes' if ok else 'no'} (ratio {cmp['ratio']:.2f}); median p99 {cmp['open']:.2f} ms open, "
            f"{cmp['closed']:.2f} ms closed, over {len(cmp['pairs'])} pair(s)")


def markdown(args, command: str, res: dict) -> str:
    idle, plan = res["idle"], res["plan"]
    n = sum(res["kinds"].values())
    per = args.streams_per_thread
    lines = ["# Idle streams", "", f"Command: `{command}`", ""]
    lines += [f"- {k}: {v}" for k, v in facts(args).items()]
    lines += ["", "| | |", "|---|---|"]
    kinds = " / ".join(str(res["kinds"][k]) for k in KINDS)
    lines.append(f"| streams open (thread / run join / protocol v2 SSE) | {n}: {kinds}, every one 200 "
                 f"`text/event-stream`; {res['held']} held by `spindle-loadgen hold`, {n - res['held']} "
                 f"(the wake-up thread's) by the harness; the server's `spindle_streams_open`: "
                 + ", ".join(f"{k} {int(v)}" for k, v in res["metric_open"].items() if v) + " |")
    lines.append(f"| threads | {plan['total_threads']}: {per} stream(s) of one kind per thread"
                 + (f" (run join: per pending run)" if per > 1 else "")
                 + (f", plus the wake-up thread with {args.wake_streams} thread and {args.wake_streams} "
                    "protocol streams" if args.wake_streams else "")
                 + f"; set up in {res['setup_s']:.0f} s, streams opened in {res['open_s']:.1f} s |")
    if "transactions" in idle:
        tps = idle["transactions"] / idle["seconds"]
        lines.append(f"| database transactions while idle (pg_stat_database) | {idle['transactions']} in "
                     f"{idle['seconds']:.0f} s ({tps:.2f}/s) |")
        seen = "; ".join(f"{q_n} × {kind}: `{q[:100]}`" for kind, q, q_n in idle["queries"][:6]) or "none"
        born = "; ".join(f"{b_n} × {kind} {app}".rstrip() for (kind, app), b_n in idle["new_backends"].items())
        lines.append(f"| statements seen while idle (pg_stat_activity, {idle['samples']} samples) | "
                     f"{idle['queries_seen']}: {seen}" + (f"; new connections: {born}" if born else "") + " |")
    else:
        lines.append("| database queries while idle | not counted on SQLite (streams poll the log every 250 ms there) |")
    lines.append(f"| server CPU while idle | {idle['server_cpu_pct']:.1f} % of a core |")
    if idle.get("pg_cpu_pct") is not None:
        lines.append(f"| PostgreSQL CPU while idle: the measured database's backends / the whole server | "
                     f"{idle['pg_db_cpu_pct']:.1f} % / {idle['pg_cpu_pct']:.1f} % |")
    lines.append(f"| keepalive comments received while idle | {idle['heartbeats_per_s']:.0f}/s "
                 f"({idle['held_heartbeats_per_s']:.0f}/s by the holder) |")
    during = [pt["holder_cpu_pct"] for pt in res["points"] if "holder_cpu_pct" in pt]
    lines.append(f"| holding the streams: CPU of `spindle-loadgen hold` (one thread) while idle / during "
                 f"each load point with the streams open / in all; the harness's CPU while idle | "
                 f"{idle['holder_cpu_pct']:.2f} % / "
                 + ", ".join(f"{x:.2f}" for x in during)
                 + f" % of a core / {res['holder_cpu_s']:.2f} s over its {res['holder_starts']} run(s); "
                 f"{idle['client_cpu_pct']:.2f} % |")
    per_stream = (idle["rss_mb"] - res["rss_before_mb"]) * 1024 / max(n, 1)
    lines.append(f"| server memory (VmRSS): ready / after the set-up and a load run / streams open, end of "
                 f"idle window / at the end, streams closed | {res['rss_ready_mb']:.0f} / "
                 f"{res['rss_before_mb']:.0f} / {idle['rss_mb']:.0f} / {res['rss_end_mb']:.0f} MB "
                 f"(≈ {per_stream:.1f} KB more per open stream) |")
    lines.append(f"| server memory peak (VmHWM) with the streams open / at the end | {idle['peak_mb']:.0f} / "
                 f"{res['peak_mb']:.0f} MB |")
    cmp = compare(res)
    runs = f"median of {args.load_repeat} runs of " if args.load_repeat > 1 else ""
    lines.append(f"| other clients' p99 (wait, {args.load_clients} clients, {runs}{args.load_duration:g} s "
                 f"per point), each pair: streams closed / open | "
                 + "; ".join(f"{c:.2f} / {o:.2f}" for c, o in cmp["pairs"])
                 + f" ms (pairs in the order closed, open | open, closed | ...) |")
    lines.append(f"| their median over the {args.pairs} pair(s): streams closed / open | "
                 f"{cmp['closed']:.2f} / {cmp['open']:.2f} ms (open / closed: **×{cmp['ratio']:.2f}**; "
                 "each pair's: " + ", ".join(f"×{r:.2f}" for r in cmp["pair_ratios"]) + ") |")
    lines.append("| their p50 and runs/s, point by point | "
                 + "; ".join(f"{pt['streams']} {pt['p50']:.2f} ms, {pt['runs_per_s']:.0f}" for pt in res["points"])
                 + " |")
    if args.load_repeat > 1:
        lines.append("| every p99, point by point | "
                     + "; ".join(f"{pt['streams']} " + ", ".join(f"{x:.1f}" for x in pt["p99s"])
                                 for pt in res["points"]) + " ms |")
    fresh = res["load_fresh"]
    lines.append(f"| on the fresh server, before the set-up (not compared) | p99 {fresh['p99']:.2f} ms, "
                 f"p50 {fresh['p50']:.2f} ms, {fresh['runs_per_s']:.0f} runs/s |")
    vacuum = res.get("vacuum")
    if vacuum is not None and vacuum.seconds:
        lines.append(f"| before each load run: VACUUM{' and CHECKPOINT' if vacuum.checkpoint else ''} of the "
                     f"server's database (autovacuum {res.get('autovacuum', '?')}) | {len(vacuum.seconds)} times, "
                     f"{statistics.median(vacuum.seconds):.1f} s each (median, outside the measured load); "
                     f"dead rows found: {', '.join(str(d) for d in vacuum.dead_rows)} |")
    if res["reopen_s"]:
        lines.append(f"| the streams reopened between the pairs | in "
                     + ", ".join(f"{x:.1f}" for x in res["reopen_s"]) + " s |")
    short = [pt["open_now"] for pt in res["points"] if pt.get("open_now", n) < n]
    if short:
        lines.append(f"| load points with fewer than the {n} streams open (closed by the server) | "
                     + ", ".join(str(x) for x in short) + " |")
    for w in res["wake"]:
        lines.append(f"| wake-up, {w['label']}: the run's first event on each stream, from sending the "
                     f"POST, min / p50 / max | {fmt_ms(w.get('min_ms'))} / {fmt_ms(w.get('p50_ms'))} / "
                     f"{fmt_ms(w.get('max_ms'))} ms; {w['received']} of {w['expected']} (streams × runs) had it"
                     + (f", {w['wrong_count']} with another event first" if w["wrong_count"] else "")
                     + f"; the POST's answer took {w['post_ms_p50']:.2f} ms (p50), "
                     f"{w.get('after_answer', 0)} events came after it |")
    lines.append(f"| events on the other streams (should be none) / streams the server closed | "
                 f"{res['stray_events']} / {res['closed_by_server']}"
                 + (f" (the holder's first error: {res['holder_error']})" if res.get("holder_error") else "")
                 + " |")
    lines += ["", "Goals (issue 29, item 3):", ""]
    if "transactions" in idle:
        lines.append(f"- no database queries while idle: {idle['queries_seen']} statements from the server seen, "
                     f"{idle['transactions']} transactions in the database")
    lines.append(f"- server memory under 300 MB: {idle['rss_mb']:.0f} MB "
                 f"({'yes' if idle['rss_mb'] < 300 else 'NO'})")
    lines.append(verdict(res))
    ok = all(w["received"] == w["expected"] and not w["wrong_count"] for w in res["wake"])
    lines.append(f"- streams wake when a run starts: {'yes' if ok and res['wake'] else 'NO'}")
    lines += ["", "Notes:", ""]
    lines.append(f"- The idle window is {idle['seconds']:.0f} s, after {args.settle:g} s of quiet: PostgreSQL's "
                 f"backends report their transactions to pg_stat_database up to {STATS_FLUSH:g} s late, so "
                 "the quiet spell lets the set-up's land before the window opens. pg_stat_activity is "
                 "sampled every 100 ms: a statement is a backend's new `query_start`, so two by one "
                 "backend within 100 ms count once, and autovacuum's workers show up there too.")
    lines.append(f"- Other clients' p99: {args.pairs} pair(s) of load points, one with the {n} streams "
                 f"closed and one with them open, in the order closed, open | open, closed | ...; each point is "
                 f"{args.load_repeat} run(s) of `spindle-loadgen --scenario wait` on the same server and "
                 "database. Every run adds runs, threads and checkpoints to the database, and the latency "
                 "climbs with them"
                 + (": so before each run the server's database is vacuumed (plain VACUUM, from a psql of "
                    "its own, outside the measured time; and CHECKPOINT) and every point starts with no dead "
                    "rows, while the mirrored order spreads the growth of the live rows over both conditions."
                    if vacuum is not None else
                    (" (--no-vacuum: dead rows pile up from point to point; the mirrored order spreads them "
                     "over both conditions)." if args.backend == "postgres" else
                     "; the mirrored order spreads that growth over both conditions."))
                 + " The verdict compares the medians of the two conditions.")
    points = [("the load on the fresh server", res["load_fresh"]["machine_compiling"]),
              ("the idle window", idle["machine_compiling"])]
    points += [(f"load point {pt['pair']} ({pt['streams']})", pt["machine_compiling"]) for pt in res["points"]]
    busy = [name for name, flag in points if flag]
    if busy:
        lines.append(f"- Someone else was compiling on the machine during {', '.join(busy)}: those "
                     "figures are noisy (CPU taken from the server and its clients).")
    lines.append("- The streams are held by `spindle-loadgen hold` (one runtime thread, a process of its "
                 "own, stopped to close them and started again to reopen them), except the wake-up "
                 "thread's, which the harness reads to time their first event. Held by the harness "
                 "itself, 10,000 streams' keepalives took it about 10 % of a core, on the cores the "
                 "server and the load share: that counted against the streams in the comparison. The "
                 "holder's CPU is its own row, to be read against the difference it could make.")
    lines.append("- Run join streams follow runs created with `after_seconds: 3600`, pending throughout; "
                 "protocol streams are `POST /threads/{id}/stream/events` with channels "
                 f"{', '.join(args.channels)}.")
    return "\n".join(lines) + "\n"


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def main(argv) -> int:
    args = parse_args(argv)
    command = shlex.join(["bench/.venv/bin/python", "bench/idle_streams.py", *argv])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    # The holder inherits the limit: it needs one file per stream it holds.
    if limit < args.streams + 200:
        log(f"!! {args.streams} streams need more open files than the limit ({limit}; `ulimit -n`)")
        return 2
    for binary in (args.spindle_bin, args.loadgen_bin):
        if not binary.exists():
            log(f"!! {binary} does not exist (`cargo build --release -p spindle -p spindle-loadgen`; "
                "the load generator is not in the default build)")
            return 2
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    workdir = servers.make_workdir()
    live = []
    failed = False
    try:
        res = asyncio.run(measure(args, workdir, live))
    except (Exception, KeyboardInterrupt) as err:
        log(f"!! stopped: {type(err).__name__}: {err}\n   server logs kept in {workdir}")
        failed = True
    finally:
        for server in reversed(live):
            try:
                server.stop()
            except Exception as err:  # noqa: BLE001 - the others must stop all the same
                log(f"!! stopping {server.name} at {server.url}: {err}")
                failed = True
    if failed:
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    text = markdown(args, command, res)
    print(text)
    args.output.write_text(text)
    log(verdict(res)[2:])
    log(f"==> wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
