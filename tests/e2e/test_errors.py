"""Bad input: 422 bodies that name the field, and no 500 for anything a client sends.

Every case is checked twice: the status (422) on any server, and the interface document's body
shape {"detail": [{"loc", "msg", "type", ...}]} with a ``loc`` naming the field (spindle_only,
since the reference answers a plain string ``detail``).
"""

from __future__ import annotations

import json
import uuid

import pytest
from e2e_util import assert_error_body, assert_status, assert_validation_error, describe
from langgraph_sdk.errors import UnprocessableEntityError

A = "{assistant}"  # replaced by a fresh assistant's id
T = "{thread}"  # replaced by a fresh thread's id
RANDOM = str(uuid.uuid4())


def case(method, path, body, where, field, *, ref_differs=False, id=None):
    marks = [pytest.mark.spindle_only] if ref_differs else []
    return pytest.param(method, path, body, where, field, marks=marks, id=id)


# (method, path, raw body or None, loc[0], field named in loc)
CASES = [
    # malformed JSON and wrong top-level types
    case("POST", "/assistants", "{bad", "body", None, id="assistants-malformed-json"),
    case("POST", "/assistants", "[1]", "body", None, id="assistants-body-array"),
    case("POST", "/assistants", "null", "body", None, id="assistants-body-null"),
    # serde fills a struct from an array, by field position: refused where an object is due
    case("POST", "/threads", "[]", "body", None, ref_differs=True, id="threads-body-empty-array"),
    case("POST", "/threads/search", "[10]", "body", None, ref_differs=True, id="threads-search-body-array"),
    case("POST", "/runs/crons/search", "[]", "body", None, ref_differs=True, id="crons-search-body-array"),
    case("POST", "/threads", "{bad", "body", None, id="threads-malformed-json"),
    case("POST", "/threads/search", '{"limit": 1,', "body", None, id="threads-search-truncated-json"),
    case("PATCH", f"/threads/{T}", "{bad", "body", None, id="threads-patch-malformed"),
    case("PATCH", f"/assistants/{A}", "{bad", "body", None, id="assistants-patch-malformed"),
    # assistants: create
    case("POST", "/assistants", "{}", "body", "graph_id", id="assistants-missing-graph-id"),
    case("POST", "/assistants", '{"graph_id": 5}', "body", "graph_id", id="assistants-graph-id-int"),
    case("POST", "/assistants", '{"graph_id": "echo", "if_exists": "bogus"}', "body", "if_exists",
         id="assistants-if-exists-enum"),
    case("POST", "/assistants", '{"graph_id": "echo", "metadata": "str"}', "body", "metadata",
         id="assistants-metadata-type"),
    case("POST", "/assistants", '{"graph_id": "echo", "config": [1]}', "body", "config",
         id="assistants-config-type"),
    case("POST", "/assistants", '{"graph_id": "echo", "name": 5}', "body", "name",
         id="assistants-name-type"),
    case("POST", "/assistants", '{"graph_id": "echo", "assistant_id": "not an id"}', "body",
         "assistant_id", id="assistants-id-not-an-id"),
    # assistants: update
    case("PATCH", f"/assistants/{A}", '{"name": null}', "body", "name", id="assistants-name-null"),
    case("PATCH", f"/assistants/{A}", '{"graph_id": null}', "body", "graph_id",
         id="assistants-graph-id-null"),
    case("PATCH", f"/assistants/{A}", '{"metadata": "x"}', "body", "metadata",
         id="assistants-patch-metadata-type"),
    case("PATCH", f"/assistants/{A}", '{"name": 7}', "body", "name", id="assistants-patch-name-type"),
    # assistants: search, count, versions, latest
    case("POST", "/assistants/search", '{"limit": "x"}', "body", "limit", id="assistants-search-limit-type"),
    case("POST", "/assistants/search", '{"limit": 0}', "body", "limit", id="assistants-search-limit-0"),
    case("POST", "/assistants/search", '{"limit": 100000}', "body", "limit",
         id="assistants-search-limit-huge"),
    case("POST", "/assistants/search", '{"offset": -1}', "body", "offset",
         id="assistants-search-offset-negative"),
    case("POST", "/assistants/search", '{"sort_by": "bogus"}', "body", "sort_by",
         id="assistants-search-sort-by-enum"),
    case("POST", "/assistants/search", '{"sort_order": "sideways"}', "body", "sort_order",
         id="assistants-search-sort-order-enum"),
    case("POST", "/assistants/search", '{"select": ["bogus"]}', "body", "select",
         id="assistants-search-select-enum"),
    case("POST", "/assistants/search", '{"metadata": "x"}', "body", "metadata",
         id="assistants-search-metadata-type"),
    case("POST", "/assistants/count", '{"graph_id": 1}', "body", "graph_id", id="assistants-count-graph-id-type"),
    case("POST", f"/assistants/{A}/versions", '{"limit": "x"}', "body", "limit",
         id="assistants-versions-limit-type"),
    case("POST", f"/assistants/{A}/latest", '{"version": "x"}', "body", "version",
         id="assistants-latest-version-type"),
    case("POST", f"/assistants/{A}/latest", "{}", "body", "version", ref_differs=True,
         id="assistants-latest-version-missing"),
    # assistants: query parameters
    case("GET", f"/assistants/{A}/graph?xray=abc", None, "query", "xray", id="assistants-graph-xray"),
    case("GET", f"/assistants/{A}/subgraphs?recurse=maybe", None, "query", "recurse", ref_differs=True,
         id="assistants-subgraphs-recurse"),
    case("DELETE", f"/assistants/{A}?delete_threads=maybe", None, "query", "delete_threads",
         ref_differs=True, id="assistants-delete-threads-flag"),
    # threads: create, update
    case("POST", "/threads", '{"thread_id": "not an id"}', "body", "thread_id", id="threads-id-not-an-id"),
    case("POST", "/threads", '{"if_exists": "bogus"}', "body", "if_exists", id="threads-if-exists-enum"),
    case("POST", "/threads", '{"metadata": [1]}', "body", "metadata", id="threads-metadata-type"),
    case("PATCH", f"/threads/{T}", '{"metadata": "x"}', "body", "metadata", id="threads-patch-metadata-type"),
    # threads: search, count
    case("POST", "/threads/search", '{"status": "bogus"}', "body", "status", id="threads-search-status-enum"),
    case("POST", "/threads/search", '{"limit": "x"}', "body", "limit", id="threads-search-limit-type"),
    case("POST", "/threads/search", '{"limit": -1}', "body", "limit", id="threads-search-limit-negative"),
    case("POST", "/threads/search", '{"offset": -1}', "body", "offset", id="threads-search-offset-negative"),
    case("POST", "/threads/search", '{"sort_by": "nope"}', "body", "sort_by", id="threads-search-sort-by-enum"),
    case("POST", "/threads/search", '{"sort_order": "up"}', "body", "sort_order",
         id="threads-search-sort-order-enum"),
    case("POST", "/threads/search", '{"select": ["nope"]}', "body", "select", id="threads-search-select-enum"),
    case("POST", "/threads/search", '{"ids": "x"}', "body", "ids", id="threads-search-ids-type"),
    case("POST", "/threads/search", '{"ids": ["not an id"]}', "body", "ids", ref_differs=True,
         id="threads-search-ids-not-an-id"),
    case("POST", "/threads/count", '{"status": "bogus"}', "body", "status", id="threads-count-status-enum"),
    # (An unknown thread or assistant id in a path, of any form, is a 404: test_client_ids.py.)
]


