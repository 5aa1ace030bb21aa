#!/usr/bin/env python3
"""Cross-process event latency (issue 29, item 2): how much later a stream served by another
`spindle serve` process gets a run's events than a stream served by the process running it.

    bench/.venv/bin/python bench/cross_process.py --spindle-bin target/release/spindle \\
        --postgres-url postgres://postgres@127.0.0.1:5432/postgres --runs 40 --load 0,16

Starts two `spindle serve` processes, A and B, on one fresh PostgreSQL database (created here
and dropped at the end). For each run: a new thread, a thread stream (`GET
/threads/{id}/stream`) opened on A and one on B, then a run of `slow` created on A (so A runs
it, claimed as it is created) with steps `--delay-ms` apart. Every event has an id (its seq in
the thread's log), so each event's arrival on B is lined up with its arrival on A: B's lag is
what crossing processes costs (A's writer commits the event, announces it with NOTIFY, B's
listener wakes B's stream, which reads the log). A's own stream gets each event once it is
committed, so the lag is measured from the same starting line.

Under load (`--load CLIENTS`, or several: `--load 0,16` measures without load, then with 16
clients, on the same two processes): while the lag's runs go, the native load generator
(`spindle-loadgen --url A,B --scenario wait --clients CLIENTS --warmup 0`, started
`--load-ramp` seconds before the first measured run, its `--duration` longer than the
measurement) keeps both processes busy with runs of `chain`, half its clients on each; it is
stopped once the measured runs are done. Stopped, it prints nothing, so the load's runs/s is
read from the two servers' `/metrics` instead: the runs of `chain` that ended on A and on B
(`spindle_runs_ended_total`) between the first and the last measured run, over that time;
`chain` runs that did not succeed are counted as the load's errors. Under load A may have no
free worker slot when a run is created and B may claim it: each run's `slow` counter on A's and
B's `/metrics` tells which process ran it, and the lag is always that of the other process's
stream (how many ran on B is reported).

Prints a table, one row per load ("without load", or "with load", its clients and runs/s),
with the lag's percentiles over every event of every run, and writes it to `--output`.
Standard library and httpx (bench/.venv) only; `--loadgen-bin` (`--loadgen`) is the load
generator, by default `target/release/spindle-loadgen` or, if there is none,
`../target-bench/release/` (a build with `CARGO_TARGET_DIR` beside the checkout) or
`$CARGO_TARGET_DIR/release/`.
"""
import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import servers  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spindle-bin", type=Path, default=ROOT / "target/release/spindle")
    p.add_argument("--postgres-url", default="postgres://postgres@127.0.0.1:5432/postgres",
                   help="a PostgreSQL database to create the benchmark's fresh database from")
    p.add_argument("--runs", type=int, default=40, help="runs, one after the other [40]")
    p.add_argument("--delay-ms", type=int, default=20, help="sleep in each of slow's two steps [20]")
    p.add_argument("--load", default="0",
                   help="clients of the load generator (scenario wait, on A and B) while the lag is "
                        "measured; 0: no load; several, comma-separated (0,16): one measurement each [0]")
    p.add_argument("--loadgen-bin", "--loadgen", dest="loadgen_bin", type=Path, default=None,
                   help="the load generator [target/release/spindle-loadgen, else "
                        "../target-bench/release/spindle-loadgen or $CARGO_TARGET_DIR/release/]")
    p.add_argument("--load-ramp", type=float, default=2.0,
                   help="seconds of load before the first measured run [2]")
    p.add_argument("--output", type=Path, default=None, help="also write the result here (markdown)")
    args = p.parse_args(argv)
    try:
        args.load = [int(x) for x in args.load.split(",") if x.strip()]
    except ValueError:
        p.error(f"--load takes client counts, comma-separated, not {args.load!r}")
    if not args.load or any(n < 0 for n in args.load):
        p.error("--load takes client counts of 0 or more")
    if any(args.load):
        args.loadgen_bin = args.loadgen_bin or default_loadgen()
        if not args.loadgen_bin.exists():
            p.error(f"the load generator {args.loadgen_bin} does not exist (--loadgen-bin; "
                    "`cargo build --release -p spindle-loadgen`)")
    return args


def default_loadgen() -> Path:
    """target/release/spindle-loadgen (bench/harness.py's default), else a build beside the
    checkout (../target-bench) or in $CARGO_TARGET_DIR."""
    candidates = [ROOT / "target/release/spindle-loadgen",
                  ROOT.parent / "target-bench/release/spindle-loadgen"]
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "release/spindle-loadgen")
    return next((c for c in candidates if c.exists()), candidates[0])


