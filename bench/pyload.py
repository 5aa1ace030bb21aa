"""Load an agent server with the official Python client (langgraph-sdk).

The same scenarios as the native load generator (bench/loadgen), with N asyncio tasks sharing
one client per server URL (task i uses URL i % n, as the native one does), printing the same
JSON report. It shows what a Python application sees; it is not
a measure of the server's ceiling, because the client itself costs a CPU core well before.

    python pyload.py --url http://127.0.0.1:2024 --scenario wait --clients 16 --duration 5
"""
import argparse
import asyncio
import json
import math
import time

from langgraph_sdk import get_client


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True,
                   help="base URL of the server; or several, comma-separated (processes of one server): "
                        "task i uses URL i %% n for all its operations")
    p.add_argument("--scenario", choices=["wait", "stream"], required=True)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring")
    p.add_argument("--assistant", default="chain")
    p.add_argument("--input", default='{"n": 1}', help="the run's input, as JSON")
    p.add_argument("--expect", help="top-level keys the waited-on output must hold, as JSON")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a request gives up")
    return p.parse_args()


async def run_once(client, args, run_input, expect):
    """One operation: create a thread, then wait on or stream a run. Returns (latency, first event)."""
    started = time.perf_counter()
    thread = await client.threads.create()
    if args.scenario == "wait":
        output = await client.runs.wait(thread["thread_id"], args.assistant, input=run_input)
        for key, want in (expect or {}).items():
            if not isinstance(output, dict) or output.get(key) != want:
                raise RuntimeError(f"runs/wait answered {output!r}, expected {key} = {want!r}")
        return time.perf_counter() - started, None
    first_event = None
    stream_started = time.perf_counter()
    async for part in client.runs.stream(thread["thread_id"], args.assistant, input=run_input):
        if first_event is None:
            first_event = time.perf_counter() - stream_started
        if part.event == "error":
            raise RuntimeError(f"the run stream sent an error event: {part.data!r}")
    if first_event is None:
        raise RuntimeError("the run stream ended without an event")
    return time.perf_counter() - started, first_event


async def client_loop(client, args, run_input, expect, window, result):
    """Operations back to back until the window closes; only those ending inside it count."""
    start, end = window
    while time.perf_counter() < end:
        try:
            sample = await run_once(client, args, run_input, expect)
            error = None
        except Exception as err:  # noqa: BLE001 - every failure is a counted error
            sample, error = None, f"{type(err).__name__}: {err}"
        ended = time.perf_counter()
        if not start <= ended <= end:
            continue
        if error:
            result["errors"] += 1
            result["first_error"] = result["first_error"] or error
            await asyncio.sleep(0.01)  # a refused connection fails at once; do not spin on it
        else:
            result["samples"].append(sample)


def base_urls(urls: str) -> list:
    """The comma-separated `--url` values without trailing slashes; none may be empty, since a
    task given an empty one would fail every operation instead of loading a server."""
    out = [url.strip().rstrip("/") for url in urls.split(",")]
    if not all(out):
        raise SystemExit(f"--url holds an empty URL: {urls!r}")
    return out


def percentiles(samples_s):
    """Exact nearest-rank percentiles in milliseconds, or None without samples."""
    if not samples_s:
        return None
    ms = sorted(s * 1000 for s in samples_s)

    def rank(p):
        return ms[min(max(math.ceil(p / 100 * len(ms)), 1), len(ms)) - 1]

    return {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": ms[-1], "mean": sum(ms) / len(ms)}


async def main():
    args = parse_args()
    run_input = json.loads(args.input)
    expect = json.loads(args.expect) if args.expect else None
    urls = base_urls(args.url)
    clients = [get_client(url=url, timeout=args.timeout) for url in urls]
    now = time.perf_counter()
    window = (now + args.warmup, now + args.warmup + args.duration)
    result = {"samples": [], "errors": 0, "first_error": None}
    await asyncio.gather(
        *(client_loop(clients[i % len(clients)], args, run_input, expect, window, result)
          for i in range(args.clients))
    )
    samples = result["samples"]
    report = {
        "tool": "langgraph-sdk",
        "scenario": args.scenario,
        "clients": args.clients,
        "urls": len(urls),
        "duration_s": args.duration,
        "runs": len(samples),
        "errors": result["errors"],
        "runs_per_s": len(samples) / args.duration,
        "latency_ms": percentiles([s[0] for s in samples]),
        "first_event_ms": percentiles([s[1] for s in samples if s[1] is not None]),
        "first_error": result["first_error"],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
