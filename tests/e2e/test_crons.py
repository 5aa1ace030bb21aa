"""Crons through the official Python client (langgraph-sdk): every endpoint and limit, schedules
firing on time (a 1-second schedule counted over a window), time zones, end_time, and one firing
per due time with two server processes on one PostgreSQL database."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import harness
import httpx
import pytest
from e2e_util import (
    assert_status,
    assert_validation_error,
    default_assistant_id,
    describe,
    execute_sql,
)
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError

INPUT = {"messages": [{"role": "user", "content": "tick"}]}
CRON_KEYS = {
    "cron_id", "assistant_id", "thread_id", "user_id", "end_time", "schedule", "timezone",
    "payload", "next_run_date", "metadata", "on_run_completed", "enabled", "created_at", "updated_at",
}


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


async def thread_runs(client, thread_id: str) -> list[dict]:
    return await client.runs.list(thread_id, limit=1000)


async def test_thread_cron_runs_at_once_and_answers_the_run(client, tag):
    """An enabled cron on a thread triggers its first run at once; the answer is that Run,
    carrying the new cron_id."""
    thread = await client.threads.create()
    run = await client.crons.create_for_thread(
        thread["thread_id"], "echo", schedule="0 0 1 1 *", input=INPUT, metadata={"tag": tag}
    )
    assert run["thread_id"] == thread["thread_id"]
    assert run["assistant_id"] == default_assistant_id("echo")
    uuid.UUID(run["run_id"])
    got = await client.runs.get(thread["thread_id"], run["run_id"])
    assert got["run_id"] == run["run_id"]
    await client.runs.join(thread["thread_id"], run["run_id"])

    crons = await client.crons.search(thread_id=thread["thread_id"])
    assert [c["cron_id"] for c in crons] == [run["cron_id"]]
    cron = crons[0]
    assert CRON_KEYS <= set(cron), CRON_KEYS - set(cron)
    assert cron["schedule"] == "0 0 1 1 *" and cron["enabled"] is True
    assert cron["metadata"] == {"tag": tag}
    assert cron["payload"]["input"] == INPUT
    assert cron["on_run_completed"] is None
    next_run = parse(cron["next_run_date"])
    assert next_run.utcoffset() == timedelta(0)
    assert (next_run.month, next_run.day, next_run.hour, next_run.minute) == (1, 1, 0, 0)


async def test_disabled_thread_cron_answers_the_cron(client):
    """With enabled=false the cron is stored, no run starts, and the answer is the Cron."""
    thread = await client.threads.create()
    cron = await client.crons.create_for_thread(
        thread["thread_id"], "echo", schedule="* * * * * *", input=INPUT, enabled=False
    )
    assert CRON_KEYS <= set(cron) and cron["enabled"] is False
    time.sleep(2.5)
    assert await thread_runs(client, thread["thread_id"]) == []


async def test_cron_without_thread_get_update_delete(client, http, tag):
    """A cron without a thread is read, updated field by field (end_time cleared by null,
    payload fields replaced) and deleted (then 404)."""
    cron = await client.crons.create(
        "echo", schedule="0 9 * * 1", input=INPUT, metadata={"tag": tag}, enabled=False
    )
    assert cron["thread_id"] is None and cron["on_run_completed"] == "delete"
    cron_id = cron["cron_id"]
    r = http.get(f"/runs/crons/{cron_id}")
    assert_status(r, 200)
    assert r.json()["cron_id"] == cron_id

    end = datetime.now(timezone.utc) + timedelta(days=30)
    updated = await client.crons.update(
        cron_id, schedule="30 8 * * *", end_time=end, input={"messages": []},
        on_run_completed="keep", timezone="Europe/Paris",
    )
    assert updated["schedule"] == "30 8 * * *" and updated["timezone"] == "Europe/Paris"
    assert abs(parse(updated["end_time"]) - end) < timedelta(milliseconds=1)
    assert updated["payload"]["input"] == {"messages": []}
    assert updated["on_run_completed"] == "keep"
    assert updated["enabled"] is False
    paris = parse(updated["next_run_date"]).astimezone(ZoneInfo("Europe/Paris"))
    assert (paris.hour, paris.minute) == (8, 30)

    cleared = await client.crons.update(cron_id, end_time=None)
    assert cleared["end_time"] is None
    assert cleared["schedule"] == "30 8 * * *", "fields not given stay"

    await client.crons.delete(cron_id)
    assert_status(http.get(f"/runs/crons/{cron_id}"), 404)
    with pytest.raises(NotFoundError):
        await client.crons.delete(cron_id)


async def test_search_and_count(client, tag):
    """Search filters by assistant (id or graph id), thread, enabled and metadata, pages, sorts
    and selects; count agrees."""
    thread = await client.threads.create()
    a = await client.crons.create_for_thread(
        thread["thread_id"], "echo", schedule="0 0 1 1 *", input=INPUT, metadata={"tag": tag, "n": 1}, enabled=False
    )
    b = await client.crons.create("chain", schedule="0 0 1 1 *", input={"n": 1}, metadata={"tag": tag, "n": 2})
    c = await client.crons.create("echo", schedule="0 0 1 1 *", input=INPUT, metadata={"tag": tag, "n": 3}, enabled=False)
    mine = {"tag": tag}
    found = await client.crons.search(metadata=mine, limit=10)
    assert [x["cron_id"] for x in found] == [c["cron_id"], b["cron_id"], a["cron_id"]], "newest first"
    asc = await client.crons.search(metadata=mine, sort_by="created_at", sort_order="asc")
    assert [x["cron_id"] for x in asc] == [a["cron_id"], b["cron_id"], c["cron_id"]]
    assert [x["cron_id"] for x in await client.crons.search(metadata=mine, assistant_id="chain")] == [b["cron_id"]]
    by_id = await client.crons.search(metadata=mine, assistant_id=default_assistant_id("echo"))
    assert {x["cron_id"] for x in by_id} == {a["cron_id"], c["cron_id"]}
    assert [x["cron_id"] for x in await client.crons.search(thread_id=thread["thread_id"])] == [a["cron_id"]]
    assert [x["cron_id"] for x in await client.crons.search(metadata=mine, enabled=True)] == [b["cron_id"]]
    assert [x["cron_id"] for x in await client.crons.search(metadata=mine, limit=1, offset=1)] == [b["cron_id"]]
    selected = await client.crons.search(metadata={"tag": tag, "n": 2}, select=["cron_id", "schedule"])
    assert selected == [{"cron_id": b["cron_id"], "schedule": "0 0 1 1 *"}]
    assert await client.crons.count(metadata=mine) == 3
    assert await client.crons.count(metadata=mine, assistant_id="echo") == 2
    assert await client.crons.count(thread_id=thread["thread_id"]) == 1
    for cron in (a, b, c):
        await client.crons.delete(cron["cron_id"])


@pytest.mark.spindle_only
async def test_limits_and_bad_input_are_422_and_write_nothing(client, http, tag):
    """The interface's limits (maxLength 256, 2048, 64), the on_run_completed enumeration, the
    schedule's syntax and the time zone's name: 422 naming the field, nothing stored."""
    thread = await client.threads.create()
    good = {"assistant_id": "echo", "schedule": "* * * * *", "metadata": {"tag": tag}, "enabled": False}
    cases = [
        ({"assistant_id": "a" * 257}, "assistant_id"),
        ({"schedule": "1 " * 128 + "1"}, "schedule"),
        ({"schedule": "every day"}, "schedule"),
        ({"schedule": "61 * * * *"}, "schedule"),
        ({"timezone": "T" * 65}, "timezone"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"webhook": "https://example.com/" + "a" * 2040}, "webhook"),
        ({"multitask_strategy": "x" * 257}, "multitask_strategy"),
        ({"multitask_strategy": "sometimes"}, "multitask_strategy"),
        ({"on_run_completed": "maybe"}, "on_run_completed"),
        ({"end_time": "tomorrow"}, "end_time"),
        ({"enabled": "perhaps"}, "enabled"),
        ({"stream_mode": "everything"}, "stream_mode"),
    ]
    for change, field in cases:
        body = {**good, **change}
        assert_validation_error(http.post("/runs/crons", json=body), "body", field)
        assert_validation_error(http.post(f"/threads/{thread['thread_id']}/runs/crons", json=body), "body", field)
    assert await client.crons.count(metadata={"tag": tag}) == 0
    assert await thread_runs(client, thread["thread_id"]) == []

    cron = await client.crons.create("echo", schedule="* * * * *", metadata={"tag": tag}, enabled=False)
    for change, field in [
        ({"schedule": "x" * 257}, "schedule"),
        ({"schedule": "nope"}, "schedule"),
        ({"timezone": "Nowhere/Land"}, "timezone"),
        ({"webhook": "https://example.com/" + "a" * 2040}, "webhook"),
        ({"multitask_strategy": "y" * 257}, "multitask_strategy"),
        ({"end_time": "soon"}, "end_time"),
    ]:
        assert_validation_error(http.patch(f"/runs/crons/{cron['cron_id']}", json=change), "body", field)
    assert (await client.crons.search(metadata={"tag": tag}))[0]["schedule"] == "* * * * *"
    assert_status(http.post("/threads/" + str(uuid.uuid4()) + "/runs/crons", json=good), 404)
    assert_status(http.get(f"/runs/crons/{uuid.uuid4()}"), 404)
    assert_validation_error(http.get("/runs/crons/not-a-uuid"), "path", "cron_id")
    await client.crons.delete(cron["cron_id"])


@pytest.mark.spindle_only
async def test_a_bad_body_is_422_before_its_assistant_is_looked_up(client, http, tag):
    """As the reference validates a body first: a cron whose webhook is no http(s) URL, or
    whose schedule is not one, is a 422 naming the field even when its assistant does not
    exist (a body that is valid but names no assistant is the 404)."""
    thread = await client.threads.create()
    missing = str(uuid.uuid4())
    with pytest.raises(UnprocessableEntityError):
        await client.crons.create(missing, schedule="0 0 1 1 *", webhook="file:///etc/passwd")
    with pytest.raises(UnprocessableEntityError):
        await client.crons.create_for_thread(thread["thread_id"], missing, schedule="0 0 1 1 *",
                                             webhook="file:///etc/passwd")
    for change, field in [({"webhook": "file:///etc/passwd"}, "webhook"), ({"schedule": "every day"}, "schedule")]:
        body = {"assistant_id": missing, "schedule": "0 0 1 1 *", "metadata": {"tag": tag}, **change}
        for path in ["/runs/crons", f"/threads/{thread['thread_id']}/runs/crons"]:
            assert_validation_error(http.post(path, json=body), "body", field)
    with pytest.raises(NotFoundError):
        await client.crons.create(missing, schedule="0 0 1 1 *", metadata={"tag": tag})
    assert await client.crons.count(metadata={"tag": tag}) == 0
    assert await thread_runs(client, thread["thread_id"]) == []


async def test_time_zone_sets_next_run_date_in_utc(client):
    """A schedule is read in its time zone, across daylight saving; next_run_date is UTC."""
    cron = await client.crons.create(
        "echo", schedule="0 9 * * *", input=INPUT, timezone="America/New_York", enabled=False
    )
    next_run = parse(cron["next_run_date"])
    assert next_run.utcoffset() == timedelta(0)
    local = next_run.astimezone(ZoneInfo("America/New_York"))
    assert (local.hour, local.minute) == (9, 0)
    now = datetime.now(timezone.utc)
    assert now < next_run <= now + timedelta(days=1, hours=1)
    await client.crons.delete(cron["cron_id"])


def expected_firings(start: float, stop: float) -> int:
    """Whole seconds strictly after `start` and at or before `stop`: the due times of a
    1-second schedule while the cron was enabled."""
    return int(stop) - int(start)


async def count_fired(client, schedule_seconds: float, **create):
    """Creates an every-second cron on a new thread, lets it run `schedule_seconds`, disables
    it, waits for the runs to settle and answers (runs, expected firings)."""
    thread = await client.threads.create()
    start = time.time()
    first = await client.crons.create_for_thread(
        thread["thread_id"], "echo", schedule="* * * * * *", input=INPUT, **create
    )
    time.sleep(schedule_seconds)
    await client.crons.update(first["cron_id"], enabled=False)
    stop = time.time()
    time.sleep(2)
    runs = await thread_runs(client, thread["thread_id"])
    await client.crons.delete(first["cron_id"])
    return first, runs, expected_firings(start, stop)


async def test_firing_left_by_a_dead_scheduler_is_made_once(server, client):
    """A firing claimed by a scheduler that died before creating its run (the cron's
    `next_run_date` already moved on) is taken over once its claim is old, and made exactly
    once: one more run on the cron's thread, and nothing left in flight."""
    thread = await client.threads.create()
    first = await client.crons.create_for_thread(
        thread["thread_id"], "echo", schedule="0 0 1 1 *", input=INPUT
    )
    await client.runs.join(thread["thread_id"], first["run_id"])
    cron_id = first["cron_id"]
    due = "2026-01-01T00:00:00+00:00"
    claimed_long_ago = "2000-01-01T00:00:00+00:00"
    cast = "::timestamptz" if server.backend == "postgres" else ""
    id_cast = "::uuid" if server.backend == "postgres" else ""
    execute_sql(
        server,
        f"UPDATE crons SET firing_due = ?{cast}, firing_claimed_at = ?{cast} WHERE cron_id = ?{id_cast}",
        (due, claimed_long_ago, cron_id),
    )
    server_poll_and_run = 15
    deadline = time.monotonic() + server_poll_and_run
    while len(await thread_runs(client, thread["thread_id"])) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    # Several scheduler polls more: a firing made twice would show up by now.
    time.sleep(2.5)
    runs = await thread_runs(client, thread["thread_id"])
    assert len(runs) == 2, runs
    left = execute_sql(
        server, f"SELECT firing_due FROM crons WHERE cron_id = ?{id_cast}", (cron_id,)
    )
    assert left == [(None,)], left


