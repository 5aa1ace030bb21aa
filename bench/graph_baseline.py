"""The graph's own cost: `chain` run by LangGraph in this process, with an in-memory
checkpointer and nothing else, as any server running it spends at least.

With `bench/run --graphs python`, Spindle's server overhead per run is its CPU per run (the
server and its Python workers) minus this. Prints one JSON object: `cpu_ms_per_run` and
`wall_ms_per_run`, medians of `--repeat` batches of `--runs` runs, each on a new thread.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path


async def batch(graph, runs: int, graph_input: dict) -> tuple:
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(runs):
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        await graph.ainvoke(graph_input, config)
    return ((time.process_time() - cpu) * 1000 / runs, (time.perf_counter() - wall) * 1000 / runs)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--project", type=Path, default=Path(__file__).parent / "reference")
    p.add_argument("--graph", default="chain")
    p.add_argument("--input", default='{"n": 1}')
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    sys.path.insert(0, str(args.project / "graphs"))
    from langgraph.checkpoint.memory import InMemorySaver
    import ref_graphs

    graph = getattr(ref_graphs, args.graph).copy(update={"checkpointer": InMemorySaver()})
    graph_input = json.loads(args.input)
    await batch(graph, 100, graph_input)  # warm-up: imports, caches
    results = [await batch(graph, args.runs, graph_input) for _ in range(args.repeat)]
    print(json.dumps({
        "cpu_ms_per_run": statistics.median(r[0] for r in results),
        "wall_ms_per_run": statistics.median(r[1] for r in results),
    }))


if __name__ == "__main__":
    asyncio.run(main())
