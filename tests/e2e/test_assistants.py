"""Assistants through the official Python client (langgraph-sdk), with raw HTTP for wire details."""

from __future__ import annotations

import uuid

import pytest
from e2e_util import (
    EXAMPLE_GRAPHS,
    assert_error_body,
    assert_status,
    default_assistant_id,
    describe,
    spindle_serving,
)
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

ASSISTANT_KEYS = {
    "assistant_id", "graph_id", "config", "context", "metadata", "name",
    "created_at", "updated_at", "version", "description",
}


def _empty_config(config) -> bool:
    return config in ({}, {"configurable": {}})


# --------------------------------------------------------------------------------------------
# create and get
# --------------------------------------------------------------------------------------------


async def test_create_minimal_defaults(client, tag):
    """A client creating an assistant with only graph_id gets a full record: name "Untitled", version 1."""
    a = await client.assistants.create("echo", metadata={"tag": tag})
    assert ASSISTANT_KEYS <= set(a), f"missing keys: {ASSISTANT_KEYS - set(a)}"
    uuid.UUID(a["assistant_id"])
    assert a["graph_id"] == "echo"
    assert a["name"] == "Untitled"
    assert a["version"] == 1
    assert a["metadata"] == {"tag": tag}
    assert isinstance(a["config"], dict)
    assert a["created_at"] and a["updated_at"]

    got = await client.assistants.get(a["assistant_id"])
    assert got["assistant_id"] == a["assistant_id"]
    assert got["name"] == "Untitled"
    assert got["version"] == 1
    assert got["metadata"] == {"tag": tag}


async def test_create_with_all_fields(client, tag):
    """Fields given at creation (id, name, description, config, context, metadata) are kept."""
    aid = str(uuid.uuid4())
    a = await client.assistants.create(
        "chain",
        assistant_id=aid,
        name="my assistant",
        description="does things",
        config={"tags": ["t"], "recursion_limit": 7},
        context={"user": "u1"},
        metadata={"tag": tag, "n": 1},
    )
    assert a["assistant_id"] == aid
    assert a["graph_id"] == "chain"
    assert a["name"] == "my assistant"
    assert a["description"] == "does things"
    assert a["config"]["tags"] == ["t"]
    assert a["config"]["recursion_limit"] == 7
    assert a["context"]["user"] == "u1"
    assert a["metadata"] == {"tag": tag, "n": 1}
    got = await client.assistants.get(aid)
    for key in ("name", "description", "graph_id", "metadata", "version"):
        assert got[key] == a[key], key
    assert got["config"]["tags"] == ["t"]
    assert got["context"]["user"] == "u1"


async def test_create_if_exists_raise_is_409(client, http, tag):
    """Creating an existing assistant id with if_exists=raise (or by default) is a 409 Conflict."""
    aid = str(uuid.uuid4())
    await client.assistants.create("echo", assistant_id=aid, metadata={"tag": tag})
    with pytest.raises(ConflictError):
        await client.assistants.create("echo", assistant_id=aid, if_exists="raise")
    with pytest.raises(ConflictError):
        await client.assistants.create("echo", assistant_id=aid)
    assert_status(http.post("/assistants", json={"graph_id": "echo", "assistant_id": aid}), 409)


@pytest.mark.spindle_only
def test_create_conflict_error_body(http, tag):
    """A 409 carries the interface's general error body {error, message, details}."""
    aid = str(uuid.uuid4())
    assert_status(http.post("/assistants", json={"graph_id": "echo", "assistant_id": aid}), 200)
    r = http.post("/assistants", json={"graph_id": "echo", "assistant_id": aid, "if_exists": "raise"})
    assert_error_body(r, 409)


async def test_create_if_exists_do_nothing_returns_existing(client, tag):
    """if_exists=do_nothing returns the stored assistant unchanged (idempotent provisioning)."""
    aid = str(uuid.uuid4())
    first = await client.assistants.create(
        "echo", assistant_id=aid, name="first", metadata={"tag": tag, "v": 1}
    )
    again = await client.assistants.create(
        "chain", assistant_id=aid, name="second", metadata={"tag": tag, "v": 2},
        if_exists="do_nothing",
    )
    assert again["assistant_id"] == aid
    assert again["graph_id"] == "echo"
    assert again["name"] == "first"
    assert again["metadata"] == {"tag": tag, "v": 1}
    assert again["version"] == first["version"] == 1


