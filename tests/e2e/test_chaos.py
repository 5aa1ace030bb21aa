"""The chaos test (issue 29): three `spindle serve` processes on one PostgreSQL database (a fresh
one, dropped afterwards), a few hundred runs of `chain`, `slow` and `fanout` started and followed
by clients through whichever process answers, and SIGKILLs and restarts of the processes at
random moments (each comes back on its own port). The clients (``CLIENTS`` of them, each pausing
``PAUSE`` between runs) start streamed runs (``POST /runs/stream``, on_disconnect cancel or
continue), waited runs (``/runs/wait``), background runs (left alone, or followed with a join
stream), and pairs of background runs on one thread, the second enqueued behind the first; some
with ``durability: sync``. A client whose connection is cut goes on with another process: a
stream resumes with ``Last-Event-ID`` (the last id it got), a wait becomes a ``/join``, and a
creation whose answer was lost looks for the run on its thread before trying again. Before the
chaos, one calm run of each graph checks that the test's model of its events (``Case``) is the
server's. Once the chaos stops and every process is back up, it checks what ARCHITECTURE.md
("Data flow of a run") promises, each failure filed under a category:

- LOST, STUCK, STATUS: every run a client was answered with (and every run found on the test's
  threads) exists and ends `success` within ``SETTLE_SECONDS``. The graphs used never fail by
  themselves and nobody cancels, and ``--max-attempts`` is set far above the number of kills
  (``MAX_ATTEMPTS``), so any other end (`error` WorkerLost included, `interrupted`, `timeout`) is
  a failure: a run given up although it could not have used up its attempts, or cancelled by
  nobody;
- THREAD: no thread left `busy` once its runs ended (a run's end writes its thread's status in
  the same transaction), and each thread's values those of its last run;
- RESUME, STREAM: every stream a client followed (``POST /runs/stream``, or a join of a
  background run), cut when its process was killed and resumed on another process with
  ``Last-Event-ID``, got exactly a replay of the run's stream from the start (``Last-Event-ID:
  -1`` once the run ended), ids included; streams never cut (STREAM) must equal it too. Filed as
  RESUME_UNLOGGED when the only difference is events the log never had (sent live by a process
  killed before it logged them), else RESUME;
- LOG, HISTORY: no event logged twice, see ``check_log``. A resumed attempt runs again only the
  step that was not saved yet, so only that step's events may show twice (once from each
  attempt), and a resumed attempt first streams the values it resumes from; every saved step's
  events are in the replay exactly once, ids strictly increase, and nothing else repeats. The
  thread's checkpoint history shows no step saved twice (a saved step run again) and no fork;
- VALUES: every run's final values right (the run's `output`, the last `values` event of its
  replay, the answer of `/wait` or `/join`, the thread's values);
- EARLY_END: a run stream that ends while its run is still active; CLIENT: a client's own error
  (an unexpected answer), reported rather than hidden.

Settings: ``SPINDLE_CHAOS_SEED`` replays a seed (printed at the start and in every failure),
``SPINDLE_CHAOS_SECONDS`` sets the chaos' length (default 150). The kill schedule and every
client's choices come from the seed; when the kills land relative to the runs depends on timing,
so a replay follows the same plan, not always the same interleaving.

The processes' output (stdout and stderr, every incarnation, with the test's start and kill
markers) is kept in ``server<N>.log`` in a temporary folder, whose tail is printed on failure
(the folder is then kept, with ``failures.txt``); the database is dropped and every process
stopped in every case. Not parametrized by backend: it runs once, on PostgreSQL only.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)

PROCESSES = 3
CHAOS_SECONDS = float(os.environ.get("SPINDLE_CHAOS_SECONDS", "150"))
# A lost run is taken over once its lease runs out: a short lease keeps the test short (the
# lease is renewed every third of it, which a loaded 2-core machine still manages).
LEASE_SECS = 3
# Far more attempts than kills: a run given up after "too many attempts" is then a defect.
MAX_ATTEMPTS = 1000
# Runs each process executes at once, and clients starting runs at once: modest, the machine
# has 2 cores and the three processes and PostgreSQL share them with the clients.
WORKERS = 4
CLIENTS = 6
# A client's pause between two runs (seconds): a few hundred runs in all.
PAUSE = (0.5, 2.5)
# After the chaos (and once every process is back up), how long the runs may take to end.
SETTLE_SECONDS = 120
# Seconds between two kills, and how long a killed process stays down.
KILL_EVERY = (1.0, 5.0)
DOWN_FOR = (0.2, 4.0)
STREAM_MODES = ["values", "updates", "custom"]

# --------------------------------------------------------------------------------------------
# What each run must log and end with
# --------------------------------------------------------------------------------------------


def ev(event: str, data: Any) -> str:
    """An event as compared: its name and its data in canonical JSON."""
    return event + " " + json.dumps(data, sort_keys=True, separators=(",", ":"))


@dataclass
class Case:
    """A graph, its input, its final values, and the events one attempt logs without a crash,
    by step: ``groups[0]`` is the input's `values`, each later group a super-step's events
    (`custom` while its nodes run, each node's `updates`, then the `values` after the step).
    Every event of a case is distinct, so an event names its step."""

    graph: str
    input: dict
    final: dict
    groups: list[list[str]]
    # The `values` of the run's input checkpoint (step -1: the input not yet applied, channels
    # at their defaults), which an attempt resuming from that checkpoint streams first. A
    # first attempt never logs it.
    start_values: str
    index: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.index = {p: g for g, group in enumerate(self.groups) for p in group}
        assert len(self.index) == sum(map(len, self.groups)), "a case's events must be distinct"

    def describe(self) -> str:
        return f"{self.graph} {json.dumps(self.input)}"


def chain_case(n: int) -> Case:
    """chain: a -> b -> c, each adds 1 to n."""
    groups = [[ev("values", {"n": n})]]
    for i, node in enumerate("abc", start=1):
        groups.append([ev("updates", {node: {"n": n + i}}), ev("values", {"n": n + i})])
    return Case("chain", {"n": n}, {"n": n + 3}, groups, ev("values", {}))


def slow_case(delay_ms: int) -> Case:
    """slow: a -> b; each emits custom {"tick": node}, sleeps delay_ms, adds 1 to ticks."""
    groups = [[ev("values", {"delay_ms": delay_ms})]]
    for i, node in enumerate("ab", start=1):
        values = {"delay_ms": delay_ms, "ticks": i}
        groups.append([ev("custom", {"tick": node}), ev("updates", {node: {"ticks": i}}), ev("values", values)])
    return Case("slow", {"delay_ms": delay_ms}, {"delay_ms": delay_ms, "ticks": 2}, groups, ev("values", {}))


def fanout_case(items: list[str]) -> Case:
    """fanout: one `work` task per item (Send), in one step; results upper-cased, in item order."""
    results = [x.upper() for x in items]
    groups = [
        [ev("values", {"items": items, "results": []})],  # an append channel starts empty
        [*(ev("updates", {"work": {"results": [r]}}) for r in results),
         ev("values", {"items": items, "results": results})],
    ]
    return Case("fanout", {"items": items}, {"items": items, "results": results}, groups,
                ev("values", {"results": []}))


def random_case(rng: random.Random, graph: str | None = None) -> Case:
    graph = graph or rng.choices(["chain", "slow", "fanout"], weights=[35, 40, 25])[0]
    if graph == "chain":
        return chain_case(rng.randint(0, 10_000))
    if graph == "slow":
        return slow_case(rng.randint(100, 1500))
    count = rng.randint(2, 5)
    return fanout_case([f"w{i}{rng.choice('abcdefghijklmnopqrstuvwxyz')}" for i in range(count)])


def check_log(case: Case, events: list[tuple[int, str, Any]], run_id: str) -> list[str]:
    """Problems of a run's replay (``(id, event, data)`` in the order sent) against ``case``.

    The replay is cut into attempts at each `metadata` ``{run_id, attempt}`` (an attempt that
    logged nothing leaves no trace and changes nothing). What the log guarantees
    (ARCHITECTURE.md): a step's save is stored with every event emitted before it, and a step's
    events are logged only after the step before it was saved. So when an attempt dies after
    logging events up to step M, the next attempt resumes from the latest saved checkpoint:
    after step M (M saved with all its events) or after step M-1 (M's events, some or all, were
    logged but its save was lost). It first streams the `values` of the checkpoint it resumes
    from (as LangGraph does; a run that died before its input checkpoint was saved starts over
    with its input, whose `values` look the same), then runs the next steps. Hence, for each
    attempt after the first:

    - its first `values`, when already logged, names the checkpoint it resumes from (step g);
      every step up to g must be in the log in full, and g must be M or M-1. The values of the
      input checkpoint (``Case.start_values``: the input not applied yet) name step -1: the
      attempt before died after saving the input checkpoint and before saving step 0;
    - the next events continue at step g+1, step after step (a step starts only when the one
      before is complete in the log), never going back;
    - an event logged by an earlier attempt may show again only if it belongs to step M, the
      one the dead attempt was in, run again because it was not saved;
    - within one attempt no event shows twice.

    At the end every event of every step is in the log. Ids strictly increase throughout.
    """
    problems: list[str] = []
    ids = [e[0] for e in events]
    for a, b in zip(ids, ids[1:]):
        if b <= a:
            problems.append(f"event ids do not strictly increase: {a} then {b}")
            break
    attempts: list[tuple[Any, list[tuple[int, str]]]] = []
    for id_, event, data in events:
        if event == "metadata":
            if not isinstance(data, dict) or data.get("run_id") != run_id:
                problems.append(f"id {id_}: metadata of another run: {data}")
            attempts.append((data.get("attempt") if isinstance(data, dict) else None, []))
        else:
            if not attempts:
                problems.append(f"id {id_}: {event} before the run's first metadata event")
                attempts.append((None, []))
            attempts[-1][1].append((id_, ev(event, data)))
    numbers = [a for a, _ in attempts]
    if not all(isinstance(n, int) for n in numbers) or any(b <= a for a, b in zip(numbers, numbers[1:])):
        problems.append(f"attempt numbers of the metadata events do not increase: {numbers}")

    seen: Counter[str] = Counter()  # every event logged so far, by earlier attempts and this one

    def complete(g: int) -> bool:
        return all(seen[p] for p in case.groups[g])

    top = -1  # M: the highest step any attempt logged an event of
    for k, (number, logged) in enumerate(attempts):
        if not logged:
            continue
        prior = Counter(seen)  # what earlier attempts logged
        items = list(logged)
        where = f"attempt {number}"
        if k == 0 and number in (1, None):  # the run's first attempt: from its input
            lo = 0
        else:
            id0, p0 = items[0]
            if p0 == case.start_values or (p0.startswith("values ") and prior[p0] and p0 in case.index):
                g = case.index.get(p0, -1)
                if g not in (top - 1, top):
                    problems.append(f"{where} (id {id0}) resumes after step {g}, but the log reached "
                                    f"step {top}: a step whose events were logged ran again, or one was skipped")
                for h in range(g + 1):
                    if not complete(h):
                        missing = [p for p in case.groups[h] if not seen[p]]
                        problems.append(f"{where} (id {id0}) resumes after step {g}, but step {h} "
                                        f"is not in the log in full (missing {missing}): a step saved "
                                        "without its events")
                items = items[1:]
                lo = g + 1
            else:
                lo = case.index.get(p0, -1)
                if lo not in (top, top + 1):
                    problems.append(f"{where} (id {id0}) starts at step {lo} with {p0}, but the log "
                                    f"reached step {top}")
        cur = None  # the step this attempt is in
        in_attempt: set[str] = set()
        for id_, p in items:
            if p not in case.index:
                problems.append(f"{where} id {id_}: unexpected event {p}")
                continue
            g = case.index[p]
            if p in in_attempt:
                problems.append(f"{where} id {id_}: {p} logged twice by one attempt")
            in_attempt.add(p)
            if cur is None:
                if g != lo:
                    problems.append(f"{where} id {id_}: continues at step {g} ({p}), expected step {lo}")
            elif g < cur:
                problems.append(f"{where} id {id_}: goes back from step {cur} to step {g} ({p})")
            elif g > cur:
                if g != cur + 1:
                    problems.append(f"{where} id {id_}: jumps from step {cur} to step {g} ({p})")
                if not complete(cur):
                    missing = [q for q in case.groups[cur] if not seen[q]]
                    problems.append(f"{where} id {id_}: step {g} starts before step {cur} is in "
                                    f"the log in full (missing {missing})")
            if prior[p] and not (g == lo and lo == top):
                problems.append(f"{where} id {id_}: {p} (step {g}) was logged by an earlier attempt "
                                f"and logged again, though only step {top} (the one the dead attempt "
                                f"was in) may run again, and this attempt resumed at step {lo}")
            cur = g if cur is None else max(cur, g)
            seen[p] += 1
        steps = [case.index[p] for _, p in logged if p in case.index]
        top = max([top, *steps])
    missing = [p for group in case.groups for p in group if not seen[p]]
    if missing:
        problems.append(f"events never logged: {missing}")
    return problems


# --------------------------------------------------------------------------------------------
# The server processes
# --------------------------------------------------------------------------------------------


class ServerProc:
    """One `spindle serve` slot: always the same port, started again after each kill. Its
    output, every incarnation, goes to one log file with the test's markers."""

    def __init__(self, slot: int, port: int, db_url: str, workdir: Path, t0: float):
        self.slot = slot
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.db_url = db_url
        self.workdir = workdir
        self.log_path = workdir / f"server{slot}.log"
        self.t0 = t0
        self.proc: subprocess.Popen | None = None
        self.ready = False
        self.starts = 0
        self.kills = 0

    def argv(self) -> list[str]:
        return [str(harness.spindle_bin()), "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--database-url", self.db_url, "--examples", "--run-lease-secs", str(LEASE_SECS),
                "--max-attempts", str(MAX_ATTEMPTS), "--workers", str(WORKERS)]

    def mark(self, text: str) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== chaos t+{time.monotonic() - self.t0:.2f}s: {text} =====\n".encode())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self, timeout: float = 60.0) -> bool:
        """Start the process on its port and wait until GET /ok answers (a few tries when the
        port is still held). False when the process was killed while starting (whoever killed
        it starts it again)."""
        failure = ""
        for _ in range(10):
            self.starts += 1
            self.mark(f"start #{self.starts} of server {self.slot} on port {self.port}")
            with open(self.log_path, "ab") as log:
                proc = subprocess.Popen(self.argv(), cwd=self.workdir, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=log, env=harness.child_env())
            self.proc = proc
            self.mark(f"pid {proc.pid}")
            deadline = time.monotonic() + timeout
            async with httpx.AsyncClient(timeout=2.0) as c:
                while time.monotonic() < deadline and proc.poll() is None:
                    try:
                        r = await c.get(self.url + "/ok")
                        if r.status_code == 200 and proc.poll() is None:
                            self.ready = self.proc is proc
                            return True
                    except httpx.HTTPError:
                        pass
                    await asyncio.sleep(0.1)
            if proc.poll() is None:
                self.kill("not ready in time")
                failure = f"server {self.slot} was not ready after {timeout:.0f}s"
                break
            if proc.returncode == -signal.SIGKILL:
                return False
            output = harness.tail(self.log_path.read_text(errors="replace"), 2000)
            failure = f"server {self.slot} exited at start-up ({proc.returncode}):\n{output}"
            if "address already in use" not in output.lower():
                break
            await asyncio.sleep(0.5)
        raise RuntimeError(failure)

    def kill(self, why: str = "SIGKILL") -> None:
        self.ready = False
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.kills += 1
            self.mark(f"{why}: server {self.slot} (pid {self.proc.pid}) killed")

    def stop(self) -> None:
        self.ready = False
        if self.proc is not None:
            harness.stop(harness.Server(backend="postgres", base_url=self.url, proc=self.proc))

    def tail(self, limit: int = 5000) -> str:
        if not self.log_path.exists():
            return ""
        return harness.tail(self.log_path.read_text(errors="replace"), limit)

    def lines_naming(self, *needles: str, limit: int = 25) -> list[str]:
        """The log lines naming any of ``needles``, with the test's markers between them."""
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text(errors="replace").splitlines()
        keep = [(any(n in line for n in needles), line) for line in lines
                if line.startswith("===== chaos") or any(n in line for n in needles)]
        named = [i for i, (hit, _) in enumerate(keep) if hit]
        if not named:
            return []
        window = [line for _, line in keep[max(0, named[0] - 2):named[-1] + 3]]
        return window if len(window) <= limit else window[:limit // 2] + ["    ..."] + window[-limit // 2:]


# --------------------------------------------------------------------------------------------
# The clients' records
# --------------------------------------------------------------------------------------------


@dataclass
class RunRec:
    kind: str  # stream, wait, background, join, queued, found (on a thread, answered to nobody)
    case: Case
    thread_id: str
    run_id: str | None = None
    adopted: bool = False  # its creation's answer was lost; found by listing the thread's runs
    body: dict = field(default_factory=dict)
    received: list[tuple[int, str, Any]] | None = None  # what a client following it got
    received_at: list[float] = field(default_factory=list)  # when (test clock) each came
    connections: list[str] = field(default_factory=list)  # the streams it read, when, where
    breaks: int = 0  # times the followed stream was cut (its process killed)
    early_ends: int = 0
    answer: Any = None  # the final values /wait or /join answered
    answered: bool = False
    final: dict | None = None  # the run as it ended
    replay: list[tuple[int, str, Any]] = field(default_factory=list)  # its stream from the start


@dataclass
class ThreadRec:
    thread_id: str
    case: Case  # every run on the thread has this case (a thread of two runs: chain, same n)


@dataclass
class Activity:
    """What one client task is doing now, for the report when it outlives the settle time."""
    number: int
    kind: str = ""
    rec: RunRec | None = None
    request: str = ""
    since: float = 0.0  # test clock

    def describe(self) -> str:
        run = self.rec
        got = "" if run is None or run.received is None else (
            f"; it got {len(run.received)} events, the last at t+{run.received_at[-1]:.2f}s"
            if run.received_at else "; it got no event")
        cuts = "" if run is None else f"; {run.breaks} cuts; its connections: {'; '.join(run.connections) or 'none'}"
        return f"client {self.number} ({self.kind}) still in {self.request} since t+{self.since:.2f}s{got}{cuts}"


# Each client task's Activity (a task copies the context it is created in, so each has its own).
ACTIVITY: contextvars.ContextVar[Activity | None] = contextvars.ContextVar("activity", default=None)


def doing(ctx: Chaos, request: str, rec: RunRec | None = None) -> None:
    """Notes the request the current client task waits on (and the run it is for)."""
    activity = ACTIVITY.get()
    if activity is not None:
        activity.request, activity.since = request, ctx.t()
        if rec is not None:
            activity.rec = rec


class Failures:
    def __init__(self):
        self.items: list[tuple[str, str, str | None, str | None]] = []

    def add(self, category: str, text: str, thread_id: str | None = None, run_id: str | None = None):
        self.items.append((category, text, thread_id, run_id))

    def __len__(self):
        return len(self.items)


class Chaos:
    """Everything the test shares: the processes, the clients' records, the failures."""

    def __init__(self, seed: int, procs: list[ServerProc], t0: float):
        self.seed = seed
        self.procs = procs
        self.urls = [p.url for p in procs]
        self.t0 = t0
        self.chaos_end = t0 + CHAOS_SECONDS
        self.deadline = self.chaos_end + SETTLE_SECONDS + 60  # refreshed when the chaos ends
        self.threads: dict[str, ThreadRec] = {}
        self.runs: list[RunRec] = []
        self.failures = Failures()
        self.kills: list[tuple[float, int]] = []
        self.restarts = 0
        self.transport_errors = 0
        self.server_errors: list[str] = []
        self.uncertain_creations = 0
        self.activities: dict[int, Activity] = {}
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0),
                                      limits=httpx.Limits(max_connections=200, max_keepalive_connections=50))

    def t(self) -> float:
        return time.monotonic() - self.t0

    def order(self, rng: random.Random) -> list[str]:
        urls = list(self.urls)
        rng.shuffle(urls)
        return urls

    async def call(self, rng: random.Random, method: str, path: str, what: str, **kw) -> httpx.Response:
        """An idempotent request to whichever process answers (transport errors and 5xx: the
        next one, with a pause once every process failed), until the test's deadline."""
        attempt = 0
        while True:
            for url in self.order(rng):
                doing(self, f"{method} {path} on server {self.urls.index(url)} ({what})")
                try:
                    r = await self.http.request(method, url + path, **kw)
                except httpx.TransportError:
                    self.transport_errors += 1
                    continue
                if r.status_code >= 500:
                    self.server_errors.append(f"{method} {path} -> {r.status_code} {r.text[:200]}")
                    continue
                return r
            attempt += 1
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"{what}: no process answered {method} {path} before the deadline")
            await asyncio.sleep(min(0.2 * attempt, 2.0))

    async def json(self, rng: random.Random, method: str, path: str, what: str, ok=(200,), **kw) -> Any:
        r = await self.call(rng, method, path, what, **kw)
        if r.status_code not in ok:
            raise AssertionError(f"{what}: {method} {path} -> {r.status_code} {r.text[:300]}")
        return r.json() if r.content else None


