"""Several `spindle serve` processes on one PostgreSQL database: what a client changes through
one process, the others' runs see.
"""

from __future__ import annotations

import os

import harness
import httpx
import pytest
from langgraph_sdk import get_client

pytestmark = [
    pytest.mark.skipif(not harness.POSTGRES_URL, reason=harness.POSTGRES_SKIP_REASON),
    pytest.mark.skipif(
        bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
        reason="starts its own spindle processes",
    ),
]


@pytest.fixture
def two_processes(tmp_path):
    with harness.serve_on_one_database(2, tmp_path) as servers:
        yield servers


async def edition_seen_by_a_run(client, assistant_id: str) -> str:
    """The assistant metadata's `edition` as a new run of it saw it (a run's checkpoints carry
    its assistant's metadata)."""
    thread = await client.threads.create()
    await client.runs.wait(thread["thread_id"], assistant_id, input={"n": 1})
    state = await client.threads.get_state(thread["thread_id"])
    return state["metadata"]["edition"]


async def test_runs_use_the_assistant_as_another_process_last_changed_it(two_processes):
    # A process keeps the assistants its runs were made from; a change made through another
    # process must still reach its next run, as it does on a single process.
    a, b = (get_client(url=server.base_url) for server in two_processes)
    assistant = await a.assistants.create("chain", metadata={"edition": "first"})
    assistant_id = assistant["assistant_id"]
    assert await edition_seen_by_a_run(a, assistant_id) == "first"

    await b.assistants.update(assistant_id, metadata={"edition": "second"})
    assert await edition_seen_by_a_run(a, assistant_id) == "second"

    await b.assistants.set_latest(assistant_id, 1)
    assert await edition_seen_by_a_run(a, assistant_id) == "first"

    await b.assistants.delete(assistant_id)
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await edition_seen_by_a_run(a, assistant_id)
    assert refused.value.response.status_code == 404