async def runs_ended(client: httpx.AsyncClient) -> dict:
    """spindle_runs_ended_total from the server's /metrics: {(graph, status): count}."""
    resp = await client.get("/metrics")
    resp.raise_for_status()
    out = {}
    for line in resp.text.splitlines():
        if not line.startswith("spindle_runs_ended_total{"):
            continue
        labels, _, value = line[len("spindle_runs_ended_total{"):].partition("} ")
        fields = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
        key = (fields.get("graph", "").strip('"'), fields.get("status", "").strip('"'))
        out[key] = out.get(key, 0) + float(value)
    return out


def ended(counts: dict, graph: str, success: bool | None = None) -> float:
    return sum(n for (g, status), n in counts.items()
               if g == graph and (success is None or (status == "success") == success))


async def collect(client: httpx.AsyncClient, url: str, arrivals: dict,
                  subscribed: asyncio.Event) -> None:
    """Reads a thread stream, noting when each event id arrived, until cancelled."""
    async with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as resp:
        resp.raise_for_status()
        subscribed.set()
        event_id = None
        async for line in resp.aiter_lines():
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line == "" and event_id is not None:
                arrivals[event_id] = time.perf_counter()
                event_id = None


async def one_run(a: httpx.AsyncClient, b: httpx.AsyncClient, delay_ms: int) -> tuple:
    """One measured run, created on A: (the lag of each event on the stream of the process
    that did not run it, in ms; the name of the process that ran it)."""
    slow_a, slow_b = ended(await runs_ended(a), "slow"), ended(await runs_ended(b), "slow")
    thread = (await a.post("/threads", json={})).raise_for_status().json()["thread_id"]
    on_a, on_b = {}, {}
    ready_a, ready_b = asyncio.Event(), asyncio.Event()
    path = f"/threads/{thread}/stream"
    tasks = [asyncio.create_task(collect(a, path, on_a, ready_a)),
             asyncio.create_task(collect(b, path, on_b, ready_b))]
    await asyncio.wait_for(asyncio.gather(ready_a.wait(), ready_b.wait()), 10)
    # The response headers come once the stream is subscribed; a moment more for B's listener.
    await asyncio.sleep(0.05)
    run = await a.post(f"/threads/{thread}/runs", json={
        "assistant_id": "slow", "input": {"delay_ms": delay_ms},
        "stream_mode": ["values", "updates", "custom"]})
    run.raise_for_status()
    try:
        joined = await a.get(f"/threads/{thread}/runs/{run.json()['run_id']}/join")
        joined.raise_for_status()
        # The run's last events may reach the streams a moment after the join answers.
        deadline = time.monotonic() + 5
        while (set(on_a) != set(on_b) or not on_a) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    missing = set(on_a) ^ set(on_b)
    if missing:
        raise RuntimeError(f"thread {thread}: events seen by one stream only: {sorted(missing)}; "
                           f"A: {sorted(on_a, key=int)}, B: {sorted(on_b, key=int)}")
    # Which process ran it: its `slow` counter went up (a moment after the join may answer).
    deadline = time.monotonic() + 5
    while True:
        ran_a = ended(await runs_ended(a), "slow") > slow_a
        ran_b = ended(await runs_ended(b), "slow") > slow_b
        if ran_a != ran_b:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"thread {thread}: neither process's /metrics counts the run as ended"
                               if not ran_a else f"thread {thread}: both processes count a run of slow")
        await asyncio.sleep(0.01)
    runner = "B" if ran_b else "A"
    if runner == "B":
        return [(on_a[i] - on_b[i]) * 1000 for i in on_a], runner
    return [(on_b[i] - on_a[i]) * 1000 for i in on_a], runner


def pct(values: list, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def start_load(args, urls: list, clients: int, workdir: Path):
    """The load generator against both processes, for longer than the measurement will take;
    its output goes to files in `workdir` (it prints its report only if it runs to its end)."""
    duration = args.load_ramp + 120 + 5 * (args.runs + 1)
    cmd = [str(args.loadgen_bin), "--url", ",".join(urls), "--scenario", "wait",
           "--clients", str(clients), "--duration", str(duration), "--warmup", "0",
           "--input", '{"n": 1}', "--expect", '{"n": 4}']
    out = open(workdir / f"loadgen-{clients}.out", "wb")
    err = open(workdir / f"loadgen-{clients}.err", "wb")
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=out, stderr=err)
    proc.files = (out, err)
    proc.cmd = cmd
    return proc


async def stop_load(proc) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
    for f in proc.files:
        f.close()


async def chain_runs(a: httpx.AsyncClient, b: httpx.AsyncClient) -> tuple:
    """Runs of `chain` (the load's) that ended on A and B: (succeeded, did not)."""
    counts = [await runs_ended(a), await runs_ended(b)]
    return (sum(ended(c, "chain", True) for c in counts), sum(ended(c, "chain", False) for c in counts))


