"""Starting, watching and stopping the servers under test.

Each server runs in its own session (process group), so that stopping it also stops whatever it
spawned, and its memory is the sum over that group: `langgraph dev` is a Python process that may
start others, Spindle is one process (or several on one database: `ServerGroup`). PostgreSQL's
own CPU time is read from /proc too (`postgres_cpu`), since a server on PostgreSQL hands part of
its work to it.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process (group) under test, with its log file and base URL."""

    def __init__(self, name: str, argv: list, cwd: Path, port: int, env: dict | None = None,
                 ready_path: str = "/ok"):
        self.name = name
        self.argv = argv
        self.cwd = Path(cwd)
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **(env or {})}
        self.ready_path = ready_path
        self.log_path = self.cwd / f"{name}.log"
        self.proc = None
        # The PostgreSQL database it serves, if any: its backends are told apart by this name.
        self.database = None
        # Run once the process is gone (e.g. dropping the server's database).
        self.after_stop = []

    @property
    def urls(self) -> list:
        """The base URLs the load is spread over: one here, one per process in a ServerGroup."""
        return [self.url]

    def start(self, ready_timeout: float) -> float:
        """Starts the server and waits for GET `ready_path` to answer 200; returns the seconds that took."""
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self._wait_ready(ready_timeout)
        return time.monotonic() - started

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} was not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def pids(self) -> list:
        """Every live process of the server: its group (the group id is the leader's pid) and
        their descendants in groups of their own (Spindle's Python workers)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        parents = {}
        ours = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                stat = _read_stat(entry)
                if stat:
                    parents[int(entry)] = int(stat[1])  # field 4: ppid
                    if int(stat[2]) == self.proc.pid:  # field 5: pgrp
                        ours.add(int(entry))
        grown = True
        while grown:
            children = {pid for pid, ppid in parents.items() if ppid in ours} - ours
            ours |= children
            grown = bool(children)
        return sorted(ours)

    def memory_mb(self) -> dict:
        """Resident memory now (VmRSS) and at its peak (VmHWM), summed over the group, in MB."""
        return _memory_mb(self.pids())

    def cpu_seconds(self) -> float:
        """User + system CPU time the group's live processes used so far."""
        return _cpu_seconds(self.pids())

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the group, then SIGKILL if it has not exited after `grace` seconds.

        Safe to call twice, and on a server that never started."""
        if self.proc is not None and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        while self.after_stop:
            self.after_stop.pop()()


class ServerGroup:
    """Several processes of one server on one database, measured as one server.

    The first is started alone and the others once it is ready, so that they find its database
    migrated rather than racing to migrate it. The load generators spread their clients over
    `urls`; memory and CPU are summed over every process of every member.
    """

    def __init__(self, members: list):
        self.members = members
        self.name = members[0].name
        self.database = members[0].database
        self.after_stop = []

    @property
    def urls(self) -> list:
        return [m.url for m in self.members]

    @property
    def url(self) -> str:
        """For the log: every member's URL."""
        return ", ".join(self.urls)

    def start(self, ready_timeout: float) -> float:
        started = time.monotonic()
        for member in self.members:
            member.start(ready_timeout)
        return time.monotonic() - started

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(f"[{m.url}]\n{m.log_tail(lines)}" for m in self.members)

    def pids(self) -> list:
        return sorted({pid for m in self.members for pid in m.pids()})

    def memory_mb(self) -> dict:
        return _memory_mb(self.pids())

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.pids())

    def stop(self, grace: float = 15.0) -> None:
        """Stops every member (each also when another fails to), then runs `after_stop`."""
        try:
            for member in self.members:
                try:
                    member.stop(grace)
                except Exception as err:  # noqa: BLE001 - the others must stop all the same
                    print(f"!! stopping {member.name} at {member.url}: {err}", file=sys.stderr, flush=True)
        finally:
            while self.after_stop:
                self.after_stop.pop()()


def _memory_mb(pids: list) -> dict:
    total = {"rss_mb": 0.0, "peak_mb": 0.0}
    for pid in pids:
        status = _read_status(pid)
        total["rss_mb"] += status.get("VmRSS", 0) / 1024
        total["peak_mb"] += status.get("VmHWM", 0) / 1024
    return total


def _cpu_seconds(pids: list) -> float:
    ticks = 0
    for pid in pids:
        stat = _read_stat(str(pid))
        if stat:
            ticks += int(stat[11]) + int(stat[12])  # fields 14, 15: utime, stime
    return ticks / CLK_TCK


# A backend's title: "postgres: [cluster: ]user database host(port) state" (or "[local]").
_BACKEND_TITLE = re.compile(r"^postgres: (?:\S+: )?\S+ (\S+) (?:\S+\(\d+\)|\[local\])")


def postgres_cpu() -> dict | None:
    """User + system CPU seconds used so far by the PostgreSQL server running on this machine.

    `total` is every process whose command is `postgres` (postmaster, backends, checkpointer,
    WAL writer, ...) plus the postmaster's reaped children (cutime/cstime), so that a backend
    whose connection closed during the window still counts. `backends` maps each live backend's
    pid to (its database, its seconds), so that a caller can tell its own load from another
    database's (someone else's tests on the same server). None when no PostgreSQL runs here
    (a remote one cannot be measured).
    """
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _read_comm(entry) == "postgres":
            stat = _read_stat(entry)
            if stat:
                stats[int(entry)] = stat
    if not stats:
        return None
    total, backends = 0.0, {}
    for pid, stat in stats.items():
        seconds = (int(stat[11]) + int(stat[12])) / CLK_TCK  # fields 14, 15: utime, stime
        if int(stat[1]) not in stats:  # the postmaster: add its reaped children's time
            seconds += (int(stat[13]) + int(stat[14])) / CLK_TCK  # fields 16, 17: cutime, cstime
        total += seconds
        backend = _BACKEND_TITLE.match(_read_cmdline(pid))
        if backend:
            backends[pid] = (backend[1], seconds)
    return {"total": total, "backends": backends}


