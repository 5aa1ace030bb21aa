"""The benchmark: Spindle, the reference server and Aegra under the same load, side by side.

Run it through `bench/run`, which prepares bench/.venv first. It builds the release binaries,
starts `spindle dev` (or one or more `spindle serve` on PostgreSQL), `langgraph dev` serving the
Python twins in bench/reference and, on PostgreSQL, Aegra serving the same twins from a venv of
its own (bench/.venv-aegra), drives each in turn with the native load generator and the official
Python client, and writes the table to bench/RESULTS.md. Every server is stopped at the end,
also on Ctrl-C or failure.
"""
import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import report
import servers

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# Aegra's venv: its dependencies (FastAPI, psycopg, ...) are not the reference server's.
AEGRA_VENV = BENCH / ".venv-aegra"
# Processes that mean someone else is compiling on the machine while we measure.
COMPILERS = {"rustc", "cargo", "cc1", "cc1plus", "ld", "ld.lld", "clang"}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell [5]")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring [1]")
    p.add_argument("--clients", default="1,16,64", help="concurrent clients, comma-separated [1,16,64]")
    p.add_argument("--repeat", type=int, default=3, help="repetitions for Spindle; medians are reported [3]")
    p.add_argument("--scenarios", default="wait,stream", help="wait, stream or both [wait,stream]")
    p.add_argument("--ref-duration", type=float,
                   help="seconds measured per cell of the reference and Aegra [--duration]")
    p.add_argument("--ref-warmup", type=float, default=2.0,
                   help="warm-up for the reference and Aegra, whose runs take up to a second [2]")
    p.add_argument("--ref-clients", help="client counts for the reference and Aegra [--clients]")
    p.add_argument("--ref-repeat", type=int, default=1, help="repetitions for the reference and Aegra [1]")
    p.add_argument("--skip-reference", action="store_true", help="do not measure the reference")
    aegra = p.add_mutually_exclusive_group()
    aegra.add_argument("--aegra", action="store_true", default=None,
                       help="also measure Aegra, on a database of its own on --postgres-url, with the "
                            "--ref-* settings [on with --backend postgres]")
    aegra.add_argument("--skip-aegra", dest="aegra", action="store_false", help="do not measure Aegra")
    p.add_argument("--skip-python", action="store_true", help="only the native load generator")
    p.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--postgres-url", default="postgres://postgres@127.0.0.1:5432/postgres",
                   help="a PostgreSQL database to create the benchmark's fresh databases from")
    p.add_argument("--processes", type=int, default=1,
                   help="`spindle serve` processes on the one database, each on its port, the clients "
                        "spread over them (--backend postgres only) [1]")
    p.add_argument("--no-build", action="store_true",
                   help="build nothing: use --spindle-bin and --loadgen-bin as they are")
    p.add_argument("--spindle-bin", type=Path, help="the spindle binary [target/release/spindle]")
    p.add_argument("--loadgen-bin", type=Path, help="the load generator [target/release/spindle-loadgen]")
    p.add_argument("--graphs", choices=["files", "python"], default="files",
                   help="what Spindle runs: its graph files (Rust engine), or the reference's Python "
                        "twins through its Python workers [files]")
    p.add_argument("--python-workers", type=int,
                   help="Spindle's Python workers with --graphs python [Spindle's default]")
    p.add_argument("--input", default='{"n": 1}', help="input of each `chain` run, as JSON")
    p.add_argument("--expect", default='{"n": 4}', help="what a waited-on run must answer, as JSON")
    p.add_argument("--output", type=Path, default=BENCH / "RESULTS.md", help="[bench/RESULTS.md]")
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error("--processes must be at least 1")
    if args.processes > 1 and args.backend != "postgres":
        p.error(f"--processes {args.processes} needs --backend postgres: processes of `spindle dev` "
                "cannot share one SQLite database, so Spindle runs as one process on SQLite")
    if args.aegra is None:
        args.aegra = args.backend == "postgres"
    args.clients = [int(c) for c in args.clients.split(",")]
    args.ref_clients = [int(c) for c in args.ref_clients.split(",")] if args.ref_clients else args.clients
    args.ref_duration = args.ref_duration or args.duration
    args.scenarios = args.scenarios.split(",")
    args.spindle_bin = args.spindle_bin or ROOT / "target/release/spindle"
    args.loadgen_bin = args.loadgen_bin or ROOT / "target/release/spindle-loadgen"
    return args