async def test_create_unknown_graph_is_refused(client, http):
    """An assistant for a graph the server does not have is refused with a client error, not 500."""
    r = http.post("/assistants", json={"graph_id": "no-such-graph-" + uuid.uuid4().hex[:6]})
    assert 400 <= r.status_code < 500, describe(r)


async def test_get_unknown_is_404(client, http):
    """Getting an assistant that does not exist is a 404 the client raises as NotFoundError."""
    with pytest.raises(NotFoundError):
        await client.assistants.get(str(uuid.uuid4()))


@pytest.mark.spindle_only
def test_get_unknown_error_body(http):
    """A 404 carries the interface's general error body {error, message, details}."""
    assert_error_body(http.get(f"/assistants/{uuid.uuid4()}"), 404)


# --------------------------------------------------------------------------------------------
# default assistants
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("graph_id", EXAMPLE_GRAPHS)
async def test_default_assistant_per_graph(client, graph_id):
    """Each graph has a default assistant at uuid5(6ba7b821-..., graph_id), created by the system, v1."""
    aid = default_assistant_id(graph_id)
    a = await client.assistants.get(aid)
    assert a["assistant_id"] == aid
    assert a["graph_id"] == graph_id
    assert a["metadata"].get("created_by") == "system", a["metadata"]
    assert a["version"] == 1
    assert a["name"] == graph_id


async def test_default_assistants_are_searchable(client):
    """Searching by metadata created_by=system finds the default assistant of every example graph."""
    found = await client.assistants.search(metadata={"created_by": "system"}, limit=100)
    by_graph = {a["graph_id"]: a["assistant_id"] for a in found}
    for graph_id in EXAMPLE_GRAPHS:
        assert by_graph.get(graph_id) == default_assistant_id(graph_id), graph_id


@pytest.mark.spindle_only
async def test_graph_id_accepted_as_assistant_id(client, http):
    """Wherever an assistant id is taken, a graph id names that graph's default assistant."""
    a = await client.assistants.get("echo")
    assert a["assistant_id"] == default_assistant_id("echo")
    assert a["graph_id"] == "echo"
    schemas = await client.assistants.get_schemas("chain")
    assert schemas["graph_id"] == "chain"
    graph = await client.assistants.get_graph("echo")
    assert isinstance(graph.get("nodes"), list)
    versions = await client.assistants.get_versions("echo")
    assert [v["version"] for v in versions] == [1]


# --------------------------------------------------------------------------------------------
# update, versions, latest
# --------------------------------------------------------------------------------------------


async def test_update_creates_versions_and_merges_metadata(client, tag):
    """Each PATCH makes a new version (2, 3, ...) and merges metadata into the existing metadata."""
    a = await client.assistants.create(
        "echo", metadata={"tag": tag, "a": 1}, config={"configurable": {"x": 1}}
    )
    aid = a["assistant_id"]
    v2 = await client.assistants.update(aid, metadata={"b": 2})
    assert v2["version"] == 2
    assert v2["metadata"] == {"tag": tag, "a": 1, "b": 2}
    assert v2["config"]["configurable"] == {"x": 1}, "config unchanged when omitted"

    v3 = await client.assistants.update(aid, metadata={"a": 10}, name="renamed")
    assert v3["version"] == 3
    assert v3["metadata"] == {"tag": tag, "a": 10, "b": 2}
    assert v3["name"] == "renamed"

    v4 = await client.assistants.update(aid, config={"configurable": {"y": 2}})
    assert v4["version"] == 4
    assert v4["config"]["configurable"] == {"y": 2}, "config is replaced, not merged"
    assert v4["name"] == "renamed"

    got = await client.assistants.get(aid)
    assert got["version"] == 4
    assert got["name"] == "renamed"
    assert got["config"]["configurable"] == {"y": 2}


async def test_update_graph_id_and_description(client, tag):
    """graph_id and description can be changed; omitted fields keep their value."""
    a = await client.assistants.create("echo", metadata={"tag": tag}, description="one")
    aid = a["assistant_id"]
    b = await client.assistants.update(aid, graph_id="chain")
    assert b["graph_id"] == "chain"
    assert b["description"] == "one"
    c = await client.assistants.update(aid, description="two")
    assert c["description"] == "two"
    assert c["graph_id"] == "chain"


async def test_update_unknown_is_404(client):
    """Updating an assistant that does not exist is a 404."""
    with pytest.raises(NotFoundError):
        await client.assistants.update(str(uuid.uuid4()), metadata={"x": 1})