async def test_one_second_schedule_fires_once_per_second(client):
    """A 6-field schedule with seconds fires about once per second, no more: the first run at
    creation, then one per due time while enabled (a loaded machine may merge late ones)."""
    first, runs, expected = await count_fired(client, 5)
    assert any(r["run_id"] == first["run_id"] for r in runs)
    scheduled = len(runs) - 1
    assert expected - 3 <= scheduled <= expected + 1, f"{scheduled} firings for {expected} due times"
    assert {r["status"] for r in runs} <= {"pending", "running", "success"}


async def test_end_time_stops_firing(client):
    """No run is due after end_time: firings stop, and a cron created past it never fires."""
    thread = await client.threads.create()
    end = datetime.now(timezone.utc) + timedelta(seconds=2)
    first = await client.crons.create_for_thread(
        thread["thread_id"], "echo", schedule="* * * * * *", input=INPUT, end_time=end
    )
    time.sleep(4)
    settled = len(await thread_runs(client, thread["thread_id"]))
    assert 1 <= settled <= 4, settled
    time.sleep(2.5)
    assert len(await thread_runs(client, thread["thread_id"])) == settled
    await client.crons.delete(first["cron_id"])

    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    other = await client.threads.create()
    cron = await client.crons.create_for_thread(
        other["thread_id"], "echo", schedule="* * * * * *", input=INPUT, end_time=past
    )
    time.sleep(2.5)
    assert await thread_runs(client, other["thread_id"]) == []
    await client.crons.delete(cron["cron_id"])