@dataclasses.dataclass
class Plan:
    """How one server is measured."""
    kind: str  # "spindle", "reference" or "aegra"
    repeat: int
    clients: list
    duration: float
    warmup: float


def plans(args) -> list:
    """Spindle with its own settings; the two Python servers, whose runs take a hundred times
    longer, with the --ref-* ones (one repetition after a longer warm-up by default)."""
    out = [Plan("spindle", args.repeat, args.clients, args.duration, args.warmup)]
    slow = [kind for kind, on in (("reference", not args.skip_reference), ("aegra", args.aegra)) if on]
    out += [Plan(kind, args.ref_repeat, args.ref_clients, args.ref_duration, args.ref_warmup) for kind in slow]
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(args) -> None:
    """The release binaries; on a shared checkout this waits for cargo's lock, which is expected."""
    packages = []
    if args.spindle_bin == ROOT / "target/release/spindle":
        packages += ["-p", "spindle"]
    if args.loadgen_bin == ROOT / "target/release/spindle-loadgen":
        packages += ["-p", "spindle-loadgen"]
    if not packages:
        return
    log(f"==> cargo build --release --locked {' '.join(packages)}")
    subprocess.run(["cargo", "build", "--release", "--locked", *packages], cwd=ROOT, check=True)


def loader_argv(args, client: str) -> list:
    if client == "native":
        return [str(args.loadgen_bin)]
    return [sys.executable, str(BENCH / "pyload.py")]


def compiling_now() -> bool:
    """Whether a compiler is running: our build is over, so it is someone else's. A stopped
    one (SIGSTOP, state T) takes no CPU and does not count."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            # "pid (comm) state ...": comm may hold spaces and parentheses.
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            state = stat[stat.rindex(")") + 2 :][:1]
            if comm in COMPILERS and state not in ("T", "t"):
                return True
    return False


def ensure_venv(venv: Path, requirements: Path) -> None:
    """Makes `venv` hold `requirements`, as bench/run does for bench/.venv: created the first
    time, installed again only when the file changed since (a copy of it is kept as a stamp)."""
    stamp = venv / ".installed-requirements.txt"
    if stamp.exists() and stamp.read_bytes() == requirements.read_bytes():
        return
    log(f"==> preparing {venv} (pip install -r {requirements.relative_to(ROOT)})")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "-r", str(requirements)], check=True)
    shutil.copyfile(requirements, stamp)


def children_cpu() -> float:
    """CPU seconds used by our finished children: the load generators (servers are still running)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_sample(server) -> dict:
    """The CPU seconds the server (all its processes) and the local PostgreSQL used so far."""
    return {"at": time.monotonic(), "server": server.cpu_seconds(), "postgres": servers.postgres_cpu()}


def cpu_use(server, before: dict, after: dict) -> dict:
    """CPU between two samples, in % of one core: the server's; PostgreSQL's, when the server
    keeps its data there (None otherwise, or when PostgreSQL is not on this machine); and the
    part of it spent by live backends of other databases, which is someone else's load."""
    span = after["at"] - before["at"]
    out = {"cpu_pct": 100 * (after["server"] - before["server"]) / span,
           "pg_cpu_pct": None, "pg_other_cpu_pct": None}
    pg0, pg1 = before["postgres"], after["postgres"]
    if server.database and pg0 and pg1:
        out["pg_cpu_pct"] = 100 * (pg1["total"] - pg0["total"]) / span
        other = sum(seconds - pg0["backends"].get(pid, (db, 0))[1]
                    for pid, (db, seconds) in pg1["backends"].items() if db != server.database)
        out["pg_other_cpu_pct"] = 100 * other / span
    return out


def run_loader(cmd: list, server, warmup: float, duration: float) -> tuple:
    """Runs a load generator to its end and samples CPU while it runs, when its measured window
    opens and closes; returns (exit code, stdout, stderr, CPU use over the window or None).

    The window is reckoned from the loader's start; its own start-up (Python's imports) delays
    its window by well under the warm-up, so the samples still fall while the load is on.
    """
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples, output = [], None
    try:
        for at in (started + warmup, started + warmup + duration):
            try:
                output = proc.communicate(timeout=max(at - time.monotonic(), 0))
                break  # it ended before its window did: it failed
            except subprocess.TimeoutExpired:
                samples.append(cpu_sample(server))
        if output is None:
            output = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    use = cpu_use(server, *samples) if len(samples) == 2 else None
    return proc.returncode, output[0], output[1], use