# --------------------------------------------------------------------------------------------
# SSE
# --------------------------------------------------------------------------------------------


async def read_sse(response: httpx.Response, sink: list[tuple[int, str, Any]],
                   stamps: tuple[list[float], Any] | None = None) -> None:
    """Appends each complete frame (its blank line received) to ``sink`` as (id, event, data),
    and its arrival time to ``stamps[0]`` (clock ``stamps[1]``); comments (keepalives) are
    skipped. Raises the transport error when the body is cut."""
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while True:
            cut = buffer.find(b"\r\n\r\n")
            if cut < 0:
                break
            raw, buffer = buffer[:cut], buffer[cut + 4:]
            frame: dict[str, Any] = {}
            for line in raw.decode().split("\r\n"):
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                frame[name] = value[1:] if value.startswith(" ") else value
            if "event" not in frame and "data" not in frame:
                continue
            sink.append((int(frame["id"]) if "id" in frame else -1, frame.get("event", "message"),
                         json.loads(frame.get("data", "null"))))
            if stamps:
                stamps[0].append(stamps[1]())
    if buffer.strip():
        raise httpx.RemoteProtocolError(f"the stream ended inside a frame: {buffer[:200]!r}")


def run_id_of(response: httpx.Response) -> str | None:
    loc = response.headers.get("content-location", "")
    return loc.rstrip("/").rsplit("/", 1)[-1] if "/runs/" in loc else None


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------


