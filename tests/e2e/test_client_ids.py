"""Ids a client chooses for its threads and assistants (issue 26, item 18).

The interface's path parameters are strings and Aegra takes any string as an id; agent UIs
name threads after their own conversations. Spindle takes 1 to 128 characters of
`[A-Za-z0-9._:-]` at creation (generated ids stay UUIDs), and an unknown id of any form is 404.
Everything a thread or an assistant offers works under such an id, on both backends.
"""

from __future__ import annotations

import uuid

import pytest
from e2e_util import assert_status, describe
from langgraph_sdk.errors import NotFoundError


def _own_id(kind: str) -> str:
    return f"{kind}:{uuid.uuid4().hex[:12]}.v1_x-y"


async def test_a_thread_named_by_its_client_works_as_any_other(client, tag):
    """Create, run, read state and history, stream, search, copy and delete under an own id."""
    tid = _own_id("chat")
    created = await client.threads.create(thread_id=tid, metadata={"tag": tag})
    assert created["thread_id"] == tid
    assert (await client.threads.get(tid))["thread_id"] == tid

    result = await client.runs.wait(tid, "chain", input={"n": 1})
    assert result["n"] == 4
    state = await client.threads.get_state(tid)
    assert state["values"]["n"] == 4
    assert state["checkpoint"]["thread_id"] == tid
    history = await client.threads.get_history(tid)
    assert len(history) >= 2 and all(h["checkpoint"]["thread_id"] == tid for h in history)

    parts = [p async for p in client.runs.stream(tid, "chain", input={"n": 10}, stream_mode="values")]
    assert parts[-1].data["n"] == 13
    runs = await client.runs.list(tid)
    assert len(runs) == 2 and all(r["thread_id"] == tid for r in runs)
    joined = [p async for p in client.runs.join_stream(tid, runs[0]["run_id"])]
    assert joined, "a join of an ended run replays its events"

    found = await client.threads.search(metadata={"tag": tag})
    assert [t["thread_id"] for t in found] == [tid]
    assert [t["thread_id"] for t in await client.threads.search(ids=[tid])] == [tid]

    copy = await client.threads.copy(tid)
    uuid.UUID(copy["thread_id"])  # a generated id stays a UUID
    assert (await client.threads.get_state(copy["thread_id"]))["values"]["n"] == 13

    await client.threads.delete(tid)
    with pytest.raises(NotFoundError):
        await client.threads.get(tid)
    assert (await client.threads.get_state(copy["thread_id"]))["values"]["n"] == 13


async def test_an_assistant_named_by_its_client_runs_and_schedules(client, tag):
    """An assistant created with an own id is found, versioned, run and used by a cron."""
    aid = _own_id("assistant")
    created = await client.assistants.create("chain", assistant_id=aid, name="mine", metadata={"tag": tag})
    assert created["assistant_id"] == aid
    assert (await client.assistants.get(aid))["name"] == "mine"
    await client.assistants.update(aid, name="renamed")
    assert [v["version"] for v in await client.assistants.get_versions(aid)] == [2, 1]
    assert (await client.assistants.get_graph(aid))["nodes"]

    thread = await client.threads.create(metadata={"tag": tag})
    assert (await client.runs.wait(thread["thread_id"], aid, input={"n": 0}))["n"] == 3
    runs = await client.runs.list(thread["thread_id"])
    assert runs[0]["assistant_id"] == aid
    # A run on an existing thread names its assistant in the thread's metadata (item 6).
    assert (await client.threads.get(thread["thread_id"]))["metadata"]["assistant_id"] == aid

    cron = await client.crons.create(aid, schedule="0 0 1 1 *", input={"n": 0}, enabled=False)
    assert cron["assistant_id"] == aid
    assert [c["cron_id"] for c in await client.crons.search(assistant_id=aid)] == [cron["cron_id"]]

    await client.assistants.delete(aid)
    with pytest.raises(NotFoundError):
        await client.assistants.get(aid)
    assert await client.crons.search(assistant_id=aid) == []


async def test_a_uuid_in_capitals_names_the_same_thread(client):
    """UUIDs are kept in their canonical form, as when ids were UUIDs only."""
    tid = str(uuid.uuid4())
    await client.threads.create(thread_id=tid.upper())
    assert (await client.threads.get(tid.upper()))["thread_id"] == tid
    assert (await client.threads.get(tid))["thread_id"] == tid


@pytest.mark.parametrize(
    "bad",
    ["", "has space", "slash/inside", "é", "x" * 129],
    ids=["empty", "space", "slash", "non-ascii", "too-long"],
)
def test_an_id_out_of_the_alphabet_is_refused_at_creation(http, bad):
    """A thread or an assistant id that cannot be one is a 422 naming the field; nothing is made."""
    before = http.post("/threads/count", json={}).json()
    r = http.post("/threads", json={"thread_id": bad})
    assert_status(r, 422)
    assert r.json()["detail"][0]["loc"] == ["body", "thread_id"]
    assert http.post("/threads/count", json={}).json() == before
    r = http.post("/assistants", json={"graph_id": "chain", "assistant_id": bad})
    assert_status(r, 422)
    assert r.json()["detail"][0]["loc"] == ["body", "assistant_id"]


def test_the_longest_id_is_accepted(http):
    tid = "t" + uuid.uuid4().hex + "x" * (128 - 33)
    assert len(tid) == 128
    assert_status(http.post("/threads", json={"thread_id": tid}), 200)
    assert_status(http.get(f"/threads/{tid}"), 200)


def test_an_assistant_cannot_take_a_graphs_id(http):
    """A graph's id names its default assistant, so an assistant of that id could not be reached."""
    r = http.post("/assistants", json={"graph_id": "chain", "assistant_id": "echo"})
    assert_status(r, 422)
    assert r.json()["detail"][0]["loc"] == ["body", "assistant_id"]


@pytest.mark.parametrize("unknown", ["never-made", str(uuid.UUID(int=7)), "has%20space", "x" * 200])
def test_an_unknown_id_of_any_form_is_not_found(http, unknown):
    """Unknown ids, well formed or not, are 404 on every kind of path, never 422."""
    for method, path in [
        ("GET", f"/threads/{unknown}"),
        ("PATCH", f"/threads/{unknown}"),
        ("POST", f"/threads/{unknown}/copy"),
        ("GET", f"/threads/{unknown}/state"),
        ("GET", f"/threads/{unknown}/runs"),
        ("POST", f"/threads/{unknown}/history"),
        ("DELETE", f"/threads/{unknown}"),
        ("GET", f"/assistants/{unknown}"),
        ("GET", f"/assistants/{unknown}/graph"),
        ("POST", f"/assistants/{unknown}/versions"),
    ]:
        r = http.request(method, path, json={} if method in ("POST", "PATCH") else None)
        assert r.status_code == 404, f"{method} {path}: {describe(r)}"
    r = http.post("/threads/any-thread/runs/wait", json={"assistant_id": unknown, "input": {}})
    assert_status(r, 404)