def measure_cell(args, server, scenario, client, clients, duration, warmup) -> dict:
    """One load run against one server; the loader's JSON plus the server's CPU and memory,
    and PostgreSQL's CPU when the server uses it."""
    cmd = [*loader_argv(args, client), "--url", ",".join(server.urls), "--scenario", scenario,
           "--clients", str(clients), "--duration", str(duration), "--warmup", str(warmup),
           "--input", args.input, "--expect", args.expect]
    busy = compiling_now()
    started, client_before = time.monotonic(), children_cpu()
    code, stdout, stderr, use = run_loader(cmd, server, warmup, duration)
    wall, client_cpu = time.monotonic() - started, children_cpu() - client_before
    if code != 0 or use is None:
        raise RuntimeError(f"load generator failed ({code}): {shlex.join(cmd)}\n{stderr}")
    return {
        "server": server.name, "processes": len(server.urls), "scenario": scenario, "client": client,
        "clients": clients, "report": json.loads(stdout.strip().splitlines()[-1]),
        **use, "client_cpu_pct": 100 * client_cpu / wall, **server.memory_mb(),
        "machine_compiling": busy or compiling_now(), "loadavg_1m": os.getloadavg()[0],
    }


def describe(m: dict) -> str:
    r = m["report"]
    lat = r["latency_ms"] or {}
    fe = r["first_event_ms"]
    first = f" first-event p50 {fe['p50']:.2f} p99 {fe['p99']:.2f}" if fe else ""
    pg = f" postgres {m['pg_cpu_pct']:.0f}%" if m["pg_cpu_pct"] is not None else ""
    return (f"{m['server']:9} {m['scenario']:6} {m['client']:6} c={m['clients']:<3} "
            f"{r['runs_per_s']:9.1f} runs/s p50 {lat.get('p50', 0):.2f} p99 {lat.get('p99', 0):.2f} ms"
            f"{first} errors {r['errors']} cpu {m['cpu_pct']:.0f}%{pg} (client {m['client_cpu_pct']:.0f}%) "
            f"rss {m['rss_mb']:.0f} MB")


def cells(args, clients_list) -> list:
    clients_kinds = ["native"] if args.skip_python else ["native", "python"]
    return [(s, c, n) for s in args.scenarios for c in clients_kinds for n in clients_list]


def measure_server(args, server, plan: Plan, rep: int) -> list:
    """Every cell once, in the order of the table."""
    out = []
    for scenario, client, clients in cells(args, plan.clients):
        m = measure_cell(args, server, scenario, client, clients, plan.duration, plan.warmup)
        m["rep"] = rep
        log(f"[{rep + 1}/{plan.repeat}] {describe(m)}")
        out.append(m)
    return out