async def new_thread(ctx: Chaos, rng: random.Random, case: Case) -> str:
    tid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    ctx.threads[tid] = ThreadRec(tid, case)
    await ctx.json(rng, "POST", "/threads", "create a thread",
                   json={"thread_id": tid, "if_exists": "do_nothing", "metadata": {"chaos_seed": ctx.seed}})
    return tid


def run_body(rng: random.Random, case: Case, **extra) -> dict:
    body = {"assistant_id": case.graph, "input": case.input, "stream_mode": STREAM_MODES, **extra}
    if rng.random() < 0.3:
        body["durability"] = "sync"
    return body


async def adopt(ctx: Chaos, rng: random.Random, rec: RunRec) -> bool:
    """After a creation whose answer was lost: whether the run was created after all (then
    ``rec`` takes it). The process that took the request is dead by then (or it answered 5xx),
    so whatever it committed is visible a moment later."""
    ctx.uncertain_creations += 1
    await asyncio.sleep(1.0)
    runs = await ctx.json(rng, "GET", f"/threads/{rec.thread_id}/runs?limit=100", "list the thread's runs")
    known = {r.run_id for r in ctx.runs if r.thread_id == rec.thread_id and r.run_id}
    new = [r["run_id"] for r in runs if r["run_id"] not in known]
    if len(new) > 1:
        ctx.failures.add("CLIENT", f"one lost creation left {len(new)} runs: {new}", rec.thread_id)
    if new:
        rec.run_id, rec.adopted = new[0], True
        return True
    return False


