"""Large filters on every search that takes one, through the official Python client: a filter of
up to 1,000 values, nesting up to 16 levels, is answered (SQLite refused a chain of 1,000
conditions, or 30 arrays in arrays, as too deep: a 500); a larger or deeper one is refused with
a 422 naming the field, on both backends alike."""

from __future__ import annotations

import pytest
from langgraph_sdk.errors import UnprocessableEntityError

# The documented bounds (README, MAX_FILTER_VALUES and MAX_FILTER_DEPTH): values at any depth,
# levels of objects and arrays (the filter itself is the first).
MAX_VALUES = 1000
MAX_DEPTH = 16


def big(tag: str, values: int) -> dict:
    """A flat filter of `values` values, one of them the test's tag."""
    return {"tag": tag, **{f"k{i}": i for i in range(values - 1)}}


def nested(tag: str, values: int) -> dict:
    """The same count, half of it inside an array and an object (counted at any depth)."""
    half = (values - 3) // 2
    rest = values - 3 - half
    return {"tag": tag, "list": list(range(half)), "obj": {f"o{i}": i for i in range(rest)}}


def deep(tag: str, depth: int) -> dict:
    """A filter nesting `depth` levels: arrays in arrays under one key."""
    inner = ["bottom"]
    for _ in range(depth - 2):
        inner = [inner]
    return {"tag": tag, "k": inner}


async def searches(client, tag: str, filt: dict) -> dict:
    """Every search taking a filter, with `filt`, against records made to match it."""
    thread = await client.threads.create(metadata=filt)
    assistant = await client.assistants.create("echo", metadata=filt, name=tag)
    tid = (await client.threads.create(metadata={"tag": tag}))["thread_id"]
    await client.runs.wait(tid, "echo", input={"messages": [{"role": "user", "content": "hi"}]})
    # A cron's metadata is a run's (32 keys at most): the filter is answered, matching none.
    cron = await client.crons.create_for_thread(
        tid, "echo", schedule="0 0 1 1 *", metadata={"tag": tag}, input={"messages": []}
    )
    await client.store.put_item(["filters", tag], "doc", filt)
    try:
        return {
            "threads.search": [t["thread_id"] for t in await client.threads.search(metadata=filt)]
            == [thread["thread_id"]],
            "threads.count": await client.threads.count(metadata=filt) == 1,
            "threads.search values": await client.threads.search(values=filt) == [],
            "threads.count values": await client.threads.count(values=filt) == 0,
            "assistants.search": [
                a["assistant_id"] for a in await client.assistants.search(metadata=filt)
            ]
            == [assistant["assistant_id"]],
            "assistants.count": await client.assistants.count(metadata=filt) == 1,
            "assistants.get_versions": len(
                await client.assistants.get_versions(assistant["assistant_id"], metadata=filt)
            )
            == 1,
            "crons.search": await client.crons.search(metadata=filt) == [],
            "crons.count": await client.crons.count(metadata=filt) == 0,
            "threads.get_history": await client.threads.get_history(tid, metadata=filt) == [],
            "store.search_items": [
                i["key"]
                for i in (await client.store.search_items(["filters", tag], filter=filt))["items"]
            ]
            == ["doc"],
        }
    finally:
        await client.crons.delete(cron["cron_id"])


@pytest.mark.parametrize("shape", [big, nested, deep])
async def test_filters_of_the_largest_size_are_answered(client, tag, shape):
    filt = shape(tag, MAX_DEPTH if shape is deep else MAX_VALUES)
    answered = await searches(client, tag, filt)
    assert all(answered.values()), answered


# Where the filter goes in each request, and the call making it.
TOO_LARGE = {
    "threads.search metadata": ("metadata", lambda c, f: c.threads.search(metadata=f)),
    "threads.search values": ("values", lambda c, f: c.threads.search(values=f)),
    "threads.count": ("metadata", lambda c, f: c.threads.count(metadata=f)),
    "assistants.search": ("metadata", lambda c, f: c.assistants.search(metadata=f)),
    "assistants.count": ("metadata", lambda c, f: c.assistants.count(metadata=f)),
    "crons.search": ("metadata", lambda c, f: c.crons.search(metadata=f)),
    "crons.count": ("metadata", lambda c, f: c.crons.count(metadata=f)),
    "store.search_items": (
        "filter",
        lambda c, f: c.store.search_items(["filters"], filter=f),
    ),
}


@pytest.mark.spindle_only  # the reference has no bound (and a PostgreSQL-only one in effect)
@pytest.mark.parametrize("call", TOO_LARGE.values(), ids=TOO_LARGE.keys())
@pytest.mark.parametrize("shape", [big, nested, deep])
async def test_a_larger_filter_is_refused_naming_its_field(client, tag, call, shape):
    field, search = call
    with pytest.raises(UnprocessableEntityError) as refused:
        await search(client, shape(tag, MAX_DEPTH + 1 if shape is deep else MAX_VALUES + 1))
    detail = refused.value.response.json()["detail"]
    assert [d["loc"] for d in detail] == [["body", field]], detail
    bound = "at most 16 levels" if shape is deep else "at most 1000 values"
    assert bound in detail[0]["msg"], detail


@pytest.mark.spindle_only
async def test_a_larger_filter_is_refused_by_versions_and_history(client, tag):
    filt = big(tag, MAX_VALUES + 1)
    assistant = await client.assistants.create("echo", metadata={"tag": tag})
    thread = await client.threads.create(metadata={"tag": tag})
    for search in [
        client.assistants.get_versions(assistant["assistant_id"], metadata=filt),
        client.threads.get_history(thread["thread_id"], metadata=filt),
    ]:
        with pytest.raises(UnprocessableEntityError) as refused:
            await search
        assert [d["loc"] for d in refused.value.response.json()["detail"]] == [
            ["body", "metadata"]
        ]
