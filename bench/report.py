"""Turning the measurements into medians, the goal checks and the markdown of RESULTS.md."""
import statistics

# The goals of issue 4, item 9, on a 2-core machine with SQLite. They are judged on the native
# load generator with 16 clients: the Python client measures itself more than the server.
GOAL_CELL = {"client": "native", "clients": 16}
GOAL_RUNS_PER_S = 1500
GOAL_P99_MS = 25
GOAL_FIRST_EVENT_MS = 5
GOAL_RATIO = 25


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _pct(report, key, which):
    block = report.get(key)
    return block[which] if block else None


def _per_run_ms(cpu_pct, runs_per_s):
    """CPU % of one core over the window, per run/s: the CPU one run cost, in ms."""
    if cpu_pct is None or not runs_per_s:
        return None
    return cpu_pct * 10 / runs_per_s


def aggregate(raw: list) -> dict:
    """Medians over the repetitions of each cell, keyed by (server, scenario, client, clients)."""
    groups = {}
    for m in raw:
        groups.setdefault((m["server"], m["scenario"], m["client"], m["clients"]), []).append(m)
    out = {}
    for key, ms in groups.items():
        reports = [m["report"] for m in ms]
        out[key] = {
            "reps": len(ms),
            "runs_per_s": _median([r["runs_per_s"] for r in reports]),
            "p50": _median([_pct(r, "latency_ms", "p50") for r in reports]),
            "p99": _median([_pct(r, "latency_ms", "p99") for r in reports]),
            "fe_p50": _median([_pct(r, "first_event_ms", "p50") for r in reports]),
            "fe_p99": _median([_pct(r, "first_event_ms", "p99") for r in reports]),
            "errors": sum(r["errors"] for r in reports),
            "first_error": next((r["first_error"] for r in reports if r["first_error"]), None),
            "rss_mb": _median([m["rss_mb"] for m in ms]),
            "processes": ms[0].get("processes", 1),
            "cpu_pct": _median([m["cpu_pct"] for m in ms]),
            "cpu_ms_per_run": _median([_per_run_ms(m["cpu_pct"], m["report"]["runs_per_s"]) for m in ms]),
            "pg_cpu_ms_per_run": _median([_per_run_ms(m.get("pg_cpu_pct"), m["report"]["runs_per_s"])
                                          for m in ms]),
            "client_cpu_pct": _median([m["client_cpu_pct"] for m in ms]),
        }
    return out


def fmt_rate(v):
    if v is None:
        return "–"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def fmt_ms(v):
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _first_event(a):
    if a is None or a["fe_p50"] is None:
        return "–"
    return f"{fmt_ms(a['fe_p50'])} / {fmt_ms(a['fe_p99'])}"


# The servers, in the order of their rows, and their names in the table.
SERVERS = {"spindle": "Spindle", "reference": "reference", "aegra": "Aegra"}


def _row(a):
    """The measured columns of one server for one cell."""
    return [str(a["processes"]), fmt_rate(a["runs_per_s"]), fmt_ms(a["p50"]), fmt_ms(a["p99"]),
            _first_event(a), f"{a['cpu_pct']:.0f}", fmt_ms(a["cpu_ms_per_run"]),
            fmt_ms(a["pg_cpu_ms_per_run"]), f"{a['client_cpu_pct']:.0f}", f"{a['rss_mb']:.0f}",
            str(a["errors"])]


def _ratio(s, other):
    if not s or not other or not other["runs_per_s"]:
        return "–"
    ratio = s["runs_per_s"] / other["runs_per_s"]
    return f"{ratio:,.0f}×" if ratio >= 10 else f"{ratio:.1f}×"