@pytest.mark.parametrize("field", ["name", "graph_id"])
async def test_update_null_name_or_graph_id_is_422(client, http, tag, field):
    """PATCH with name or graph_id set to null is refused (422) and changes nothing."""
    a = await client.assistants.create("echo", name="keep", metadata={"tag": tag})
    r = http.patch(f"/assistants/{a['assistant_id']}", json={field: None})
    assert_status(r, 422)
    got = await client.assistants.get(a["assistant_id"])
    assert got["version"] == 1
    assert got["name"] == "keep"
    assert got["graph_id"] == "echo"


@pytest.mark.spindle_only
async def test_update_description_null_clears_it(client, http, tag):
    """PATCH description: null clears the description (interface; the reference refuses it)."""
    a = await client.assistants.create("echo", description="to be cleared", metadata={"tag": tag})
    r = http.patch(f"/assistants/{a['assistant_id']}", json={"description": None})
    assert_status(r, 200)
    assert r.json().get("description") is None, describe(r)
    got = await client.assistants.get(a["assistant_id"])
    assert got.get("description") is None
    assert got["version"] == 2


@pytest.mark.spindle_only
async def test_update_config_empty_object_clears_it(client, http, tag):
    """PATCH config: {} clears the config (interface; the reference leaves it)."""
    a = await client.assistants.create(
        "echo", config={"configurable": {"x": 1}, "tags": ["t"]}, metadata={"tag": tag}
    )
    r = http.patch(f"/assistants/{a['assistant_id']}", json={"config": {}})
    assert_status(r, 200)
    assert _empty_config(r.json()["config"]), describe(r)
    got = await client.assistants.get(a["assistant_id"])
    assert _empty_config(got["config"]), got["config"]


@pytest.mark.spindle_only
@pytest.mark.parametrize("field", ["config", "context"])
async def test_update_config_or_context_null_reads_as_empty(client, http, tag, field):
    """PATCH config/context: null is read as an empty object (interface; the reference refuses it)."""
    initial = {"configurable": {"x": 1}} if field == "config" else {"x": 1}
    a = await client.assistants.create("echo", metadata={"tag": tag}, **{field: initial})
    r = http.patch(f"/assistants/{a['assistant_id']}", json={field: None})
    assert_status(r, 200)
    value = r.json()[field]
    assert isinstance(value, dict) and _empty_config(value), describe(r)


async def test_versions_list(client, tag):
    """get_versions lists every version, newest first, with each version's own values; limit/offset page."""
    a = await client.assistants.create("echo", metadata={"tag": tag}, config={"configurable": {"v": 1}})
    aid = a["assistant_id"]
    await client.assistants.update(aid, config={"configurable": {"v": 2}})
    await client.assistants.update(aid, config={"configurable": {"v": 3}}, metadata={"m": 3})
    versions = await client.assistants.get_versions(aid)
    assert [v["version"] for v in versions] == [3, 2, 1]
    for v in versions:
        assert v["assistant_id"] == aid
        assert v["graph_id"] == "echo"
        assert v["config"]["configurable"] == {"v": v["version"]}
    assert versions[0]["metadata"] == {"tag": tag, "m": 3}
    assert versions[2]["metadata"] == {"tag": tag}

    page = await client.assistants.get_versions(aid, limit=1, offset=1)
    assert [v["version"] for v in page] == [2]

    filtered = await client.assistants.get_versions(aid, metadata={"m": 3})
    assert [v["version"] for v in filtered] == [3]


async def test_versions_of_unknown_is_404(client):
    """Listing versions of an assistant that does not exist is a 404."""
    with pytest.raises(NotFoundError):
        await client.assistants.get_versions(str(uuid.uuid4()))


async def test_set_latest_pins_version(client, tag):
    """set_latest pins a version: GET returns that version's config; the next update is max+1."""
    a = await client.assistants.create(
        "echo", name="v1", metadata={"tag": tag}, config={"configurable": {"v": 1}}
    )
    aid = a["assistant_id"]
    await client.assistants.update(aid, name="v2", config={"configurable": {"v": 2}})
    await client.assistants.update(aid, name="v3", config={"configurable": {"v": 3}})

    pinned = await client.assistants.set_latest(aid, 1)
    assert pinned["version"] == 1
    assert pinned["name"] == "v1"
    assert pinned["config"]["configurable"] == {"v": 1}

    got = await client.assistants.get(aid)
    assert got["version"] == 1
    assert got["name"] == "v1"
    assert got["config"]["configurable"] == {"v": 1}

    again = await client.assistants.set_latest(aid, 3)
    assert again["version"] == 3
    assert (await client.assistants.get(aid))["config"]["configurable"] == {"v": 3}

    await client.assistants.set_latest(aid, 2)
    v4 = await client.assistants.update(aid, metadata={"after": "pin"})
    assert v4["version"] == 4
    assert (await client.assistants.get(aid))["version"] == 4
    versions = await client.assistants.get_versions(aid)
    assert sorted(v["version"] for v in versions) == [1, 2, 3, 4]


