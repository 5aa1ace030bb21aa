#!/usr/bin/env python3
"""Cross-process event latency (issue 29, item 2): how much later a stream served by another
`spindle serve` process gets a run's events than a stream served by the process running it.

    bench/.venv/bin/python bench/cross_process.py --spindle-bin target/release/spindle \\
        --postgres-url postgres://postgres@127.0.0.1:5432/postgres --runs 40

Starts two `spindle serve` processes, A and B, on one fresh PostgreSQL database (created here
and dropped at the end). For each run: a new thread, a thread stream (`GET
/threads/{id}/stream`) opened on A and one on B, then a run of `slow` created on A (so A runs
it, claimed as it is created) with steps `--delay-ms` apart. Every event has an id (its seq in
the thread's log), so each event's arrival on B is lined up with its arrival on A: B's lag is
what crossing processes costs (A's writer commits the event, announces it with NOTIFY, B's
listener wakes B's stream, which reads the log). A's own stream gets each event once it is
committed, so the lag is measured from the same starting line.

Prints the lag's percentiles over every event of every run and writes them to `--output`.
Standard library and httpx (bench/.venv) only.
"""
import argparse
import asyncio
import json
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
    p.add_argument("--output", type=Path, default=None, help="also write the result here (markdown)")
    return p.parse_args(argv)


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


async def one_run(a: httpx.AsyncClient, b: httpx.AsyncClient, delay_ms: int) -> list:
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
    return [(on_b[i] - on_a[i]) * 1000 for i in on_a]


def pct(values: list, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def measure(args, url_a: str, url_b: str) -> dict:
    timeout = httpx.Timeout(30.0)
    async with httpx.AsyncClient(base_url=url_a, timeout=timeout) as a, \
            httpx.AsyncClient(base_url=url_b, timeout=timeout) as b:
        await one_run(a, b, args.delay_ms)  # warm-up: connections, prepared statements
        lags = []
        for _ in range(args.runs):
            lags.extend(await one_run(a, b, args.delay_ms))
    return {"events": len(lags), "runs": args.runs, "p50": statistics.median(lags),
            "p90": pct(lags, 0.9), "p99": pct(lags, 0.99), "max": max(lags)}


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
        result = asyncio.run(measure(args, started[0].url, started[1].url))
    finally:
        for server in started:
            server.stop()
        database.drop()
    table = ("| runs | events | B's lag p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|\n"
             f"| {result['runs']} | {result['events']} | {result['p50']:.2f} | {result['p90']:.2f} | "
             f"{result['p99']:.2f} | {result['max']:.2f} |\n")
    print(table)
    print(json.dumps(result))
    if args.output:
        args.output.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