@pytest.fixture
def ids(http):
    a = http.post("/assistants", json={"graph_id": "echo", "metadata": {"e2e": "errors"}})
    assert_status(a, 200)
    t = http.post("/threads", json={"metadata": {"e2e": "errors"}})
    assert_status(t, 200)
    return {"assistant": a.json()["assistant_id"], "thread": t.json()["thread_id"]}


def _send(http, method, path, body, ids):
    path = path.replace(A, ids["assistant"]).replace(T, ids["thread"])
    headers = {"content-type": "application/json"} if body is not None else {}
    return http.request(method, path, content=body, headers=headers)


@pytest.mark.parametrize("method,path,body,where,field", CASES)
def test_bad_request_is_422(http, ids, method, path, body, where, field):
    """Malformed or invalid input gets 422 (never 2xx, never 500), and changes nothing."""
    before = http.get(f"/assistants/{ids['assistant']}").json()
    r = _send(http, method, path, body, ids)
    assert_status(r, 422)
    after = http.get(f"/assistants/{ids['assistant']}")
    assert_status(after, 200)
    assert after.json()["version"] == before["version"], "a refused request changed the assistant"


@pytest.mark.spindle_only
@pytest.mark.parametrize("method,path,body,where,field", CASES)
def test_bad_request_detail_names_the_field(http, ids, method, path, body, where, field):
    """The 422 body is {"detail": [{"loc", "msg", "type"}]} with loc naming where and which field."""
    r = _send(http, method, path, body, ids)
    assert_validation_error(r, where, field)