async def test_set_latest_unknown_version_is_404(client, tag):
    """Pinning a version that does not exist is a 404, and the current version stays."""
    a = await client.assistants.create("echo", metadata={"tag": tag})
    with pytest.raises(NotFoundError):
        await client.assistants.set_latest(a["assistant_id"], 99)
    assert (await client.assistants.get(a["assistant_id"]))["version"] == 1


# --------------------------------------------------------------------------------------------
# search and count
# --------------------------------------------------------------------------------------------


async def _three(client, tag):
    out = []
    for name, graph in (("bravo", "echo"), ("alpha", "chain"), ("charlie", "echo")):
        out.append(
            await client.assistants.create(
                graph, name=f"{name}-{tag}", metadata={"tag": tag, "kind": name}
            )
        )
    return out


async def test_search_by_metadata_and_graph_id(client, tag):
    """search filters by metadata containment and graph_id; count agrees with it."""
    made = await _three(client, tag)
    by_tag = await client.assistants.search(metadata={"tag": tag})
    assert {a["assistant_id"] for a in by_tag} == {a["assistant_id"] for a in made}

    echo = await client.assistants.search(metadata={"tag": tag}, graph_id="echo")
    assert sorted(a["name"] for a in echo) == [f"bravo-{tag}", f"charlie-{tag}"]

    one = await client.assistants.search(metadata={"tag": tag, "kind": "alpha"})
    assert [a["name"] for a in one] == [f"alpha-{tag}"]

    assert await client.assistants.count(metadata={"tag": tag}) == 3
    assert await client.assistants.count(metadata={"tag": tag}, graph_id="echo") == 2
    assert await client.assistants.count(metadata={"tag": "nothing-" + tag}) == 0
    assert await client.assistants.count(graph_id="echo") >= 3


async def test_search_metadata_nested_containment(client, tag):
    """An assistant metadata filter matches by containment, also inside nested objects."""
    a = await client.assistants.create("echo", metadata={"tag": tag, "obj": {"x": 1, "y": 2}})
    for filt, hits in [({"obj": {"x": 1}}, 1), ({"obj": {"x": 1, "y": 2}}, 1), ({"obj": {"x": 2}}, 0)]:
        found = await client.assistants.search(metadata={"tag": tag, **filt})
        assert [x["assistant_id"] for x in found] == [a["assistant_id"]] * hits, filt


async def test_search_by_name(client, tag):
    """search by name matches a substring of the name."""
    await _three(client, tag)
    found = await client.assistants.search(name=f"alpha-{tag}")
    assert [a["name"] for a in found] == [f"alpha-{tag}"]
    found = await client.assistants.search(name=tag, metadata={"tag": tag})
    assert len(found) == 3
    assert await client.assistants.count(name=f"charlie-{tag}") == 1


async def test_search_sort_limit_offset(client, tag):
    """sort_by/sort_order order the results; limit and offset page through them."""
    await _three(client, tag)
    asc = await client.assistants.search(metadata={"tag": tag}, sort_by="name", sort_order="asc")
    assert [a["name"] for a in asc] == [f"alpha-{tag}", f"bravo-{tag}", f"charlie-{tag}"]
    desc = await client.assistants.search(metadata={"tag": tag}, sort_by="name", sort_order="desc")
    assert [a["name"] for a in desc] == [f"charlie-{tag}", f"bravo-{tag}", f"alpha-{tag}"]

    page1 = await client.assistants.search(
        metadata={"tag": tag}, sort_by="name", sort_order="asc", limit=2
    )
    page2 = await client.assistants.search(
        metadata={"tag": tag}, sort_by="name", sort_order="asc", limit=2, offset=2
    )
    assert [a["name"] for a in page1] == [f"alpha-{tag}", f"bravo-{tag}"]
    assert [a["name"] for a in page2] == [f"charlie-{tag}"]

    by_created = await client.assistants.search(
        metadata={"tag": tag}, sort_by="created_at", sort_order="asc"
    )
    created = [a["created_at"] for a in by_created]
    assert created == sorted(created)


