"""The thread event stream across a server restart: the events of runs before the restart
come back with the same seq and envelope, `since` still resumes exactly, and the runs after
the restart continue the numbering. Starts its own spindle processes."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import harness
import httpx
import pytest
from test_thread_events import ALL_CHANNELS, AGENT_INPUT, EventReader, check_envelopes, command, ended, ok

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request):
    workdir = Path(tempfile.mkdtemp(prefix=f"spindle-e2e-v2-{request.param}-"))
    dbname = None
    if request.param == "postgres":
        if not harness.POSTGRES_URL:
            pytest.skip(harness.POSTGRES_SKIP_REASON)
        dbname = harness.create_database()
        url = harness.pg_url_with_db(harness.POSTGRES_URL, dbname)
    else:
        url = str(workdir / "spindle.db")
    try:
        yield request.param, workdir, url
    finally:
        if dbname:
            harness.drop_database(dbname)
        shutil.rmtree(workdir, ignore_errors=True)


def serve(storage):
    backend, workdir, url = storage
    return harness.start(backend, lambda port: ["serve", "--host", "127.0.0.1", "--port", str(port),
                                                "--database-url", url, "--examples"], workdir)


def test_events_and_seqs_survive_a_restart(storage):
    srv = serve(storage)
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            tid = http.post("/threads", json={}).json()["thread_id"]
            reader = EventReader(srv.base_url, tid, {"channels": ALL_CHANNELS}, until=ended())
            ok(command(http, tid, "run.start", {"assistant_id": "approval", "input": AGENT_INPUT}))
            before = reader.wait()
            # Stop only once the run's end is committed (live events reach the stream first).
            deadline = time.monotonic() + 20
            while http.get(f"/threads/{tid}").json()["status"] != "interrupted":
                assert time.monotonic() < deadline, "the run did not end"
                time.sleep(0.05)
    finally:
        harness.stop(srv)
    interrupt = [f["data"]["params"]["data"] for f in before if f["event"] == "input.requested"][0]

    srv = serve(storage)
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            replay = EventReader(srv.base_url, tid, {"channels": ALL_CHANNELS}, until=ended()).wait()
            assert [(f["id"], f["data"]) for f in replay] == [(f["id"], f["data"]) for f in before]
            # Resume after the interrupt with `since`, answer it, and see the rest once.
            cut = before[-1]["id"]
            rest = EventReader(srv.base_url, tid, {"channels": ALL_CHANNELS, "since": cut}, until=ended())
            ok(command(http, tid, "input.respond", {"namespace": [], "interrupt_id": interrupt["interrupt_id"],
                                                   "response": "after restart"}))
            after = rest.wait()
            assert after and after[0]["id"] > cut
            check_envelopes(before + after)
            values = [f["data"]["params"]["data"] for f in after if f["event"] == "values"]
            assert values[-1]["messages"][-1]["content"] == "decision: after restart"
    finally:
        harness.stop(srv)
