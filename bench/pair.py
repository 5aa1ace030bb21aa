#!/usr/bin/env python3
"""Compare two Spindle binaries under the same load, alternated, and print medians.

    bench/pair.py BEFORE AFTER [--scenario wait|stream] [--clients 16] [--pairs 3] [--duration 5]
        [--postgres-url URL [--after-sql FILE]]

The machine's speed drifts over minutes (by up to 2x on this kind of machine), so two
`bench/run` tables taken at different times cannot tell a 10 % change. This runs BEFORE and
AFTER one after the other, `--pairs` times, each on a fresh server driven by `spindle-loadgen`
(which of the two goes first alternates from pair to pair), and reports per run and as
medians: runs/s, p50/p99 latency, the first SSE event's p99 (stream), and CPU time per run read
from /proc around the measured load; and the median of each pair's after/before ratio of these.

The server is `spindle dev` (SQLite), whose CPU is the process's and its writer thread's
(`sqlite-writer`, which bounds the write rate); or, with `--postgres-url`, `spindle serve` on a
fresh database created from that admin URL, whose CPU is the process's and PostgreSQL's (every
`postgres` process, exited backends included: `servers.postgres_cpu`). `--after-sql` runs a SQL
file on AFTER's databases once migrated, before the load: with the same binary twice, it
compares a schema change (an index, a setting) before writing its migration.
Only the standard library, `psql` for PostgreSQL, and `bench/servers.py`; build both binaries
first.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from servers import (PostgresDatabase, make_workdir, postgres_cpu, spindle_server,
                     thread_cpu_seconds)

BENCH = Path(__file__).resolve().parent
LOADGEN = BENCH.parent / "target" / "release" / "spindle-loadgen"


def loadgen(url: str, args, duration: float, warmup: float) -> dict:
    out = subprocess.run(
        [str(args.loadgen), "--url", url, "--scenario", args.scenario,
         "--clients", str(args.clients), "--duration", str(duration), "--warmup", str(warmup)],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def measure(binary: Path, args, workdir: Path, label: str, setup_sql: Path | None) -> dict:
    """One measurement of `binary` on a fresh server (and database, on PostgreSQL)."""
    database = (PostgresDatabase(args.postgres_url, suffix=label.replace("-", "_"))
                if args.postgres_url else None)
    server = spindle_server(binary, workdir / label, database.create() if database else None)
    if database:
        server.database = database.name
        server.after_stop.append(database.drop)
    try:
        server.start(ready_timeout=30)
        if setup_sql:
            subprocess.run(["psql", database.url, "-v", "ON_ERROR_STOP=1", "-qf", str(setup_sql)],
                           check=True, stdout=subprocess.DEVNULL)
        loadgen(server.url, args, 1.0, 1.0)  # warm-up, not counted
        before = cpu_sample(server)
        # No warm-up inside the measured run, so the CPU read around it is the runs' own
        # (and the few in flight when the window closes).
        result = loadgen(server.url, args, args.duration, 0.0)
        after = cpu_sample(server)
    finally:
        server.stop()
    runs = max(result["runs"], 1)
    first = result.get("first_event_ms") or {}
    per_run = {key: None if before[key] is None else (after[key] - before[key]) * 1e6 / runs
               for key in before}
    return {
        "runs_per_s": result["runs_per_s"],
        "p50_ms": result["latency_ms"]["p50"],
        "p99_ms": result["latency_ms"]["p99"],
        "first_p99_ms": first.get("p99"),
        "cpu_us_per_run": per_run["server"],
        "writer_us_per_run": per_run["writer"],
        "postgres_us_per_run": per_run["postgres"],
        "errors": result["errors"],
    }


def cpu_sample(server) -> dict:
    """CPU seconds so far: the server's; its SQLite writer thread's (None on PostgreSQL); and,
    on PostgreSQL, PostgreSQL's (None on SQLite, or when PostgreSQL is not on this machine)."""
    if server.database is None:
        writer, postgres = thread_cpu_seconds(server.proc.pid, "sqlite-writer"), None
    else:
        writer, postgres = None, (postgres_cpu() or {}).get("total")
    return {"server": server.cpu_seconds(), "writer": writer, "postgres": postgres}


def show(label: str, m: dict) -> str:
    first = f" first-event p99 {m['first_p99_ms']:.1f} ms" if m.get("first_p99_ms") else ""
    parts = "".join(f"  {name} {m[key]:5.0f} us/run"
                    for key, name in (("writer_us_per_run", "writer"),
                                      ("postgres_us_per_run", "PostgreSQL"))
                    if m.get(key) is not None)
    return (f"{label:>6}: {m['runs_per_s']:7.0f} runs/s  p50 {m['p50_ms']:6.2f}  "
            f"p99 {m['p99_ms']:6.1f} ms{first}  cpu {m['cpu_us_per_run']:6.0f} us/run"
            f"{parts}  errors {m['errors']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Absolute: each server runs in a folder of its own.
    p.add_argument("before", type=lambda path: Path(path).resolve())
    p.add_argument("after", type=lambda path: Path(path).resolve())
    p.add_argument("--scenario", choices=["wait", "stream"], default="wait")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per run [5]")
    p.add_argument("--loadgen", type=Path, default=LOADGEN)
    p.add_argument("--postgres-url", help="measure `spindle serve` on fresh databases created "
                   "from this admin URL (e.g. postgres://postgres@127.0.0.1:5432/postgres)")
    p.add_argument("--after-sql", type=lambda path: Path(path).resolve(),
                   help="SQL run on AFTER's databases before the load (--postgres-url only)")
    args = p.parse_args()
    if args.after_sql and not args.postgres_url:
        p.error("--after-sql needs --postgres-url")
    workdir = make_workdir()
    results = {"before": [], "after": []}
    for i in range(args.pairs):
        # Which binary goes first alternates, so that a machine speeding up or slowing down
        # during the pairs favours neither.
        order = [("before", args.before), ("after", args.after)]
        if i % 2:
            order.reverse()
        for label, binary in order:
            setup_sql = args.after_sql if label == "after" else None
            m = measure(binary, args, workdir, f"{label}-{i}", setup_sql)
            results[label].append(m)
            print(show(label, m), flush=True)
    shutil.rmtree(workdir)  # kept when a run failed: the servers' logs are in it
    print(f"\nmedians over {args.pairs} pairs ({args.scenario}, {args.clients} clients):")
    medians = {}
    for label, ms in results.items():
        medians[label] = {k: statistics.median(m[k] for m in ms)
                          for k in ms[0] if ms[0][k] is not None}
        print(show(label, medians[label]))
    ratio = medians["after"]["runs_per_s"] / medians["before"]["runs_per_s"]
    print(f"after / before: {ratio:.2f}x runs/s")
    print(per_pair_ratios(results))
    return 0


def per_pair_ratios(results: dict) -> str:
    """The median of each pair's after/before ratio: the two runs of a pair are minutes apart
    at most, so these ratios are less exposed to the machine's drift than the medians' ratio."""
    pairs = list(zip(results["before"], results["after"]))
    parts = []
    for key, name in (("runs_per_s", "runs/s"), ("first_p99_ms", "first-event p99"),
                      ("cpu_us_per_run", "CPU per run"), ("writer_us_per_run", "writer per run"),
                      ("postgres_us_per_run", "PostgreSQL per run")):
        ratios = [a[key] / b[key] for b, a in pairs if a[key] is not None and b[key]]
        if ratios:
            parts.append(f"{name} {statistics.median(ratios):.2f}x")
    return "median of per-pair ratios (after / before): " + ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