async def test_search_pagination_cursor(client, tag):
    """The client's response_format="object" reads the X-Pagination-Next header as its cursor."""
    await _three(client, tag)
    first = await client.assistants.search(
        metadata={"tag": tag}, sort_by="name", sort_order="asc", limit=2, response_format="object"
    )
    assert len(first["assistants"]) == 2
    assert first["next"] is not None
    last = await client.assistants.search(
        metadata={"tag": tag}, sort_by="name", sort_order="asc", limit=2, offset=2,
        response_format="object",
    )
    assert len(last["assistants"]) == 1
    assert last["next"] is None


async def test_search_select(client, tag):
    """select returns only the requested fields."""
    await _three(client, tag)
    found = await client.assistants.search(
        metadata={"tag": tag}, select=["assistant_id", "name"]
    )
    assert len(found) == 3
    for a in found:
        assert set(a) == {"assistant_id", "name"}, a


# --------------------------------------------------------------------------------------------
# delete
# --------------------------------------------------------------------------------------------


async def test_delete_then_404(client, http, tag):
    """DELETE answers 204; afterwards the assistant is gone (get/update/delete are 404)."""
    a = await client.assistants.create("echo", metadata={"tag": tag})
    aid = a["assistant_id"]
    r = http.delete(f"/assistants/{aid}")
    assert_status(r, 204)
    assert r.content == b""
    with pytest.raises(NotFoundError):
        await client.assistants.get(aid)
    with pytest.raises(NotFoundError):
        await client.assistants.delete(aid)
    assert await client.assistants.count(metadata={"tag": tag}) == 0


async def test_delete_through_client(client, tag):
    """The official client's delete succeeds and the assistant's versions go with it."""
    a = await client.assistants.create("echo", metadata={"tag": tag})
    await client.assistants.update(a["assistant_id"], metadata={"x": 1})
    await client.assistants.delete(a["assistant_id"])
    with pytest.raises(NotFoundError):
        await client.assistants.get_versions(a["assistant_id"])
    b = await client.assistants.create("echo", metadata={"tag": tag})
    await client.assistants.delete(b["assistant_id"], delete_threads=True)
    with pytest.raises(NotFoundError):
        await client.assistants.get(b["assistant_id"])


# --------------------------------------------------------------------------------------------
# schemas, graph, subgraphs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("graph_id", EXAMPLE_GRAPHS)
async def test_schemas(client, graph_id):
    """get_schemas returns {graph_id, input_schema, output_schema, state_schema, config_schema, context_schema}."""
    s = await client.assistants.get_schemas(default_assistant_id(graph_id))
    for key in ("graph_id", "input_schema", "output_schema", "state_schema",
                "config_schema", "context_schema"):
        assert key in s, f"{key} missing from {s}"
    assert s["graph_id"] == graph_id


async def test_schemas_state_channels(client):
    """The state schema names the graph's channels (echo: messages; chain: n)."""
    echo = await client.assistants.get_schemas(default_assistant_id("echo"))
    assert "messages" in (echo["state_schema"] or {}).get("properties", {}), echo["state_schema"]
    chain = await client.assistants.get_schemas(default_assistant_id("chain"))
    assert "n" in (chain["state_schema"] or {}).get("properties", {}), chain["state_schema"]


@pytest.mark.parametrize("graph_id", EXAMPLE_GRAPHS)
async def test_graph_drawable(client, graph_id):
    """get_graph returns a drawable {nodes, edges} for each example graph."""
    g = await client.assistants.get_graph(default_assistant_id(graph_id))
    assert isinstance(g.get("nodes"), list), g
    assert isinstance(g.get("edges"), list), g
    for node in g["nodes"]:
        assert "id" in node, node
    for edge in g["edges"]:
        assert "source" in edge and "target" in edge, edge


@pytest.mark.parametrize(
    "graph_id,nodes",
    [("echo", {"respond"}), ("chain", {"a", "b", "c"}), ("agent", {"model", "tools"})],
)
async def test_graph_nodes(client, graph_id, nodes):
    """The drawn graph shows the graph's nodes between __start__ and __end__."""
    g = await client.assistants.get_graph(default_assistant_id(graph_id), xray=True)
    ids = {n["id"] for n in g["nodes"]}
    assert nodes | {"__start__", "__end__"} <= ids, ids
    edges = {(e["source"], e["target"]) for e in g["edges"]}
    if graph_id == "chain":
        assert {("__start__", "a"), ("a", "b"), ("b", "c"), ("c", "__end__")} <= edges, edges