def test_client_raises_unprocessable(sync_client):
    """The official client surfaces a 422 as UnprocessableEntityError."""
    with pytest.raises(UnprocessableEntityError):
        sync_client.threads.search(status="bogus")  # type: ignore[arg-type]
    with pytest.raises(UnprocessableEntityError):
        sync_client.threads.create(thread_id="not an id")


@pytest.mark.spindle_only
def test_unknown_assistant_name_is_not_500(http):
    """A non-UUID assistant id that names no graph is a client error (404 or 422), never 500."""
    r = http.get("/assistants/no-such-graph-or-id")
    assert r.status_code in (404, 422), describe(r)


ODD_BODIES = [
    "", "{}", "[]", "null", "0", '"x"', "true", "{bad", "\x00", '{"metadata": {"a": {"b": [1, {"c": null}]}}}',
    '{"limit": 1e309}', '{"limit": 99999999999999999999999}', '{"limit": 1.5}', '{"offset": "1"}',
'{"graph_id": "' + "x" * 10000 + '"}',
    '{"ids": [' + ",".join(['"%s"' % uuid.uuid4()] * 50) + "]}", '{"thread_id": null}',
    '{"if_exists": null}', '{"status": null}', '{"select": []}', '{"sort_by": null}',
]
ODD_TARGETS = [
    ("POST", "/assistants"), ("POST", "/assistants/search"), ("POST", "/assistants/count"),
    ("PATCH", f"/assistants/{A}"), ("POST", f"/assistants/{A}/versions"),
    ("POST", f"/assistants/{A}/latest"), ("POST", "/threads"), ("POST", "/threads/search"),
    ("POST", "/threads/count"), ("PATCH", f"/threads/{T}"),
]


@pytest.mark.parametrize("method,path", ODD_TARGETS)
def test_no_500_for_odd_input(http, ids, method, path):
    """No request answers 500 because its input was bad."""
    failures = []
    for body in ODD_BODIES:
        r = _send(http, method, path, body, ids)
        if r.status_code >= 500:
            failures.append(f"{json.dumps(body[:80])} -> {r.status_code} {r.text[:200]}")
    assert not failures, f"{method} {path}:\n" + "\n".join(failures)


@pytest.mark.parametrize(
    "method,path",
    [("GET", f"/assistants/{RANDOM}"), ("GET", f"/threads/{RANDOM}"),
     ("GET", f"/assistants/{RANDOM}/schemas"), ("POST", f"/assistants/{RANDOM}/versions")],
)
def test_missing_resource_is_404(http, method, path):
    """Unknown ids are 404 (clients map it to NotFoundError)."""
    r = http.request(method, path, json={} if method == "POST" else None)
    assert_status(r, 404)


NUL = "\\u0000"  # a JSON-escaped NUL character, which PostgreSQL text and jsonb cannot store
NUL_CASES = [
    ("create-name", "POST", "/assistants", '{"graph_id": "echo", "name": "a%sb"}' % NUL),
    ("create-description", "POST", "/assistants", '{"graph_id": "echo", "description": "a%sb"}' % NUL),
    ("create-metadata-value", "POST", "/assistants", '{"graph_id": "echo", "metadata": {"k": "a%sb"}}' % NUL),
    ("create-metadata-key", "POST", "/assistants", '{"graph_id": "echo", "metadata": {"%s": 1}}' % NUL),
    ("create-config", "POST", "/assistants",
     '{"graph_id": "echo", "config": {"configurable": {"k": "%s"}}}' % NUL),
    ("create-graph-id", "POST", "/assistants", '{"graph_id": "ec%sho"}' % NUL),
    ("patch-name", "PATCH", f"/assistants/{A}", '{"name": "a%sb"}' % NUL),
    ("patch-metadata", "PATCH", f"/assistants/{A}", '{"metadata": {"%s": "%s"}}' % (NUL, NUL)),
    ("search-metadata", "POST", "/assistants/search", '{"metadata": {"%s": "%s"}}' % (NUL, NUL)),
    ("search-name", "POST", "/assistants/search", '{"name": "%s"}' % NUL),
    ("search-graph-id", "POST", "/assistants/search", '{"graph_id": "%s"}' % NUL),
    ("count-metadata", "POST", "/assistants/count", '{"metadata": {"%s": "x"}}' % NUL),
    ("versions-metadata", "POST", f"/assistants/{A}/versions", '{"metadata": {"%s": "x"}}' % NUL),
    ("thread-create-metadata", "POST", "/threads", '{"metadata": {"%s": "%s"}}' % (NUL, NUL)),
    ("thread-patch-metadata", "PATCH", f"/threads/{T}", '{"metadata": {"k": "%s"}}' % NUL),
    ("thread-search-metadata", "POST", "/threads/search", '{"metadata": {"%s": "%s"}}' % (NUL, NUL)),
    ("thread-count-metadata", "POST", "/threads/count", '{"metadata": {"%s": "x"}}' % NUL),
]