def thread_cpu_seconds(pid: int, name: str) -> float:
    """User + system CPU time of the process's thread called `name` (0 when it has none)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
        except OSError:
            continue
        stat = _read_stat(f"{pid}/task/{task.name}")
        if comm == name and stat:
            return (int(stat[11]) + int(stat[12])) / CLK_TCK
    return 0.0


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _read_stat(pid: str) -> list | None:
    """/proc/<pid>/stat fields after the command name (which may hold spaces), or None if gone.

    Index 0 is field 3 (state), so field N is at index N - 3.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()


def _read_comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _read_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _read_status(pid: int) -> dict:
    """The kB figures of /proc/<pid>/status."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def spindle_server(binary: Path, cwd: Path, database_url: str | None,
                   python_project: tuple | None = None) -> Server:
    """`spindle dev` on a fresh data dir (SQLite), or `spindle serve` on the given database.

    It runs in an empty folder so that it finds no config file and serves its example graphs
    (`serve` with `--examples`);
    with `python_project` (the reference's project folder, the Python interpreter of the workers
    and their number) it serves that project's Python graphs through its workers instead, from
    a copy of the folder.
    """
    port = free_port()
    cwd.mkdir(parents=True)
    common = ["--host", "127.0.0.1", "--port", str(port)]
    if python_project:
        project, python, workers = python_project
        copy = cwd / "project"
        shutil.copytree(project, copy, ignore=shutil.ignore_patterns(".langgraph_api", "__pycache__"))
        common += ["--config", str(copy / "langgraph.json"), "--python", str(python)]
        if workers:
            common += ["--python-workers", str(workers)]
    if database_url:
        # Without a Python project, the example graphs, which `serve` serves only when asked to.
        examples = [] if python_project else ["--examples"]
        argv = [str(binary), "serve", *common, "--database-url", database_url, *examples]
    else:
        argv = [str(binary), "dev", *common, "--data-dir", str(cwd / "data")]
    return Server("spindle", argv, cwd, port)


def reference_server(venv: Path, graphs_dir: Path, cwd: Path) -> Server:
    """`langgraph dev` (in-memory runtime) serving the Python twins, from a copy of their folder.

    The copy keeps the run's state (`.langgraph_api/`) out of the checkout and fresh each time.
    """
    port = free_port()
    shutil.copytree(graphs_dir, cwd, ignore=shutil.ignore_patterns(".langgraph_api", "__pycache__"))
    argv = [str(venv / "bin" / "langgraph"), "dev", "--no-browser", "--no-reload",
            "--host", "127.0.0.1", "--port", str(port)]
    # No telemetry or tracing: the machine has no internet, and a benchmark should not wait on it.
    env = {"LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false",
           "LANGCHAIN_TRACING_V2": "false"}
    return Server("reference", argv, cwd, port, env)


def aegra_server(venv: Path, graphs_dir: Path, cwd: Path, database_url: str) -> Server:
    """Aegra (aegra-api, in its own venv) serving the Python twins on the given database.

    Started as its `aegra serve` does: uvicorn on `aegra_api.main:app`, one process, with
    AEGRA_CONFIG naming the config; the twins' langgraph.json is read as it is (Aegra accepts
    that format and makes an assistant named after each graph). Aegra migrates its database at
    start-up and is ready when GET /ready answers (it has no /ok). Its other settings keep their
    defaults; it needs no LLM key or Redis to start.
    """
    port = free_port()
    shutil.copytree(graphs_dir, cwd, ignore=shutil.ignore_patterns(".langgraph_api", "__pycache__"))
    argv = [str(venv / "bin" / "python"), "-m", "uvicorn", "aegra_api.main:app",
            "--host", "127.0.0.1", "--port", str(port)]
    env = {"AEGRA_CONFIG": str(cwd / "langgraph.json"), "DATABASE_URL": database_url,
           # No tracing or telemetry: the machine has no internet.
           "OTEL_TARGETS": "", "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false"}
    return Server("aegra", argv, cwd, port, env, ready_path="/ready")


class PostgresDatabase:
    """A database created for one server of the benchmark and dropped after it, through `psql`."""

    def __init__(self, admin_url: str, suffix: str):
        self.admin_url = admin_url
        self.name = f"spindle_bench_{os.getpid()}_{int(time.time())}_{suffix}"

    @property
    def url(self) -> str:
        """The new database's URL: the admin URL with the database's name swapped in."""
        base, _, _ = self.admin_url.rpartition("/")
        return f"{base}/{self.name}"

    def create(self) -> str:
        self._psql(f'CREATE DATABASE "{self.name}"')
        return self.url

    def drop(self) -> None:
        self._psql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def _psql(self, sql: str) -> None:
        if not shutil.which("psql"):
            raise RuntimeError("--backend postgres needs `psql` to create the database")
        subprocess.run(["psql", self.admin_url, "-v", "ON_ERROR_STOP=1", "-qc", sql],
                       check=True, stdout=subprocess.DEVNULL)


def make_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="spindle-bench-"))