def _run(*cmd) -> str:
    """A command's output in the checkout, or "?" when it cannot run."""
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def base_facts(spindle_bin) -> dict:
    """The date, the machine and the Spindle measured: the start of every results file."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
    dirty = " (plus uncommitted changes in the working tree)" if _run("git", "status", "--porcelain") else ""
    return {
        "Date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "Machine": f"{os.cpu_count()} CPUs (nproc {_run('nproc')}), {cpu}, {mem_kb / 1048576:.1f} GiB RAM, "
                   f"Linux {platform.release()}",
        "Spindle": f"commit {_run('git', 'rev-parse', '--short', 'HEAD')}{dirty}, binary {spindle_bin}",
    }


def machine_facts(args) -> dict:
    return {
        **base_facts(args.spindle_bin),
        "Backend": "SQLite (`spindle dev`)" if args.backend == "sqlite" else
                   f"PostgreSQL (`spindle serve`, {_processes(args.processes)} on one database)",
        "Graphs": ("Spindle runs its graph files (`chain`) on its Rust engine" if args.graphs == "files" else
                   "Spindle runs the reference's own Python `chain` (bench/reference) through its Python "
                   f"workers ({args.python_workers or 'default number of'} worker(s)), in bench/.venv"),
        "Reference": ("skipped" if args.skip_reference else
                      f"`langgraph dev` (langgraph-api {_version('langgraph-api')}, "
                      f"langgraph-runtime-inmem {_version('langgraph-runtime-inmem')}, in-memory, "
                      "default settings) serving bench/reference"),
        "Aegra": (f"aegra-api {_venv_version(AEGRA_VENV, 'aegra-api')} (langgraph "
                  f"{_venv_version(AEGRA_VENV, 'langgraph')}, uvicorn {_venv_version(AEGRA_VENV, 'uvicorn')}, "
                  "one process, default settings) serving bench/reference on a PostgreSQL database of its "
                  "own, from bench/.venv-aegra" if args.aegra else "skipped"),
        "Clients": f"spindle-loadgen (Rust, one tokio thread), langgraph-sdk {_version('langgraph-sdk')} "
                   f"(Python {platform.python_version()}, asyncio)",
        "Toolchain": _run("rustc", "-V"),
    }


def _processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _venv_version(venv: Path, dist: str) -> str:
    """A distribution's version in another venv (Aegra's), asked of that venv's Python."""
    done = subprocess.run([str(venv / "bin" / "python"), "-c",
                           f"import importlib.metadata as m; print(m.version({dist!r}))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def graph_baseline() -> dict:
    """The graph's own cost per run, measured alone in this venv (see graph_baseline.py)."""
    log("==> the graph's own cost (bench/graph_baseline.py)")
    done = subprocess.run([sys.executable, str(BENCH / "graph_baseline.py")],
                          capture_output=True, text=True, check=True, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    log(f"    {result['cpu_ms_per_run']:.2f} ms of CPU, {result['wall_ms_per_run']:.2f} ms per run")
    return result


def notes(args, raw: list, memory: dict) -> list:
    out = [f"Spindle: {args.repeat} repetition(s) of {args.duration:g} s per cell after {args.warmup:g} s "
           "of warm-up."]
    slow = " and ".join("the reference" if p.kind == "reference" else report.SERVERS[p.kind]
                        for p in plans(args)[1:])
    slow = slow[:1].upper() + slow[1:]
    if slow:
        out.append(f"{slow}: {args.ref_repeat} repetition(s) of {args.ref_duration:g} s per cell after "
                   f"{args.ref_warmup:g} s of warm-up.")
    if slow and args.ref_clients != args.clients:
        out.append(f"{slow}: measured at {', '.join(map(str, args.ref_clients))} clients only.")
    if args.processes > 1:
        out.append(f"Spindle ran as {args.processes} `spindle serve` processes on one database; client i "
                   f"of a cell used process i mod {args.processes} for all its requests, so a cell with "
                   f"fewer clients than processes leaves some idle. Its CPU % and memory are summed over "
                   f"them all.")
    for name, mem in memory.items():
        end = ", ".join(f"{mb:.0f}" for mb in mem["end_mb"])
        out.append(f"{report.SERVERS[name]} memory: {mem['idle_mb']:.0f} MB RSS when ready; after the last cell of each "
                   f"repetition: {end} MB; peak (VmHWM): {mem['peak_mb']:.0f} MB.")
    if any(m["pg_cpu_pct"] is not None for m in raw):
        out.append("A server's CPU % does not include PostgreSQL's own processes: their CPU is in the "
                   "\"PostgreSQL CPU ms/run\" column, read from /proc for every `postgres` process on "
                   "the machine (backends, WAL writer, checkpointer, ...) over the same window.")
    on_pg = [m for m in raw if m["pg_cpu_pct"] is not None]
    other = [m for m in on_pg if m["pg_other_cpu_pct"] > 0.05 * max(m["pg_cpu_pct"], 1)]
    if other:
        worst = max(m["pg_other_cpu_pct"] for m in other)
        out.append(f"PostgreSQL was also serving other databases (someone else's load) during {len(other)} "
                   f"of the {len(on_pg)} measurements with PostgreSQL figures, up to {worst:.0f} % of a "
                   "core, which its CPU per run includes: those figures are upper bounds.")
    busy = sum(m["machine_compiling"] for m in raw)
    if busy:
        out.append(f"The machine was also compiling (another build in the same checkout) during {busy} of "
                   f"{len(raw)} measurements, which takes CPU from the servers: figures are lower bounds.")
    out.append("The load generators run on the same cores as the server they measure. All the servers "
               "run throughout, but only one is under load at a time (an idle one uses under 1 % CPU).")
    out.append("Each repetition starts a fresh server, but within one the cells run in the order of "
               "the table on the same server: its database (a new thread per run) and memory grow from "
               "cell to cell.")
    return out


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def make_server(args, kind: str, workdir: Path, rep: int):
    """A server of `kind` for one repetition, on fresh ports with fresh data; not started yet.

    On PostgreSQL its database is created here, last, once nothing else can fail, and dropped
    when the server stops.
    """
    cwd = workdir / f"{kind}-{rep + 1}"
    if kind == "reference":
        return servers.reference_server(BENCH / ".venv", BENCH / "reference", cwd)
    if kind == "spindle" and args.backend == "sqlite":
        return servers.spindle_server(args.spindle_bin, cwd, None, spindle_python(args))
    database = servers.PostgresDatabase(args.postgres_url, suffix=f"{kind}_{rep + 1}")
    if kind == "aegra":
        server = servers.aegra_server(AEGRA_VENV, BENCH / "reference", cwd, database.url)
    elif args.processes == 1:
        server = servers.spindle_server(args.spindle_bin, cwd, database.url, spindle_python(args))
    else:
        server = servers.ServerGroup([
            servers.spindle_server(args.spindle_bin, cwd / f"process-{i + 1}", database.url, spindle_python(args))
            for i in range(args.processes)])
    server.database = database.name
    server.after_stop.append(database.drop)
    database.create()
    return server


def spindle_python(args) -> tuple | None:
    """With --graphs python: the reference's project, the workers' interpreter and their number."""
    if args.graphs != "python":
        return None
    return BENCH / "reference", BENCH / ".venv" / "bin" / "python", args.python_workers


def start(server) -> None:
    # The Python servers import LangGraph and FastAPI first: slow on a busy machine.
    timeout = 60 if server.name == "spindle" else 180
    log(f"==> {server.name} ready in {server.start(timeout):.1f} s at {server.url}")


def run_benchmark(args, workdir: Path) -> tuple:
    """Measures every plan; returns (raw measurements, memory facts per server).

    All the servers start first, side by side, so that one that cannot start fails the run
    before minutes of measuring. Each repetition after the first gets a fresh server: a server's
    memory and database grow with the runs it served, and repetitions should be alike.
    """
    live, raw, memory = {}, [], {}
    try:
        for plan in plans(args):
            live[plan.kind] = make_server(args, plan.kind, workdir, 0)
            start(live[plan.kind])
            memory[plan.kind] = {"idle_mb": live[plan.kind].memory_mb()["rss_mb"], "peak_mb": 0, "end_mb": []}
        for plan in plans(args):
            for rep in range(plan.repeat):
                if rep > 0:
                    live[plan.kind].stop()
                    live[plan.kind] = make_server(args, plan.kind, workdir, rep)
                    start(live[plan.kind])
                raw += measure_server(args, live[plan.kind], plan, rep)
                mem = live[plan.kind].memory_mb()
                memory[plan.kind]["peak_mb"] = max(memory[plan.kind]["peak_mb"], mem["peak_mb"])
                memory[plan.kind]["end_mb"].append(mem["rss_mb"])
    finally:
        stop_all(live.values())
    return raw, memory


def stop_all(running) -> None:
    """Stops every server, each also when stopping another failed; then raises the first failure."""
    failures = []
    for server in running:
        try:
            server.stop()
        except Exception as err:  # noqa: BLE001 - the others must stop all the same
            log(f"!! stopping {server.name}: {type(err).__name__}: {err}")
            failures.append(err)
    if failures:
        raise failures[0]


def main(argv) -> int:
    args = parse_args(argv)
    command = shlex.join(["bench/run", *argv])
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    if not args.no_build:
        build(args)
    if args.aegra:
        ensure_venv(AEGRA_VENV, BENCH / "requirements-aegra.txt")
    facts = machine_facts(args)
    workdir = servers.make_workdir()
    try:
        raw, memory = run_benchmark(args, workdir)
    except (Exception, KeyboardInterrupt) as err:
        log(f"!! benchmark stopped: {type(err).__name__}: {err}\n   server logs kept in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    agg = report.aggregate(raw)
    all_cells = cells(args, sorted(set(args.clients) | set(args.ref_clients)))
    baseline = graph_baseline() if args.graphs == "python" else None
    text = report.markdown(command, facts, agg, all_cells, notes(args, raw, memory), baseline)
    print(text)
    args.output.write_text(text)
    args.output.with_suffix(".json").write_text(json.dumps({"command": command, "facts": facts,
                                                            "measurements": raw}, indent=1))
    log(f"==> wrote {args.output} and {args.output.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