def table(agg: dict, cells: list) -> str:
    """One row per server measured in each (scenario, client, clients) cell, Spindle's first,
    each other server's with the ratio of Spindle's runs/s to its own."""
    head = ["scenario", "client", "clients", "server", "processes", "runs/s", "p50 ms", "p99 ms",
            "1st event p50 / p99 ms", "CPU %", "CPU ms/run", "PostgreSQL CPU ms/run", "client CPU %",
            "RSS MB", "errors", "Spindle ÷ server"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scenario, client, clients in cells:
        label = "create + wait" if scenario == "wait" else "create + stream"
        spindle = agg.get(("spindle", scenario, client, clients))
        for server, name in SERVERS.items():
            a = agg.get((server, scenario, client, clients))
            if a is None:
                continue
            ratio = "" if server == "spindle" else _ratio(spindle, a)
            lines.append("| " + " | ".join([label, client, str(clients), name, *_row(a), ratio]) + " |")
    return "\n".join(lines)


def goals(agg: dict) -> list:
    """(goal, measured, verdict) rows for the goals, from the native 16-client cells."""
    wait = agg.get(("spindle", "wait", GOAL_CELL["client"], GOAL_CELL["clients"]))
    stream = agg.get(("spindle", "stream", GOAL_CELL["client"], GOAL_CELL["clients"]))
    ref = agg.get(("reference", "wait", GOAL_CELL["client"], GOAL_CELL["clients"]))
    rows = []

    def check(goal, value, ok, shown):
        rows.append((goal, shown if value is not None else "not measured",
                     "–" if value is None else ("met" if ok(value) else "NOT met")))

    check(f"create + wait, 16 clients: ≥ {GOAL_RUNS_PER_S:,} runs/s", wait and wait["runs_per_s"],
          lambda v: v >= GOAL_RUNS_PER_S, wait and f"{fmt_rate(wait['runs_per_s'])} runs/s")
    check(f"create + wait, 16 clients: p99 < {GOAL_P99_MS} ms", wait and wait["p99"],
          lambda v: v < GOAL_P99_MS, wait and f"{fmt_ms(wait['p99'])} ms")
    for pct in ("p50", "p99"):
        value = stream and stream[f"fe_{pct}"]
        check(f"create + stream, 16 clients: first SSE event {pct} < {GOAL_FIRST_EVENT_MS} ms", value,
              lambda v: v < GOAL_FIRST_EVENT_MS, value is not None and f"{fmt_ms(value)} ms")
    ratio = wait and ref and ref["runs_per_s"] and wait["runs_per_s"] / ref["runs_per_s"]
    check(f"create + wait, 16 clients: ≥ {GOAL_RATIO}× the reference's runs/s", ratio,
          lambda v: v >= GOAL_RATIO, ratio and f"{ratio:,.0f}×")
    return rows


# The goals of issue 29, item 1 (and 7), with `spindle serve` on PostgreSQL: judged on the
# native 16-client cells, CPU per run for Spindle's process and PostgreSQL's.
GOAL_PG_RATIO = 12
GOAL_PG_P99_MS = 40
GOAL_PG_CPU_MS = 1.0
GOAL_PG_SPINDLE_CPU_MS = 0.6
GOAL_PG_AEGRA_RATIO = 40


def postgres_goals(agg: dict) -> list:
    """(goal, measured, verdict) rows for issue 29's goals on PostgreSQL."""
    def cell(server, scenario, clients=16):
        return agg.get((server, scenario, GOAL_CELL["client"], clients))

    wait, stream = cell("spindle", "wait"), cell("spindle", "stream")
    wait64 = cell("spindle", "wait", 64)
    rows = []

    def check(goal, value, ok, shown):
        rows.append((goal, shown if value is not None else "not measured",
                     "–" if value is None else ("met" if ok(value) else "NOT met")))

    for other, name, goal in (("reference", "the reference", GOAL_PG_RATIO),
                              ("aegra", "Aegra", GOAL_PG_AEGRA_RATIO)):
        theirs = cell(other, "wait")
        ratio = wait and theirs and theirs["runs_per_s"] and wait["runs_per_s"] / theirs["runs_per_s"]
        check(f"create + wait, 16 clients: ≥ {goal}× {name}'s runs/s", ratio,
              lambda v, goal=goal: v >= goal, ratio and f"{ratio:,.1f}×")
    check(f"create + wait, 16 clients: p99 < {GOAL_PG_P99_MS} ms", wait and wait["p99"],
          lambda v: v < GOAL_PG_P99_MS, wait and f"{fmt_ms(wait['p99'])} ms")
    for key, goal, who in (("pg_cpu_ms_per_run", GOAL_PG_CPU_MS, "PostgreSQL"),
                           ("cpu_ms_per_run", GOAL_PG_SPINDLE_CPU_MS, "Spindle")):
        value = wait and wait[key]
        check(f"create + wait, 16 clients: {who} CPU ≤ {goal} ms/run", value,
              lambda v, goal=goal: v <= goal, value is not None and f"{fmt_ms(value)} ms")
    ratio = wait and wait64 and wait["runs_per_s"] and wait64["runs_per_s"] / wait["runs_per_s"]
    check("create + wait: 64 clients no slower than 16", ratio, lambda v: v >= 1,
          ratio and f"{fmt_rate(wait64['runs_per_s'])} vs {fmt_rate(wait['runs_per_s'])} runs/s")
    value = stream and stream["fe_p50"]
    check(f"create + stream, 16 clients: first SSE event p50 < {GOAL_FIRST_EVENT_MS} ms", value,
          lambda v: v < GOAL_FIRST_EVENT_MS, value is not None and f"{fmt_ms(value)} ms")
    return rows


# The goals of issue 27, item 9, for Python graphs (`--graphs python`): the reference's own
# Python `chain` run by Spindle's workers, on the same machine.
GOAL_PYTHON_RATIO = 3
GOAL_PYTHON_OVERHEAD_MS = 2


def python_goals(agg: dict, baseline: dict | None) -> list:
    """(goal, measured, verdict) rows for Python graphs: the ratio to the reference at 16
    clients, and Spindle's overhead per run: its CPU per run (server and workers) at 16 clients
    minus the graph's own (`graph_baseline.py`: LangGraph alone, in-memory checkpointer)."""
    wait = agg.get(("spindle", "wait", GOAL_CELL["client"], GOAL_CELL["clients"]))
    ref = agg.get(("reference", "wait", GOAL_CELL["client"], GOAL_CELL["clients"]))
    rows = []
    ratio = wait and ref and ref["runs_per_s"] and wait["runs_per_s"] / ref["runs_per_s"]
    rows.append((f"create + wait, 16 clients: ≥ {GOAL_PYTHON_RATIO}× the reference's runs/s",
                 f"{ratio:,.1f}×" if ratio else "not measured",
                 "–" if not ratio else ("met" if ratio >= GOAL_PYTHON_RATIO else "NOT met")))
    overhead = None
    if wait and wait["cpu_ms_per_run"] is not None and baseline:
        cpu_per_run = wait["cpu_ms_per_run"]
        overhead = cpu_per_run - baseline["cpu_ms_per_run"]
        shown = (f"{overhead:.2f} ms ({cpu_per_run:.2f} ms of CPU per run, "
                 f"{baseline['cpu_ms_per_run']:.2f} ms of it the graph's own)")
    rows.append((f"server overhead per run (CPU beyond the graph's own), 16 clients: "
                 f"< {GOAL_PYTHON_OVERHEAD_MS} ms",
                 shown if overhead is not None else "not measured",
                 "–" if overhead is None else ("met" if overhead < GOAL_PYTHON_OVERHEAD_MS else "NOT met")))
    return rows


def goals_table(rows: list) -> str:
    lines = ["| goal | measured | verdict |", "|---|---|---|"]
    lines += [f"| {g} | {m} | {v} |" for g, m, v in rows]
    return "\n".join(lines)


def errors_section(agg: dict) -> str:
    """The first error message of every cell that had errors: the table only counts them."""
    lines = [f"- {server} {scenario} {client} {clients} clients: {a['errors']} errors, first: "
             f"`{a['first_error']}`"
             for (server, scenario, client, clients), a in sorted(agg.items()) if a["errors"]]
    return "\n".join(lines) if lines else "None."


def markdown(command: str, facts: dict, agg: dict, cells: list, notes: list,
             baseline: dict | None = None) -> str:
    """The whole of RESULTS.md (`baseline` given: Spindle ran the Python graphs)."""
    if baseline:
        goal_rows = python_goals(agg, baseline)
    elif str(facts.get("Backend", "")).startswith("PostgreSQL"):
        goal_rows = postgres_goals(agg)
    else:
        goal_rows = goals(agg)
    graphs = "Python graphs through Spindle's workers" if baseline else "graph files"
    facts_md = "\n".join(f"- {k}: {v}" for k, v in facts.items())
    notes_md = "\n".join(f"- {n}" for n in notes)
    return f"""# Benchmark results

Produced by `bench/run` (see bench/README.md), which wrote this file. Command:

```sh
{command}
```

{facts_md}

## Results

Medians over the repetitions, one row per server and cell. "processes" is how many server
processes shared the load (the clients spread over them round-robin). Latency is one whole
operation: `POST /threads`, then the run waited on (`/runs/wait`) or streamed to its end
(`/runs/stream`). "1st event" is the time from sending the stream request to receiving its
first complete SSE event frame. CPU % is the server's CPU time (all its processes) over the
measured window (200 % = both cores); CPU ms/run is that time divided by the runs, and
PostgreSQL CPU ms/run the same for PostgreSQL's own processes, for the servers that keep their
data there ("–" for the others). Client CPU % is the load generator's over the cell's whole wall
time; it shares the cores. RSS is the server's resident memory after the cell (summed over its
processes). "Spindle ÷ server" is Spindle's runs/s over that server's, same client and clients.

{table(agg, cells)}

## Goals (native load generator, 16 clients, {facts.get('Backend', '?')}, {graphs})

{goals_table(goal_rows)}

## Errors

{errors_section(agg)}

## Notes

{notes_md}
"""