async def test_subgraphs(client):
    """get_subgraphs answers 200 with an object (namespace -> schemas)."""
    s = await client.assistants.get_subgraphs(default_assistant_id("echo"))
    assert isinstance(s, dict)
    s = await client.assistants.get_subgraphs(default_assistant_id("nested"), recurse=True)
    assert isinstance(s, dict)


# `mid` runs a subgraph that runs `grand`; `side` runs `grand` directly (the reference's twin:
# crates/graph/tests/fixtures/ref_extra/deep_graph.py).
DEEP = """
state: {messages: messages}
graphs:
  grand:
    state: {messages: messages}
    nodes: {g1: {kind: script, code: '#{ messages: [ai("g1")] }'}}
    edges: [{from: __start__, to: g1}, {from: g1, to: __end__}]
  mid:
    state: {messages: messages}
    nodes:
      m1: {kind: script, code: '#{ messages: [ai("m1")] }'}
      grand: {kind: subgraph, graph: grand}
    edges: [{from: __start__, to: m1}, {from: m1, to: grand}, {from: grand, to: __end__}]
nodes:
  prep: {kind: script, code: '#{ messages: [ai("prep")] }'}
  mid: {kind: subgraph, graph: mid}
  side: {kind: subgraph, graph: grand}
edges:
  - {from: __start__, to: prep}
  - {from: prep, to: mid}
  - {from: mid, to: side}
  - {from: side, to: __end__}
"""


async def test_subgraphs_recurse_only_when_asked():
    """As the reference answers: `recurse=false` lists the immediate subgraphs only, `true`
    their subgraphs too; `/subgraphs/{namespace}` answers that namespace alone, a nested one
    only with `recurse`."""
    from langgraph_sdk import get_client

    with spindle_serving("deep", DEEP) as srv:
        client = get_client(url=srv.base_url, api_key=None, timeout=30)
        try:
            aid = default_assistant_id("deep")
            flat = await client.assistants.get_subgraphs(aid, recurse=False)
            assert sorted(flat) == ["mid", "side"]
            assert sorted(await client.assistants.get_subgraphs(aid)) == ["mid", "side"]
            deep = await client.assistants.get_subgraphs(aid, recurse=True)
            assert sorted(deep) == ["mid", "mid|grand", "side"]
            assert "messages" in deep["mid|grand"]["state_schema"]["properties"]
            assert sorted(await client.assistants.get_subgraphs(aid, namespace="mid")) == ["mid"]
            assert sorted(await client.assistants.get_subgraphs(aid, namespace="mid", recurse=True)) == ["mid"]
            assert await client.assistants.get_subgraphs(aid, namespace="mid|grand") == {}
            nested = await client.assistants.get_subgraphs(aid, namespace="mid|grand", recurse=True)
            assert sorted(nested) == ["mid|grand"]
            assert await client.assistants.get_subgraphs(aid, namespace="nope", recurse=True) == {}
        finally:
            await client.aclose()


async def test_schemas_of_unknown_assistant_is_404(client):
    """Schemas and graph of an unknown assistant are 404."""
    with pytest.raises(NotFoundError):
        await client.assistants.get_schemas(str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await client.assistants.get_graph(str(uuid.uuid4()))


# --------------------------------------------------------------------------------------------
# the sync client
# --------------------------------------------------------------------------------------------


def test_sync_client_roundtrip(sync_client, tag):
    """The official sync client drives the same lifecycle: create, update, search, delete."""
    a = sync_client.assistants.create("echo", metadata={"tag": tag}, name="sync")
    b = sync_client.assistants.update(a["assistant_id"], metadata={"more": True})
    assert b["version"] == 2
    assert b["metadata"] == {"tag": tag, "more": True}
    assert [x["assistant_id"] for x in sync_client.assistants.search(metadata={"tag": tag})] == [
        a["assistant_id"]
    ]
    sync_client.assistants.delete(a["assistant_id"])
    with pytest.raises(NotFoundError):
        sync_client.assistants.get(a["assistant_id"])
    with pytest.raises(UnprocessableEntityError):
        sync_client.assistants.create("echo", if_exists="sometimes")  # type: ignore[arg-type]