async def create(ctx: Chaos, rng: random.Random, rec: RunRec, suffix: str, respond) -> bool:
    """POST /threads/{tid}/runs{suffix}; ``respond(response)`` handles the answer once the run
    id is known (reads a stream or a wait body). True when the run exists (answered, or found
    after its answer was lost); False when it was certainly not created (the caller tries
    again, on a new thread). A refused connection tries the next process."""
    rounds = 0
    while True:
        for url in ctx.order(rng):
            try:
                return await create_on(ctx, rng, rec, url + f"/threads/{rec.thread_id}/runs{suffix}", respond)
            except httpx.ConnectError:
                ctx.transport_errors += 1  # nothing was sent: no run
        rounds += 1
        if time.monotonic() > ctx.deadline:
            raise TimeoutError(f"no process took POST runs{suffix} before the deadline")
        await asyncio.sleep(min(0.2 * rounds, 2.0))


async def create_on(ctx: Chaos, rng: random.Random, rec: RunRec, url: str, respond) -> bool:
    doing(ctx, f"POST {url}", rec)
    try:
        async with ctx.http.stream("POST", url, json=rec.body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                if r.status_code >= 500:
                    ctx.server_errors.append(f"POST {url} -> {r.status_code} {text[:200]}")
                elif not (r.status_code == 409 and rec.body.get("multitask_strategy") != "enqueue"):
                    raise AssertionError(f"POST {url} -> {r.status_code} {text[:300]}")
                # A 5xx, or a 409 on a thread that had no run: did a lost attempt create it?
                if await adopt(ctx, rng, rec):
                    ctx.runs.append(rec)
                    return True
                return False
            rec.run_id = run_id_of(r)
            if rec.run_id is None:
                raise AssertionError(f"POST {url}: no Content-Location naming the run")
            ctx.runs.append(rec)
            try:
                await respond(r)
            except httpx.TransportError:
                ctx.transport_errors += 1
                rec.breaks += 1
            return True
    except httpx.ConnectError:
        raise
    except httpx.TransportError:
        ctx.transport_errors += 1
        if rec.run_id is not None:
            rec.breaks += 1
            return True
        if await adopt(ctx, rng, rec):
            ctx.runs.append(rec)
            return True
        return False


async def follow(ctx: Chaos, rng: random.Random, rec: RunRec, resume: bool) -> None:
    """Follows the run's stream until the run ended, on any process: from where the client got
    to (``Last-Event-ID``) when ``resume``, else from the start (no header, the first time)."""
    if rec.received is None:
        rec.received = []
    while True:
        if time.monotonic() > ctx.deadline:
            ctx.failures.add("STUCK", "a client followed the run's stream until the deadline", rec.thread_id, rec.run_id)
            return
        headers = {"Accept": "text/event-stream"}
        if resume:
            headers["Last-Event-ID"] = str(rec.received[-1][0]) if rec.received else "-1"
        url = ctx.order(rng)[0]
        doing(ctx, f"GET the run's stream on server {ctx.urls.index(url)} (Last-Event-ID "
                   f"{headers.get('Last-Event-ID')})", rec)
        try:
            async with ctx.http.stream("GET", f"{url}/threads/{rec.thread_id}/runs/{rec.run_id}/stream",
                                       headers=headers) as r:
                if r.status_code >= 500:
                    ctx.server_errors.append(f"GET run stream -> {r.status_code}")
                    await asyncio.sleep(0.3)
                    continue
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    ctx.failures.add("LOST", f"joining the run's stream answered {r.status_code} {text[:200]}",
                                     rec.thread_id, rec.run_id)
                    return
                rec.connections.append(f"t+{ctx.t():.2f}s GET stream on server {ctx.urls.index(url)} "
                                       f"(Last-Event-ID {headers.get('Last-Event-ID')}), from event #{len(rec.received)}")
                await read_sse(r, rec.received, (rec.received_at, ctx.t))
        except httpx.TransportError:
            ctx.transport_errors += 1
            rec.breaks += 1
            resume = True
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            continue
        # The body ended cleanly: the run must have ended (else the stream stopped early).
        run = await ctx.json(rng, "GET", f"/threads/{rec.thread_id}/runs/{rec.run_id}", "get the run")
        if run["status"] in ("pending", "running"):
            rec.early_ends += 1
            ctx.failures.add("EARLY_END", f"a run stream ended while the run was {run['status']}",
                             rec.thread_id, rec.run_id)
            resume = True
            continue
        return


async def join_values(ctx: Chaos, rng: random.Random, rec: RunRec) -> None:
    """GET .../join on any process until it answers the final values."""
    while time.monotonic() < ctx.deadline:
        url = ctx.order(rng)[0]
        doing(ctx, f"GET the run's join on server {ctx.urls.index(url)}", rec)
        try:
            async with ctx.http.stream("GET", f"{url}/threads/{rec.thread_id}/runs/{rec.run_id}/join") as r:
                body = await r.aread()
                if r.status_code >= 500:
                    ctx.server_errors.append(f"GET join -> {r.status_code}")
                    await asyncio.sleep(0.3)
                    continue
                if r.status_code != 200:
                    ctx.failures.add("LOST", f"join answered {r.status_code} {body[:200]!r}", rec.thread_id, rec.run_id)
                    return
                rec.answer, rec.answered = json.loads(body.strip() or b"null"), True
                return
        except httpx.TransportError:
            ctx.transport_errors += 1
            rec.breaks += 1
            await asyncio.sleep(rng.uniform(0.05, 0.5))
    ctx.failures.add("STUCK", "join did not answer before the deadline", rec.thread_id, rec.run_id)


async def run_streamed(ctx: Chaos, rng: random.Random, case: Case) -> None:
    on_disconnect = rng.choice(["cancel", "continue"])
    while True:
        tid = await new_thread(ctx, rng, case)
        rec = RunRec("stream", case, tid, body=run_body(rng, case, on_disconnect=on_disconnect), received=[])

        async def respond(r, rec=rec):
            rec.connections.append(f"t+{ctx.t():.2f}s POST /runs/stream on server "
                                   f"{ctx.urls.index(str(r.url).split('/threads/')[0])}")
            await read_sse(r, rec.received, (rec.received_at, ctx.t))

        if await create(ctx, rng, rec, "/stream", respond):
            break
    if rec.breaks or rec.adopted:
        rec.breaks = max(rec.breaks, 1)
        await follow(ctx, rng, rec, resume=True)
    else:
        run = await ctx.json(rng, "GET", f"/threads/{tid}/runs/{rec.run_id}", "get the run")
        if run["status"] in ("pending", "running"):
            rec.early_ends += 1
            ctx.failures.add("EARLY_END", f"the run's stream ended while the run was {run['status']}", tid, rec.run_id)
            await follow(ctx, rng, rec, resume=True)


async def run_waited(ctx: Chaos, rng: random.Random, case: Case) -> None:
    while True:
        tid = await new_thread(ctx, rng, case)
        rec = RunRec("wait", case, tid, body=run_body(rng, case))

        async def respond(r, rec=rec):
            body = await r.aread()
            rec.answer, rec.answered = json.loads(body.strip() or b"null"), True

        if await create(ctx, rng, rec, "/wait", respond):
            break
    if not rec.answered:
        await join_values(ctx, rng, rec)


async def run_background(ctx: Chaos, rng: random.Random, case: Case, join: bool) -> None:
    while True:
        tid = await new_thread(ctx, rng, case)
        rec = RunRec("join" if join else "background", case, tid, body=run_body(rng, case))

        async def respond(r, rec=rec):
            await r.aread()

        if await create(ctx, rng, rec, "", respond):
            break
    if join:
        await follow(ctx, rng, rec, resume=False)


async def run_queued(ctx: Chaos, rng: random.Random, _case: Case) -> None:
    """Two background runs of `chain` with the same input on one thread, the second enqueued
    behind the first (so any run on the thread has the same events and final values)."""
    case = random_case(rng, "chain")
    while True:
        tid = await new_thread(ctx, rng, case)
        first = RunRec("queued", case, tid, body=run_body(rng, case))

        async def respond(r):
            await r.aread()

        if await create(ctx, rng, first, "", respond):
            break
    while True:
        second = RunRec("queued", case, tid, body=run_body(rng, case, multitask_strategy="enqueue"))
        if await create(ctx, rng, second, "", respond):
            break


KINDS = {
    "stream": (30, run_streamed),
    "wait": (20, run_waited),
    "background": (15, lambda ctx, rng, case: run_background(ctx, rng, case, join=False)),
    "join": (20, lambda ctx, rng, case: run_background(ctx, rng, case, join=True)),
    "queued": (15, run_queued),
}


async def client(ctx: Chaos, rng: random.Random, number: int) -> None:
    names = list(KINDS)
    weights = [KINDS[k][0] for k in names]
    activity = ctx.activities[number] = Activity(number)
    ACTIVITY.set(activity)
    while time.monotonic() < ctx.chaos_end:
        kind = rng.choices(names, weights)[0]
        case = random_case(rng)
        activity.kind, activity.rec = f"{kind} {case.describe()}", None
        try:
            await KINDS[kind][1](ctx, rng, case)
        except Exception as e:  # the client's own failure: reported, never hidden
            ctx.failures.add("CLIENT", f"client {number}, {kind} {case.describe()}: "
                                       f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
        await asyncio.sleep(rng.uniform(*PAUSE))


# --------------------------------------------------------------------------------------------
# Chaos
# --------------------------------------------------------------------------------------------


async def restart_later(ctx: Chaos, proc: ServerProc, delay: float) -> None:
    await asyncio.sleep(delay)
    if await proc.start():
        ctx.restarts += 1


async def monkey(ctx: Chaos, rng: random.Random, restarts: list[asyncio.Task]) -> None:
    """Kills a random process every KILL_EVERY seconds (one that is starting included) and
    starts it again DOWN_FOR seconds later, on the same port, until the chaos ends."""
    while True:
        await asyncio.sleep(rng.uniform(*KILL_EVERY))
        if time.monotonic() >= ctx.chaos_end:
            return
        proc = rng.choice(ctx.procs)
        down_for = rng.uniform(*DOWN_FOR)
        # A process still starting is killed half the time (a kill during migrations and
        # start-up is chaos too); one already down is left alone.
        if not proc.alive() or (not proc.ready and rng.random() < 0.5):
            continue
        proc.kill()
        ctx.kills.append((ctx.t(), proc.slot))
        restarts.append(asyncio.create_task(restart_later(ctx, proc, down_for)))


# --------------------------------------------------------------------------------------------
# The audit
# --------------------------------------------------------------------------------------------

TERMINAL = {"success", "error", "timeout", "interrupted"}


async def replay(ctx: Chaos, rng: random.Random, rec: RunRec) -> list[tuple[int, str, Any]]:
    """The run's stream from the start (Last-Event-ID: -1), read once the run has ended."""
    for _ in range(20):
        events: list[tuple[int, str, Any]] = []
        url = ctx.order(rng)[0]
        try:
            async with ctx.http.stream("GET", f"{url}/threads/{rec.thread_id}/runs/{rec.run_id}/stream",
                                       headers={"Last-Event-ID": "-1"}) as r:
                if r.status_code != 200:
                    raise AssertionError(f"replay -> {r.status_code} {(await r.aread())[:200]!r}")
                await read_sse(r, events)
            return events
        except httpx.TransportError:
            await asyncio.sleep(0.5)
    raise AssertionError("the replay could not be read")


def history_problems(history: list[dict], runs: list[str]) -> list[str]:
    """A thread's checkpoints (root namespace): one line from its first, no step saved twice
    (a saved step run again), every checkpoint from one of the thread's runs."""
    problems = []
    root = [s for s in history if not (s.get("checkpoint") or {}).get("checkpoint_ns")]
    steps = [s["metadata"].get("step") for s in root]
    if len(steps) != len(set(steps)):
        problems.append(f"a step was saved twice: steps {sorted(steps, key=lambda x: (x is None, x))}")
    chain = sorted(root, key=lambda s: s["metadata"].get("step", -99))
    for before, after in zip(chain, chain[1:]):
        parent = (after.get("parent_checkpoint") or {}).get("checkpoint_id")
        if parent != before["checkpoint"]["checkpoint_id"]:
            problems.append(f"checkpoint of step {after['metadata'].get('step')} does not follow the one of "
                            f"step {before['metadata'].get('step')} (a fork: a run went on from an older checkpoint)")
    strangers = {s["metadata"].get("run_id") for s in root} - set(runs)
    if strangers:
        problems.append(f"checkpoints of runs the thread does not list: {strangers}")
    return problems


async def audit(ctx: Chaos, rng: random.Random) -> None:
    # Every run on the test's threads, answered or not.
    listed: dict[str, list[dict]] = {}
    for tid in list(ctx.threads):
        r = await ctx.call(rng, "GET", f"/threads/{tid}/runs?limit=100", "list runs")
        if r.status_code == 404 and not any(rec.thread_id == tid for rec in ctx.runs):
            del ctx.threads[tid]  # its creation never got through; no run was asked of it
            continue
        assert r.status_code == 200, f"list the runs of thread {tid}: {r.status_code} {r.text[:300]}"
        listed[tid] = r.json()
    by_id = {r.run_id: r for r in ctx.runs}
    for tid, runs in listed.items():
        for run in runs:
            if run["run_id"] not in by_id:
                rec = RunRec("found", ctx.threads[tid].case, tid, run_id=run["run_id"])
                ctx.runs.append(rec)
                by_id[rec.run_id] = rec
    for rec in ctx.runs:
        if rec.run_id not in {r["run_id"] for r in listed[rec.thread_id]}:
            ctx.failures.add("LOST", f"{rec.kind} run answered to a client is not on its thread", rec.thread_id, rec.run_id)

    # Wait until every run has ended.
    pending = {r.run_id: r for r in ctx.runs if r.run_id in {x["run_id"] for x in listed[r.thread_id]}}
    while pending:
        for rec in list(pending.values()):
            r = await ctx.call(rng, "GET", f"/threads/{rec.thread_id}/runs/{rec.run_id}", "get a run")
            if r.status_code == 404:
                ctx.failures.add("LOST", f"{rec.kind} run no longer exists", rec.thread_id, rec.run_id)
                del pending[rec.run_id]
            elif r.json()["status"] in TERMINAL:
                rec.final = r.json()
                del pending[rec.run_id]
        if not pending or time.monotonic() > ctx.deadline:
            break
        await asyncio.sleep(1.0)
    for rec in pending.values():
        ctx.failures.add("STUCK", f"{rec.kind} run still not ended {SETTLE_SECONDS}s after the chaos", rec.thread_id, rec.run_id)

    # Each ended run: status, values, its log, what its clients got.
    for rec in ctx.runs:
        if rec.final is None:
            continue
        tid, rid, case = rec.thread_id, rec.run_id, rec.case
        where = f"{rec.kind} run of {case.describe()}"
        if rec.final["status"] != "success":
            ctx.failures.add("STATUS", f"{where} ended {rec.final['status']}: {rec.final.get('error_message')}", tid, rid)
        elif rec.final.get("output") != case.final:
            ctx.failures.add("VALUES", f"{where}: output {rec.final.get('output')}, expected {case.final}", tid, rid)
        if rec.answered and rec.answer != case.final:
            ctx.failures.add("VALUES", f"{where}: /wait or /join answered {rec.answer}, expected {case.final}", tid, rid)
        events = await replay(ctx, rng, rec)
        rec.replay = events
        for problem in check_log(case, events, rid):
            ctx.failures.add("LOG", f"{where}: {problem}", tid, rid)
        values = [d for _, e, d in events if e == "values"]
        if rec.final["status"] == "success" and (not values or values[-1] != case.final):
            ctx.failures.add("VALUES", f"{where}: last values of the replay {values[-1:]}, expected {case.final}", tid, rid)
        if rec.received is not None:
            got = [(i, e, ev(e, d)) for i, e, d in rec.received]
            want = [(i, e, ev(e, d)) for i, e, d in events]
            if got != want:
                # Told apart: events a client got that the log never had (ids it lacks: sent
                # live by a process killed before it logged them), and any other difference
                # (an event missed, changed, repeated or out of order).
                logged = {i for i, _, _ in want}
                unlogged = [x for x in got if x[0] not in logged]
                category = "RESUME" if rec.breaks else "STREAM"
                if unlogged and [x for x in got if x[0] in logged] == want:
                    category += "_UNLOGGED"
                    text = (f"the stream a client followed ({rec.breaks} cuts) has {len(unlogged)} events the log "
                            f"never had (so no replay has them): {unlogged}; otherwise it equals the replay "
                            f"(ids {[x[0] for x in got]} against {[x[0] for x in want]})")
                else:
                    text = f"the stream a client followed ({rec.breaks} cuts) differs from the replay: {diff(got, want)}"
                ctx.failures.add(category, f"{where}: {text}", tid, rid)

    # Threads: idle once their runs ended, with their last run's values; their history.
    for tid, trec in ctx.threads.items():
        runs = [r for r in ctx.runs if r.thread_id == tid]
        if any(r.final is None for r in runs):
            continue
        thread = await ctx.json(rng, "GET", f"/threads/{tid}", "get a thread")
        if thread["status"] != "idle":
            ctx.failures.add("THREAD", f"thread {thread['status']} although its {len(runs)} runs ended "
                                       f"({[r.final['status'] for r in runs]})", tid)
        if runs and thread.get("values") != trec.case.final:
            ctx.failures.add("THREAD", f"thread values {thread.get('values')}, expected {trec.case.final}", tid)
        if runs:
            history = await ctx.json(rng, "POST", f"/threads/{tid}/history", "thread history", json={"limit": 1000})
            for problem in history_problems(history, [r.run_id for r in runs]):
                ctx.failures.add("HISTORY", problem, tid)
        ids = [[i for i, _, _ in r.replay] for r in runs]
        flat = [i for group in ids for i in group]
        if len(flat) != len(set(flat)):
            ctx.failures.add("LOG", "two runs of the thread logged events with the same id", tid)


def diff(got: list, want: list) -> str:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return (f"first difference at position {i}: client got {a}, the replay has {b}; "
                    f"client ids {[x[0] for x in got]}, replay ids {[x[0] for x in want]}")
    if len(got) < len(want):
        return f"the client missed the replay's last {len(want) - len(got)} events, from {want[len(got)]}"
    return f"the client got {len(got) - len(want)} events the replay lacks, from {got[len(want)]}"


# --------------------------------------------------------------------------------------------
# The test
# --------------------------------------------------------------------------------------------


@pytest.fixture
def chaos_database():
    """A fresh PostgreSQL database, dropped afterwards; skipped (or failed, with
    SPINDLE_TEST_REQUIRE_POSTGRES=1) without SPINDLE_TEST_POSTGRES_URL, as the suite does."""
    if not harness.POSTGRES_URL:
        if os.environ.get("SPINDLE_TEST_REQUIRE_POSTGRES") == "1":
            pytest.fail("SPINDLE_TEST_REQUIRE_POSTGRES=1 but SPINDLE_TEST_POSTGRES_URL is not set")
        pytest.skip(harness.POSTGRES_SKIP_REASON)
    dbname = harness.create_database()
    try:
        yield harness.pg_url_with_db(harness.POSTGRES_URL, dbname)
    finally:
        harness.drop_database(dbname)


async def calm_check(ctx: Chaos, rng: random.Random) -> None:
    """One streamed run of each graph before the chaos: the replay must be the case's events
    exactly (a fanout's parallel updates in any order), so the model check_log uses is the
    server's when nothing fails."""
    for graph in ("chain", "slow", "fanout"):
        case = random_case(rng, graph)
        tid = await new_thread(ctx, rng, case)
        rec = RunRec("stream", case, tid, body={"assistant_id": graph, "input": case.input,
                                                "stream_mode": STREAM_MODES}, received=[])

        async def respond(r, rec=rec):
            await read_sse(r, rec.received)

        assert await create(ctx, rng, rec, "/stream", respond), "no run in calm conditions"
        assert not rec.breaks, "a stream was cut with no process killed"
        events = await replay(ctx, rng, rec)
        got = [ev(e, d) for _, e, d in events if e != "metadata"]
        want = [p for group in case.groups for p in group]
        same = got == want or (graph == "fanout" and len(got) == len(want) and got[0] == want[0]
                               and got[-1] == want[-1] and sorted(got) == sorted(want))
        assert same, f"the test's model of {graph} differs from a calm run:\n got  {got}\n want {want}"
        assert [(i, e, d) for i, e, d in rec.received] == events, "a calm stream differs from its replay"
        assert not check_log(case, events, rec.run_id), check_log(case, events, rec.run_id)


def summary(ctx: Chaos, elapsed: dict[str, float]) -> str:
    by_kind: dict[str, Counter] = defaultdict(Counter)
    for rec in ctx.runs:
        by_kind[rec.kind][rec.final["status"] if rec.final else "not ended"] += 1
    resumed_runs = sum(1 for r in ctx.runs if sum(e == "metadata" for _, e, _ in r.replay) > 1)
    followed = [r for r in ctx.runs if r.received is not None]
    lines = [
        f"chaos seed {ctx.seed} (replay: SPINDLE_CHAOS_SEED={ctx.seed}); chaos {elapsed['chaos']:.0f}s, "
        f"settle {elapsed['settle']:.0f}s, audit {elapsed['audit']:.0f}s",
        f"runs: {len(ctx.runs)} on {len(ctx.threads)} threads; "
        + "; ".join(f"{k}: {dict(v)}" for k, v in sorted(by_kind.items())),
        f"kills: {len(ctx.kills)} (per server {dict(Counter(s for _, s in ctx.kills))}), restarts: {ctx.restarts}",
        f"runs resumed by another attempt: {resumed_runs}; streams followed: {len(followed)}, "
        f"cut and resumed: {sum(1 for r in followed if r.breaks)} ({sum(r.breaks for r in followed)} cuts)",
        f"creations whose answer was lost: {ctx.uncertain_creations} "
        f"(adopted: {sum(1 for r in ctx.runs if r.adopted)}); transport errors seen: {ctx.transport_errors}; "
        f"5xx answers: {len(ctx.server_errors)}",
    ]
    return "\n".join(lines)


def failure_report(ctx: Chaos, summary_text: str) -> str:
    out = [f"{len(ctx.failures)} failures (seed {ctx.seed}):"]
    counts = Counter(c for c, _, _, _ in ctx.failures.items)
    out.append("by category: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    for category, text, tid, rid in ctx.failures.items[:40]:
        out.append(f"- [{category}] thread {tid} run {rid}: {text}")
    if len(ctx.failures) > 40:
        out.append(f"... and {len(ctx.failures) - 40} more")
    # The replays (and what the client got) of the first runs a check failed for.
    by_id = {r.run_id: r for r in ctx.runs}
    shown_runs = []
    for category, _, _, rid in ctx.failures.items:
        rec = by_id.get(rid)
        if rec is None or rid in shown_runs or len(shown_runs) >= 6 or not rec.replay:
            continue
        shown_runs.append(rid)
        out.append(f"replay of run {rid} ({rec.kind}, {rec.case.describe()}, "
                   f"{rec.breaks} cuts of its client's stream):")
        out.extend(f"    {i} {e} {json.dumps(d, sort_keys=True)}" for i, e, d in rec.replay)
        if rec.received is not None and category.startswith(("RESUME", "STREAM")):
            out.append("  the client's connections: " + "; ".join(rec.connections))
            out.append("  what the client got (and when):")
            stamps = rec.received_at + [None] * (len(rec.received) - len(rec.received_at))
            out.extend(f"    {i} {e} {json.dumps(d, sort_keys=True)}" + (f"  (t+{at:.2f}s)" if at else "")
                       for (i, e, d), at in zip(rec.received, stamps))
            if rec.received_at:
                lo, hi = rec.received_at[0] - 1, rec.received_at[-1] + 1
                near = [f"server {slot} at t+{t:.2f}s" for t, slot in ctx.kills if lo <= t <= hi]
                out.append(f"  kills meanwhile: {near}")
    # Server log lines naming the first failing runs.
    shown = 0
    for _, _, tid, rid in ctx.failures.items:
        if shown >= 4 or not (tid or rid):
            continue
        shown += 1
        for proc in ctx.procs:
            lines = proc.lines_naming(*(x for x in (rid, tid) if x))
            if lines:
                out.append(f"server {proc.slot} log lines naming thread {tid} / run {rid}:")
                out.extend("    " + line for line in lines)
    out.append(summary_text)
    return "\n".join(out)


async def db_diagnostics(db_url: str, run_ids: list[str]) -> str:
    """The stuck runs' rows (attempt, lease), read straight from the database."""
    if not run_ids:
        return ""
    try:
        import psycopg

        with psycopg.connect(db_url, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT run_id, thread_id, status, attempt, lease_owner, lease_expires_at, updated_at "
                "FROM runs WHERE run_id = ANY(%s::uuid[])", (run_ids[:20],)).fetchall()
        return "stuck runs in the database:\n" + "\n".join(f"    {row}" for row in rows)
    except Exception as e:  # diagnostics only; the schema may have moved on
        return f"(could not read the runs' rows: {e})"


async def test_chaos(chaos_database, capsys, request):
    """Issue 29: see the module's docstring."""
    seed = int(os.environ.get("SPINDLE_CHAOS_SEED") or random.SystemRandom().randrange(1, 2**31))

    def say(text: str) -> None:  # shown even when pytest captures output (CI)
        with capsys.disabled():
            print(text, flush=True)

    say(f"\nchaos seed {seed} (replay with SPINDLE_CHAOS_SEED={seed})")
    master = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="spindle-e2e-chaos-"))
    t0 = time.monotonic()
    ports = set()
    while len(ports) < PROCESSES:
        ports.add(harness.free_port())
    procs = [ServerProc(i, port, chaos_database, workdir, t0) for i, port in enumerate(sorted(ports))]
    # Also when the loop is torn down mid-test (an interrupt), before the database is dropped.
    request.addfinalizer(lambda: [p.stop() for p in procs])
    ctx = Chaos(seed, procs, t0)
    failed = True
    restarts: list[asyncio.Task] = []
    tasks: list[asyncio.Task] = []
    summary_text = ""
    try:
        # One first, so the migrations run once, then the others.
        await procs[0].start()
        await asyncio.gather(*(p.start() for p in procs[1:]))
        await calm_check(ctx, random.Random(master.getrandbits(64)))
        ctx.runs.clear()
        ctx.threads.clear()

        t_chaos = time.monotonic()
        ctx.chaos_end = t_chaos + CHAOS_SECONDS
        ctx.deadline = ctx.chaos_end + SETTLE_SECONDS + 120
        monkey_rng = random.Random(master.getrandbits(64))
        tasks = [asyncio.create_task(client(ctx, random.Random(master.getrandbits(64)), i)) for i in range(CLIENTS)]
        await monkey(ctx, monkey_rng, restarts)
        # The chaos is over: every process up again (the pending restarts, and any left down).
        await asyncio.gather(*restarts, return_exceptions=True)
        for p in procs:
            if not (p.alive() and p.ready):
                p.kill("left down at the chaos' end")
                if not await p.start():
                    raise RuntimeError(f"server {p.slot} was killed while starting after the chaos")
        t_up = time.monotonic()
        ctx.deadline = t_up + SETTLE_SECONDS
        say(f"chaos over after {t_up - t_chaos:.0f}s: {len(ctx.kills)} kills; every process is up")
        done, late = await asyncio.wait(tasks, timeout=max(1.0, ctx.deadline - time.monotonic()))
        for number, task in enumerate(tasks):
            if task in late:
                task.cancel()
                activity = ctx.activities[number]
                rec = activity.rec
                ctx.failures.add("STUCK", f"the settle time ran out: {activity.describe()}",
                                 rec.thread_id if rec else None, rec.run_id if rec else None)
        t_settled = time.monotonic()
        await audit(ctx, random.Random(master.getrandbits(64)))
        t_audited = time.monotonic()
        summary_text = summary(ctx, {"chaos": t_up - t_chaos, "settle": t_settled - t_up, "audit": t_audited - t_settled})
        say(summary_text)
        stuck = [rid for c, _, _, rid in ctx.failures.items if c == "STUCK" and rid]
        if ctx.failures:
            report = failure_report(ctx, summary_text)
            report += "\n" + await db_diagnostics(chaos_database, stuck)
            (workdir / "failures.txt").write_text(report)
            tails = "\n".join(f"--- server {p.slot} log tail ({p.log_path}) ---\n{p.tail(3000)}" for p in procs)
            pytest.fail(f"{report}\n{tails}\n(logs kept in {workdir})", pytrace=False)
        # The chaos must have been chaos: runs resumed after kills, streams cut and resumed.
        resumed_runs = sum(1 for r in ctx.runs if sum(e == "metadata" for _, e, _ in r.replay) > 1)
        cut = sum(1 for r in ctx.runs if r.received is not None and r.breaks)
        assert len(ctx.kills) >= CHAOS_SECONDS / KILL_EVERY[1] / 2, f"too few kills\n{summary_text}"
        if CHAOS_SECONDS >= 100:  # (150 s: some 20 runs resumed and 30 streams cut)
            assert resumed_runs >= 5 and cut >= 3, f"the kills hit too few runs to mean anything\n{summary_text}"
        failed = False
    finally:
        for task in tasks:
            task.cancel()
        for task in restarts:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, *restarts, return_exceptions=True)
        for p in procs:
            p.stop()
        await ctx.http.aclose()
        if failed:
            say(f"chaos: logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