@pytest.mark.parametrize(
    "method,path,body",
    [pytest.param(*c[1:], id=c[0]) for c in NUL_CASES]
    + [
        # The reference answers 500 to any values filter (a langgraph-runtime-inmem bug).
        pytest.param("POST", "/threads/search", '{"values": {"%s": "%s"}}' % (NUL, NUL),
                     marks=pytest.mark.spindle_only, id="thread-search-values"),
    ],
)
def test_nul_character_is_not_500(http, ids, method, path, body):
    """A NUL character (\\u0000) in a string or key is refused with 422 or stored; never a 500."""
    # Seed a thread so that filters are evaluated against at least one stored row.
    http.post("/threads", json={"metadata": {"odd": "row"}})
    r = _send(http, method, path, body, ids)
    assert r.status_code < 500, describe(r)


@pytest.mark.spindle_only
def test_an_array_is_not_an_object(http):
    """A JSON array where the body is an object is 422 `dict_type`, and creates nothing: serde
    alone would read `["<id>", {...}]` as a thread's fields by position."""
    thread_id = str(uuid.uuid4())
    for body in ([], [thread_id, {"k": "v"}]):
        r = http.post("/threads", json=body)
        detail = assert_validation_error(r, "body")
        assert detail[0]["type"] == "dict_type", describe(r)
    assert_status(http.get(f"/threads/{thread_id}"), 404)
    # A list body stays a list.
    assert_validation_error(http.post("/runs/batch", json={"assistant_id": "echo"}), "body")


@pytest.mark.spindle_only
@pytest.mark.parametrize("content_type", [
    "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None,
])
def test_a_body_that_is_not_json_is_415(http, content_type):
    """A browser sends a form or text/plain body cross-site without a CORS preflight; only a
    JSON content type needs one. So a body must say it is JSON (application/json or +json),
    else 415 in the interface's error body, and nothing is written."""
    thread_id = str(uuid.uuid4())
    headers = {"content-type": content_type} if content_type else {}
    r = http.post("/threads", content=json.dumps({"thread_id": thread_id}), headers=headers)
    body = assert_error_body(r, 415)
    assert body["error"] == "unsupported_media_type", describe(r)
    assert_status(http.get(f"/threads/{thread_id}"), 404)
    if content_type:
        # An empty body of such a type is refused too: it would create a thread as `{}`.
        assert_error_body(http.post("/threads", content=b"", headers=headers), 415)


def test_json_content_types_and_bodyless_posts_are_accepted(http):
    """application/json with parameters, a +json type, and POSTs without a body (no content
    type at all, as the official clients send a cancel or a copy) keep working."""
    for content_type in ["application/json; charset=utf-8", "application/merge-patch+json"]:
        r = http.post("/threads", content=b"{}", headers={"content-type": content_type})
        assert_status(r, 200)
    thread_id = r.json()["thread_id"]
    assert_status(http.post(f"/threads/{thread_id}/copy"), 200)


@pytest.mark.spindle_only
def test_every_error_answers_json(http):
    """Errors made before a handler runs (a path that does not decode, an unknown route, a
    method a route does not serve, a body too large) answer the interface's JSON bodies."""
    r = http.get("/threads/%ff%fe")
    detail = assert_validation_error(r, "path", "thread_id")
    assert detail[0]["type"] == "string_unicode", describe(r)
    assert_validation_error(http.get("/threads/%ff%fe/runs/%c3%28"), "path", "thread_id")
    body = assert_error_body(http.put("/threads", json={}), 405)
    assert body["error"] == "method_not_allowed"
    assert_error_body(http.get("/no/such/route"), 404)
    assert_error_body(http.delete("/ok"), 405)
    thread = http.post("/threads", json={}).json()
    big = b'{"channels": ["values"], "pad": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    r = http.post(f"/threads/{thread['thread_id']}/commands", content=big,
                  headers={"content-type": "application/json"})
    assert_error_body(r, 413)