async def test_cron_without_thread_runs_on_new_threads(client, tag):
    """Each firing of a cron without a thread, and its first run at creation, runs on a new
    thread, kept with on_run_completed=keep (a run's thread carries the graph and assistant
    in its metadata)."""
    before = {t["thread_id"] for t in await client.threads.search(metadata={"graph_id": "chain"}, limit=1000)}
    cron = await client.crons.create(
        "chain", schedule="* * * * * *", input={"n": 1}, on_run_completed="keep", metadata={"tag": tag}
    )
    time.sleep(3.5)
    await client.crons.update(cron["cron_id"], enabled=False)
    time.sleep(1.5)
    after = await client.threads.search(metadata={"graph_id": "chain"}, limit=1000)
    new = [t for t in after if t["thread_id"] not in before]
    # The first run at creation, then up to one per second.
    assert 2 <= len(new) <= 6, len(new)
    for t in new:
        runs = await thread_runs(client, t["thread_id"])
        assert len(runs) == 1 and runs[0]["metadata"] == {"tag": tag}
    await client.crons.delete(cron["cron_id"])


@pytest.fixture
def two_servers_on_one_database():
    """Two `spindle serve` processes on one fresh PostgreSQL database."""
    if not harness.POSTGRES_URL:
        pytest.skip(harness.POSTGRES_SKIP_REASON)
    import tempfile
    from pathlib import Path

    dbname = harness.create_database()
    url = harness.pg_url_with_db(harness.POSTGRES_URL, dbname)
    servers = []
    try:
        for _ in range(2):
            workdir = Path(tempfile.mkdtemp(prefix="spindle-e2e-cron-pair-"))
            servers.append(
                harness.start(
                    "postgres",
                    lambda port: ["serve", "--host", "127.0.0.1", "--port", str(port), "--database-url", url,
                                  "--examples"],
                    workdir,
                )
            )
        yield servers
    finally:
        for srv in servers:
            harness.stop(srv)
        harness.drop_database(dbname)


