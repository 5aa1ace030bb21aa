"""`/openapi.json` describes what is served: schemathesis fuzzes every operation the document
lists against a real server, on each backend, and finds no server error and no response,
status or content type the document does not describe.

Checks and their exceptions are in ``schemathesis.toml`` (beside this file, with the reasons),
the generation hooks in ``schemathesis_hooks.py``. Environment:

- ``SPINDLE_SCHEMATHESIS_EXAMPLES``: test cases per operation and phase (default 10);
- ``SPINDLE_SCHEMATHESIS_SEED``: the seed (default fixed, so a failure reproduces; ``random``
  for a new one each run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import harness
import httpx
import pytest
from conftest import BACKENDS, EXTERNAL_URL, _session_server
from langgraph_sdk.errors import UnprocessableEntityError

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "schemathesis.toml"
EXAMPLES = int(os.environ.get("SPINDLE_SCHEMATHESIS_EXAMPLES", "10"))
SEED = os.environ.get("SPINDLE_SCHEMATHESIS_SEED", "26")
# The whole run's bound; a run takes about a minute per backend.
TIMEOUT = 600


@pytest.fixture(scope="module", params=BACKENDS)
def fuzzed_server(request):
    """A server of its own: the fuzzer creates, changes and deletes whatever it likes (prunes
    threads, makes crons that fire), which no other test should see."""
    yield from _session_server(request.param)


def _thread_with_a_run(http: httpx.Client, run: dict) -> str:
    thread_id = http.post("/threads", json={}).json()["thread_id"]
    done = http.post(f"/threads/{thread_id}/runs/wait", json=run)
    assert done.status_code == 200, done.text
    return thread_id


@pytest.mark.skipif(bool(EXTERNAL_URL), reason="sends its examples to a server of its own")
def test_every_request_body_has_an_example_that_works(fuzzed_server: harness.Server):
    """What `/docs` puts in "Try it out" works as it stands, once the path's ids are filled in
    (a thread that has run the graph, an assistant, a cron): 2xx, every operation. Before the
    fuzzer, which may leave the server in any state (the example graph's assistant deleted)."""
    with httpx.Client(base_url=fuzzed_server.base_url, timeout=30) as http:
        doc = http.get("/openapi.json").json()
        bodies = {
            (method.upper(), path): op["requestBody"]["content"]["application/json"]
            for path, item in doc["paths"].items()
            for method, op in item.items()
            if isinstance(op, dict) and "requestBody" in op
        }
        missing = [op for op, content in bodies.items() if "example" not in content]
        assert not missing, f"request bodies without an example: {missing}"

        run = bodies[("POST", "/threads/{thread_id}/runs/wait")]["example"]
        assistant_id = http.post("/assistants", json={"graph_id": "agent"}).json()["assistant_id"]
        cron = http.post("/runs/crons", json=bodies[("POST", "/runs/crons")]["example"])
        assert cron.status_code == 200, cron.text
        cron_id = cron.json()["cron_id"]
        refused = {}
        for (method, path), content in bodies.items():
            example = content["example"]
            thread_id = _thread_with_a_run(http, run) if "{thread_id}" in path else None
            if path == "/threads/prune":
                thread_id = _thread_with_a_run(http, run)
                example = {**example, "thread_ids": [thread_id]}
            url = (
                path.replace("{assistant_id}", assistant_id)
                .replace("{cron_id}", cron_id)
                .replace("{thread_id}", thread_id or "")
            )
            with http.stream(method, url, json=example) as answer:
                if not 200 <= answer.status_code < 300:
                    refused[f"{method} {path}"] = (answer.status_code, answer.read().decode()[:300])
        for cron in http.post("/runs/crons/search", json={"limit": 1000}).json():
            http.delete(f"/runs/crons/{cron['cron_id']}")
    assert not refused, refused

@pytest.mark.skipif(bool(EXTERNAL_URL), reason="fuzzes a server of its own")
def test_the_document_describes_what_is_served(fuzzed_server: harness.Server, tmp_path: Path):
    report = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "schemathesis.cli",
        "--config-file", str(CONFIG),
        "--no-color",
        "run", f"{fuzzed_server.base_url}/openapi.json",
        "--max-examples", str(EXAMPLES),
        "--request-timeout", "20",
        "--report", "json", "--report-json-path", str(report),
        "--warnings", "off",
    ]
    if SEED != "random":
        command += ["--seed", SEED]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    output = harness.tail(run.stdout + run.stderr, 20_000)
    assert report.exists(), f"schemathesis wrote no report (exit {run.returncode}):\n{output}"
    result = json.loads(report.read_text())

    operations = result["operations"]
    assert operations["tested"] == operations["total"] > 0, f"operations not tested: {operations}\n{output}"
    assert not result["errors"], f"schemathesis could not test everything:\n{output}"
    failures = {f["title"]: f["operations"] for f in result["failures"]}
    assert not failures, f"the document and the server disagree: {failures}\n{output}"
    assert result["complete"] and run.returncode == 0, output



async def test_the_webhook_field_says_what_the_server_checks(http, webhook_client):
    """`webhook` is documented as the server reads it (`minLength`, an http(s) scheme and a
    host: `pattern`), so a value the document allows is not refused for its syntax, and the
    server refuses what it does not allow; `""` too, as the reference does (`minLength: 1`)."""
    field = http.get("/openapi.json").json()["components"]["schemas"]["RunCreate"]["properties"][
        "webhook"
    ]
    assert field["minLength"] == 1 and field["maxLength"] == 2048, field
    allowed = lambda url: len(url) >= 1 and re.search(field["pattern"], url) is not None  # noqa: E731

    thread = await webhook_client.threads.create()
    for url in ["", "http:127.0.0.1:9/hook", " http://127.0.0.1:9/hook", "ftp://127.0.0.1/x"]:
        assert not allowed(url), url
        with pytest.raises(UnprocessableEntityError) as refused:
            await webhook_client.runs.create(thread["thread_id"], "echo", input={}, webhook=url)
        assert refused.value.response.json()["detail"][0]["loc"] == ["body", "webhook"], url
    for url in ["http://127.0.0.1:9/hook", "HTTPS://127.0.0.1:9/hook?x=1"]:
        assert allowed(url), url
        run = await webhook_client.runs.create(thread["thread_id"], "echo", input={}, webhook=url)
        await webhook_client.runs.join(thread["thread_id"], run["run_id"])