async def measure(args, url_a: str, url_b: str, clients: int, workdir: Path) -> dict:
    timeout = httpx.Timeout(60.0)
    async with httpx.AsyncClient(base_url=url_a, timeout=timeout) as a, \
            httpx.AsyncClient(base_url=url_b, timeout=timeout) as b:
        load = await start_load(args, [url_a, url_b], clients, workdir) if clients else None
        try:
            if load:
                await asyncio.sleep(args.load_ramp)
            await one_run(a, b, args.delay_ms)  # warm-up: connections, prepared statements
            ok0, failed0 = await chain_runs(a, b)
            started = time.monotonic()
            lags, on_b = [], 0
            for _ in range(args.runs):
                run_lags, runner = await one_run(a, b, args.delay_ms)
                lags.extend(run_lags)
                on_b += runner == "B"
            seconds = time.monotonic() - started
            ok1, failed1 = await chain_runs(a, b)
            if load and load.returncode is not None:
                raise RuntimeError(f"the load generator stopped early ({load.returncode}): "
                                   f"{' '.join(load.cmd)}\n{(workdir / f'loadgen-{clients}.err').read_text()[-2000:]}")
        finally:
            if load:
                await stop_load(load)
    out = {"clients": clients, "events": len(lags), "runs": args.runs, "ran_on_b": on_b,
           "seconds": seconds, "p50": statistics.median(lags), "p90": pct(lags, 0.9),
           "p99": pct(lags, 0.99), "max": max(lags)}
    if clients:
        out.update(load_runs_per_s=(ok1 - ok0) / seconds, load_errors=int(failed1 - failed0))
    print(f"    load {clients or 'none'}: lag p50 {out['p50']:.2f} ms, p99 {out['p99']:.2f} ms"
          + (f", the load's {out['load_runs_per_s']:.0f} runs/s ({out['load_errors']} not successful)"
             if clients else "") + f", {on_b} of {args.runs} runs run by B", file=sys.stderr, flush=True)
    return out


async def measure_all(args, url_a: str, url_b: str, workdir: Path) -> list:
    results = []
    for i, clients in enumerate(args.load):
        if i:
            await asyncio.sleep(2)  # the previous load's last runs end
        results.append(await measure(args, url_a, url_b, clients, workdir))
    return results


def table(args, results: list) -> str:
    lines = ["| load | the load's runs/s (A + B) | runs | events | lag p50 ms | p90 ms | p99 ms | max ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["clients"]:
            load = f"with load: wait, {r['clients']} clients on A and B"
            rate = f"{r['load_runs_per_s']:.0f}" + (f" ({r['load_errors']} not successful)" if r["load_errors"] else "")
        else:
            load, rate = "without load", "–"
        lines.append(f"| {load} | {rate} | {r['runs']} | {r['events']} | {r['p50']:.2f} | {r['p90']:.2f} | "
                     f"{r['p99']:.2f} | {r['max']:.2f} |")
    lines.append("")
    for r in results:
        lines.append(f"- {'with ' + str(r['clients']) + ' clients' if r['clients'] else 'without load'}: "
                     f"each event within 5 ms at the median across processes: "
                     f"{'yes' if r['p50'] < 5 else 'no'} (p50 {r['p50']:.2f} ms)"
                     + (f"; {r['ran_on_b']} of the {r['runs']} runs were run by B (A's slots busy), "
                        "their lag is that of A's stream" if r["ran_on_b"] else ""))
    lines.append("")
    lines.append(f"The lag: when the stream on the process that did not run the run got each event, "
                 f"minus when the stream on the one that ran it did; runs of `slow` ({args.delay_ms} ms "
                 "per step) created on A one after the other. The load: `spindle-loadgen --scenario wait` "
                 "(create a thread, a run of `chain`, wait for it) on both processes, from "
                 f"{args.load_ramp:g} s before the first measured run until the last; its runs/s is the "
                 "runs of `chain` that ended on A and B (their `/metrics`) over the measured runs' time.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    database = servers.PostgresDatabase(args.postgres_url, suffix="cross")
    workdir = servers.make_workdir()
    started = []
    database.create()
    try:
        for name in ("a", "b"):
            server = servers.spindle_server(args.spindle_bin, workdir / name, database.url)
            server.start(60)
            started.append(server)
        results = asyncio.run(measure_all(args, started[0].url, started[1].url, workdir))
    except BaseException:
        print(f"!! server and load generator logs kept in {workdir}", file=sys.stderr)
        raise
    finally:
        for server in started:
            server.stop()
        database.drop()
    shutil.rmtree(workdir, ignore_errors=True)
    text = table(args, results)
    print(text)
    for result in results:
        print(json.dumps(result))
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