@pytest.mark.spindle_only
async def test_two_processes_fire_each_due_time_once(two_servers_on_one_database):
    """With two server processes on one PostgreSQL database, each due time fires once: the
    runs of an every-second cron number about the seconds it was enabled, not twice that."""
    a, b = two_servers_on_one_database
    client = get_client(url=a.base_url, api_key=None, timeout=30)
    other = get_client(url=b.base_url, api_key=None, timeout=30)
    try:
        # Both processes see the cron (one database); both schedulers run.
        first, runs, expected = await count_fired(client, 6)
        assert (await other.runs.get(first["thread_id"], first["run_id"]))["run_id"] == first["run_id"]
        scheduled = len(runs) - 1
        assert expected - 3 <= scheduled <= expected + 1, f"{scheduled} firings for {expected} due times"
    finally:
        await client.aclose()
        await other.aclose()


async def test_cron_without_thread_answers_its_first_run(client, http, tag):
    """`POST /runs/crons` answers as the thread cron does: an enabled cron's first run, at once,
    on a new thread, with `cron_id` (the cron with enabled false); the payload keeps the time
    zone as well as the schedule."""
    run = await client.crons.create(
        "chain", schedule="0 9 * * *", timezone="Europe/Paris", input={"n": 1},
        metadata={"tag": tag}, on_run_completed="keep",
    )
    uuid.UUID(run["run_id"])
    assert run["assistant_id"] == default_assistant_id("chain")
    assert run["metadata"] == {"tag": tag}
    assert await client.runs.join(run["thread_id"], run["run_id"]) == {"n": 4}
    cron = (await client.crons.search(metadata={"tag": tag}))[0]
    assert cron["cron_id"] == run["cron_id"] and cron["thread_id"] is None
    assert cron["payload"]["timezone"] == "Europe/Paris"
    assert cron["payload"]["schedule"] == "0 9 * * *"
    updated = await client.crons.update(cron["cron_id"], timezone="Asia/Tokyo")
    assert updated["payload"]["timezone"] == "Asia/Tokyo"
    await client.crons.delete(cron["cron_id"])

    disabled = await client.crons.create("chain", schedule="0 9 * * *", metadata={"tag": tag}, enabled=False)
    assert CRON_KEYS <= set(disabled) and "run_id" not in disabled
    await client.crons.delete(disabled["cron_id"])


