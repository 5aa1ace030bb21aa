"""A run that fails says where: its error, as the client reads it, has the error's class and
message and, in a field of its own (`location`), the graph, the node and the graph file's line
and column of a failing script; the server logs one line with the run, the thread, the graph,
the node, the error's class, its message and where."""

from __future__ import annotations

import json
import re
import time

import harness
import pytest
from langgraph_sdk import get_client

pytestmark = pytest.mark.spindle_only

# Line 9 holds the failing expression: `state.items` was never written, so it reads as `()`.
BROKEN_GRAPH = """\
name: broken
state:
  n: {type: integer, default: 0}
  items: any
nodes:
  step:
    kind: script
    code: |
      let n = state.n;
      #{ n: n + state.items.len() }
edges:
  - {from: __start__, to: step}
"""

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("error_locations")
    (folder / "broken.yaml").write_text(BROKEN_GRAPH)
    (folder / "langgraph.json").write_text(json.dumps({"graphs": {"broken": "./broken.yaml"}}))
    srv = harness.start(
        "sqlite",
        lambda port: ["serve", "--config", str(folder / "langgraph.json"), "--host", "127.0.0.1",
                      "--port", str(port), "--database-url", f"sqlite://{folder / 'spindle.db'}"],
        folder,
    )
    yield srv, folder
    harness.stop(srv)


def failure_lines(srv, run_id: str) -> list[str]:
    """The server's `run failed` lines about this run, waited for (the log is written as the run
    ends, and the client may hear of the end first)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [ANSI.sub("", line) for line in srv.output().splitlines()]
        found = [line for line in lines if "run failed" in line and f"run_id={run_id}" in line]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


async def test_a_failed_runs_error_and_log_line_say_where(server):
    srv, _ = server
    client = get_client(url=srv.base_url)
    thread = await client.threads.create()
    events = [p async for p in client.runs.stream(thread["thread_id"], "broken", input={})]
    [error] = [p.data for p in events if p.event == "error"]
    assert error["error"] == "ScriptError", events
    assert error["message"] == (
        "Function not found: len (()). Hint: a state key that was never written reads as "
        "Rhai's unit `()`; give it a default under `state:` or check `state.key != ()` first"
    ), error
    # Where, beside the message; the file is named as the config names it, resolved to where
    # it is.
    assert re.fullmatch(r"graph 'broken', node 'step': line 10, column 29 of \S*broken\.yaml",
                        error["location"]), error

    [run] = await client.runs.list(thread["thread_id"])
    assert run["status"] == "error"
    [line] = failure_lines(srv, run["run_id"])
    assert "WARN" in line, line
    # Text fields are quoted by tracing's formatter; ids are not.
    for field in (f"run_id={run['run_id']}", f"thread_id={thread['thread_id']}", 'graph="broken"',
                  'node="step"', 'error="ScriptError"', 'error_message="Function not found',
                  "location=\"graph 'broken', node 'step': line 10, column 29 of "):
        assert field in line, (field, line)


async def test_a_failed_python_runs_log_line_names_the_node_that_raised(python_server):
    """A LangGraph Python graph's failure is logged as a graph file's is: the node whose task
    raised (from the note LangGraph adds to the exception), the class, the message."""
    client = get_client(url=python_server.base_url)
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], "fail", input={"n": 0})
    await client.runs.join(thread["thread_id"], run["run_id"])
    assert (await client.runs.get(thread["thread_id"], run["run_id"]))["status"] == "error"
    [line] = failure_lines(python_server, run["run_id"])
    for field in (f"run_id={run['run_id']}", 'graph="fail"', 'node="boom"', 'error="ValueError"',
                  'error_message="boom"', "traceback="):
        assert field in line, (field, line)


async def test_a_failed_python_runs_log_line_says_the_exception_and_its_cause_first(extras_server):
    """The line starts with what failed, the exception and what it came from, though clients
    see only the class of an exception that may carry secrets; the traceback follows as the
    lines a person reads in `dev` (SQLite here), and is one field of the one line in `serve`
    (PostgreSQL), where log tools keep a record whole only when it is one line."""
    client = get_client(url=extras_server.base_url)
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], "unreachable", input={})
    await client.runs.join(thread["thread_id"], run["run_id"])
    [line] = failure_lines(extras_server, run["run_id"])
    assert line.split("run failed: ", 1)[1].startswith(
        "APIConnectionError: Connection error., caused by OSError: [Errno -2] Name or service not known "
        f"run_id={run['run_id']}"
    ), line
    assert 'error="APIConnectionError"' in line and 'node="node"' in line, line
    if extras_server.backend == "sqlite":
        assert line.endswith("traceback="), line
        output = [ANSI.sub("", out) for out in extras_server.output().splitlines()]
        after = output[output.index(line) + 1:][:300]
        assert after[0] == "Traceback (most recent call last):", after
        assert '    raise APIConnectionError("Connection error.") from e' in after, after
        assert any(out.endswith("APIConnectionError: Connection error.") for out in after), after
    else:
        assert 'traceback="Traceback (most recent call last):\\n' in line, line
        assert "APIConnectionError: Connection error." in line.split("traceback=", 1)[1], line