@pytest.mark.spindle_only
async def test_a_crons_runs_are_checked_as_runs_are(client, http, tag):
    """A cron's run parameters pass a run's checks, at creation and at update: metadata limits
    (33 keys, a key "bad key") and a webhook no run may reach are 422 naming the field, and
    nothing is stored or changed."""
    thread = await client.threads.create()
    good = {"assistant_id": "echo", "schedule": "0 0 1 1 *", "metadata": {"tag": tag}}
    many = {f"k{i}": i for i in range(32)} | {"tag": tag}
    cases = [
        ({"metadata": many}, ["metadata"]),
        ({"metadata": {"tag": tag, "bad key": 1}}, ["metadata", "bad key"]),
        ({"metadata": {"tag": tag, "deep": {"a": 1}}}, ["metadata", "deep"]),
        ({"webhook": "http://169.254.169.254/x"}, ["webhook"]),
        ({"webhook": "http://127.0.0.1:9/hook"}, ["webhook"]),
        ({"webhook": "http://10.1.2.3/hook"}, ["webhook"]),
        ({"webhook": "http://[::1]:9/hook"}, ["webhook"]),
    ]
    for change, loc in cases:
        for path in ["/runs/crons", f"/threads/{thread['thread_id']}/runs/crons"]:
            for enabled in (True, False):
                r = http.post(path, json={**good, **change, "enabled": enabled})
                detail = assert_validation_error(r, "body", loc[0])
                assert any(item["loc"][1:] == loc for item in detail), describe(r)
    assert await client.crons.count(thread_id=thread["thread_id"]) == 0
    assert await client.crons.search(metadata={"tag": tag}) == []
    assert await thread_runs(client, thread["thread_id"]) == []

    cron = await client.crons.create("echo", schedule="0 0 1 1 *", metadata={"tag": tag}, enabled=False)
    for change, loc in cases:
        r = http.patch(f"/runs/crons/{cron['cron_id']}", json=change)
        detail = assert_validation_error(r, "body", loc[0])
        assert any(item["loc"][1:] == loc for item in detail), describe(r)
    got = http.get(f"/runs/crons/{cron['cron_id']}").json()
    assert got["metadata"] == {"tag": tag} and "webhook" not in got["payload"], got
    await client.crons.delete(cron["cron_id"])
