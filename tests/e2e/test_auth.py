"""Authentication and isolation between users (the config's `auth` section).

What a deployment relies on: without credentials every route but the health checks is a 401
with `WWW-Authenticate` and the interface's error body; an API key (from `x-api-key` or
`Authorization: Bearer`) or a JWT names the caller; each user's threads, runs, crons,
assistants and store items are theirs alone, and another user's are 404 on every endpoint,
streams included, never 403 and never listed; the graph sees who called it
(`langgraph_auth_user`, for graph files and Python graphs), and a cron's firings run as the
user who made it. With `enforce_permissions`, a caller's permissions must grant each action.

These tests start their own spindle processes, so they never run against SPINDLE_E2E_URL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
import uuid
from pathlib import Path


import harness
import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
import pytest
import websockets
from conftest import BACKENDS, WORKER_PYTHON, _loop, _session_server
from e2e_util import LocalServer, QuietHandler, assert_error_body, describe
from test_cors import spindle
from test_runs import WHOAMI_GRAPH  # answers the `configurable` its node was given
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SPINDLE_E2E_URL", "").strip()),
    reason="starts its own spindle processes; not applicable with SPINDLE_E2E_URL",
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"
ALICE_KEY = "alice-" + secrets.token_hex(16)
BOB_KEY = "bob-" + secrets.token_hex(16)
JWT_SECRET = secrets.token_hex(32)
ALICE_PERMISSIONS = ["threads:*", "assistants:*", "crons:*", "store:*", "reports:export"]


# `whoami` (test_runs.py) for a LangGraph Python graph, reading the user by attribute and by key, as graphs
# written for LangGraph Platform do.
PYTHON_WHOAMI = '''
from typing import TypedDict

from langgraph.graph import StateGraph


class State(TypedDict, total=False):
    seen: dict


def who(state: State, config) -> State:
    configurable = config["configurable"]
    user = configurable["langgraph_auth_user"]
    return {"seen": {
        "identity": user.identity,
        "display_name": user["display_name"],
        "permissions": list(user.permissions),
        "is_authenticated": user.is_authenticated,
        "user_id": configurable["langgraph_auth_user_id"],
        "permissions_key": list(configurable["langgraph_auth_permissions"]),
    }}


graph = StateGraph(State).add_node("who", who).add_edge("__start__", "who").compile()
'''


def auth_config(folder: Path, enforce: bool = False) -> dict:
    graphs = {name: str(EXAMPLES / f"{name}.yaml") for name in ("chain", "slow", "agent")}
    (folder / "whoami.yaml").write_text(WHOAMI_GRAPH)
    graphs["whoami"] = "./whoami.yaml"
    if WORKER_PYTHON:
        (folder / "pywho.py").write_text(PYTHON_WHOAMI)
        graphs["pywho"] = "./pywho.py:graph"
    return {
        "graphs": graphs,
        "auth": {
            "api_keys": [
                {"key_env": "E2E_ALICE_KEY", "identity": "alice", "display_name": "Alice",
                 "permissions": ALICE_PERMISSIONS},
                {"key_sha256": hashlib.sha256(BOB_KEY.encode()).hexdigest(), "identity": "bob",
                 "permissions": ["threads:read", "threads:search", "assistants:read",
                                 "assistants:search"]},
            ],
            "jwt": {"secret_env": "E2E_JWT_SECRET", "audience": "spindle",
                    "issuer": "https://idp.example.test"},
            "enforce_permissions": enforce,
        },
    }


def start_auth_server(request, enforce: bool):
    folder = Path(tempfile.mkdtemp(prefix="spindle-e2e-auth-"))
    (folder / "spindle.json").write_text(json.dumps(auth_config(folder, enforce)))
    args = ["--config", str(folder / "spindle.json")]
    if WORKER_PYTHON:
        args += ["--python", WORKER_PYTHON, "--python-workers", "1"]
    env = {"E2E_ALICE_KEY": ALICE_KEY, "E2E_JWT_SECRET": JWT_SECRET}
    try:
        yield from _session_server(request.param, extra_args=args, env=env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module", params=BACKENDS)
def auth_server(request):
    yield from start_auth_server(request, enforce=False)


@pytest.fixture(scope="module", params=BACKENDS)
def enforcing_server(request):
    yield from start_auth_server(request, enforce=True)


def token(sub: str = "carol", **claims) -> str:
    body = {"sub": sub, "name": "Carol", "aud": "spindle", "iss": "https://idp.example.test",
            "exp": int(time.time()) + 300, "permissions": ["threads:*"], **claims}
    return jwt.encode(body, JWT_SECRET, algorithm="HS256")


@pytest.fixture
def alice(auth_server):
    with httpx.Client(base_url=auth_server.base_url, headers={"x-api-key": ALICE_KEY}, timeout=30) as c:
        yield c


@pytest.fixture
def bob(auth_server):
    # Bob sends his key as a bearer token: both headers are read.
    with httpx.Client(base_url=auth_server.base_url, headers={"Authorization": f"Bearer {BOB_KEY}"},
                      timeout=30) as c:
        yield c


# --------------------------------------------------------------------------------------------
# authentication
# --------------------------------------------------------------------------------------------


def test_without_credentials_only_health_checks_and_docs_answer(auth_server):
    base = auth_server.base_url
    for path in ["/ok", "/health", "/live", "/ready", "/openapi.json"]:
        r = httpx.get(base + path)
        assert r.status_code == 200, describe(r)
    for method, path in [("GET", "/info"), ("POST", "/threads/search"), ("POST", "/threads"),
                         ("POST", "/assistants/search"), ("GET", "/store/items?namespace=a&key=b"),
                         ("POST", "/runs/wait"), ("GET", "/threads/00000000-0000-4000-8000-000000000001")]:
        r = httpx.request(method, base + path, json={} if method == "POST" else None)
        body = assert_error_body(r, 401)
        assert body["error"] == "unauthorized", describe(r)
        assert r.headers["www-authenticate"].startswith("Bearer"), r.headers
        assert "invalid_token" not in r.headers["www-authenticate"], r.headers


@pytest.mark.parametrize("headers, why", [
    ({"x-api-key": "wrong"}, "Invalid API key"),
    ({"Authorization": "Bearer wrong"}, "not a JWT"),
    ({"Authorization": f"Bearer {token(exp=int(time.time()) - 3600)}"}, "expired"),
    ({"Authorization": f"Bearer {token(aud='another-service')}"}, "aud"),
    ({"Authorization": f"Bearer {token(iss='https://evil.example.test')}"}, "iss"),
    ({"Authorization": f"Bearer {token(nbf=int(time.time()) + 3600)}"}, "not valid yet"),
    ({"Authorization": "Bearer " + jwt.encode({"sub": "carol", "aud": "spindle", "iss": "https://idp.example.test",
                                               "exp": int(time.time()) + 60}, "a-guessed-secret-" + "x" * 32, algorithm="HS256")},
     "signature"),
])
def test_invalid_credentials_are_401_saying_why(auth_server, headers, why):
    r = httpx.post(auth_server.base_url + "/threads/search", json={}, headers=headers)
    body = assert_error_body(r, 401)
    assert why in body["message"], describe(r)
    assert 'error="invalid_token"' in r.headers["www-authenticate"], r.headers


async def test_official_clients_authenticate_with_an_api_key_or_a_token(auth_server):
    """The official client's `api_key` (sent as `x-api-key`) and an `Authorization` header
    both work; each caller is the user their credentials name."""
    alice = get_client(url=auth_server.base_url, api_key=ALICE_KEY)
    carol = get_client(url=auth_server.base_url, api_key=None,
                       headers={"Authorization": f"Bearer {token()}"})
    try:
        for client, user in [(alice, "alice"), (carol, "carol")]:
            thread = await client.threads.create()
            assert thread["user_id"] == user, thread
            seen = (await client.runs.wait(thread["thread_id"], "whoami", input={}))["seen"]
            assert seen["langgraph_auth_user_id"] == user, seen
        seen = (await alice.runs.wait(None, "whoami", input={}))["seen"]
        assert seen["langgraph_auth_user"] == {
            "identity": "alice", "display_name": "Alice", "permissions": ALICE_PERMISSIONS,
            "is_authenticated": True,
        }, seen
        assert seen["langgraph_auth_permissions"] == ALICE_PERMISSIONS, seen
        seen = (await carol.runs.wait(None, "whoami", input={}))["seen"]
        assert seen["langgraph_auth_user"]["display_name"] == "Carol", seen
        assert seen["langgraph_auth_permissions"] == ["threads:*"], seen
    finally:
        await alice.aclose()
        await carol.aclose()


async def test_python_graphs_see_the_caller_as_langgraph_does(auth_server):
    if not WORKER_PYTHON:
        if os.environ.get("SPINDLE_TEST_REQUIRE_PYTHON") == "1":
            pytest.fail("SPINDLE_TEST_REQUIRE_PYTHON=1 but SPINDLE_TEST_PYTHON is not set")
        pytest.skip("SPINDLE_TEST_PYTHON is not set")
    alice = get_client(url=auth_server.base_url, api_key=ALICE_KEY)
    try:
        seen = (await alice.runs.wait(None, "pywho", input={}))["seen"]
    finally:
        await alice.aclose()
    assert seen == {
        "identity": "alice", "display_name": "Alice", "permissions": ALICE_PERMISSIONS,
        "is_authenticated": True, "user_id": "alice", "permissions_key": ALICE_PERMISSIONS,
    }, seen


# --------------------------------------------------------------------------------------------
# isolation: every endpoint, as the other user
# --------------------------------------------------------------------------------------------


def alices_world(alice: httpx.Client) -> dict:
    """One of everything, Alice's: an assistant, a thread with a finished run, a cron, a store
    item."""
    tag = secrets.token_hex(4)
    assistant = alice.post("/assistants", json={"graph_id": "chain", "name": f"alice-{tag}",
                                                "metadata": {"tag": tag}}).json()
    thread = alice.post("/threads", json={"metadata": {"tag": tag}}).json()
    tid = thread["thread_id"]
    r = alice.post(f"/threads/{tid}/runs/wait", json={"assistant_id": assistant["assistant_id"], "input": {"n": 1}})
    assert r.status_code == 200, describe(r)
    run = alice.get(f"/threads/{tid}/runs").json()[0]
    cron = alice.post(f"/threads/{tid}/runs/crons", json={
        "assistant_id": assistant["assistant_id"], "schedule": "0 0 1 1 *", "input": {"n": 2}}).json()
    # Its first run, made by the creation: over before Bob starts.
    assert alice.get(f"/threads/{tid}/runs/{cron['run_id']}/join").status_code == 200
    r = alice.put("/store/items", json={"namespace": ["notes", tag], "key": "k", "value": {"secret": tag}})
    assert r.status_code == 204, describe(r)
    checkpoint = alice.get(f"/threads/{tid}/state").json()["checkpoint"]["checkpoint_id"]
    return {"tag": tag, "assistant": assistant["assistant_id"], "thread": tid, "run": run["run_id"],
            "cron": cron["cron_id"], "checkpoint": checkpoint, "values": alice.get(f"/threads/{tid}/state").json()["values"]}


def foreign_requests(w: dict) -> list[tuple[str, str, object]]:
    t, r, a, c, cp = w["thread"], w["run"], w["assistant"], w["cron"], w["checkpoint"]
    run = {"assistant_id": "chain", "input": {"n": 1}}
    return [
        ("GET", f"/threads/{t}", None),
        ("PATCH", f"/threads/{t}", {"metadata": {"owner": "bob"}}),
        ("DELETE", f"/threads/{t}", None),
        ("GET", f"/threads/{t}/state", None),
        ("GET", f"/threads/{t}/state/{cp}", None),
        ("POST", f"/threads/{t}/state/checkpoint", {"checkpoint": {"checkpoint_id": cp}}),
        ("POST", f"/threads/{t}/state", {"values": {"n": 99}}),
        ("GET", f"/threads/{t}/history", None),
        ("POST", f"/threads/{t}/history", {"limit": 5}),
        ("POST", f"/threads/{t}/copy", {}),
        ("GET", f"/threads/{t}/runs", None),
        ("POST", f"/threads/{t}/runs", run),
        ("POST", f"/threads/{t}/runs", {**run, "if_not_exists": "create"}),
        ("POST", f"/threads/{t}/runs/stream", run),
        ("POST", f"/threads/{t}/runs/wait", run),
        ("GET", f"/threads/{t}/runs/{r}", None),
        ("GET", f"/threads/{t}/runs/{r}/join", None),
        ("GET", f"/threads/{t}/runs/{r}/stream", None),
        ("POST", f"/threads/{t}/runs/{r}/cancel", None),
        ("DELETE", f"/threads/{t}/runs/{r}", None),
        ("GET", f"/runs/{r}/stream", None),
        ("POST", "/runs/cancel", {"thread_id": t, "run_ids": [r]}),
        ("GET", f"/threads/{t}/stream", None),
        ("POST", f"/threads/{t}/stream/events", {"channels": ["values", "lifecycle"], "since": 0}),
        ("POST", f"/threads/{t}/runs/crons", {**run, "schedule": "0 0 1 1 *"}),
        ("GET", f"/runs/crons/{c}", None),
        ("PATCH", f"/runs/crons/{c}", {"enabled": False}),
        ("DELETE", f"/runs/crons/{c}", None),
        ("GET", f"/assistants/{a}", None),
        ("PATCH", f"/assistants/{a}", {"name": "bob's now"}),
        ("GET", f"/assistants/{a}/graph", None),
        ("GET", f"/assistants/{a}/schemas", None),
        ("GET", f"/assistants/{a}/subgraphs", None),
        ("POST", f"/assistants/{a}/versions", {}),
        ("POST", f"/assistants/{a}/latest", {"version": 1}),
        ("DELETE", f"/assistants/{a}", None),
        ("POST", "/runs", {**run, "assistant_id": a}),
        ("POST", "/runs/wait", {**run, "assistant_id": a}),
        ("POST", "/runs/stream", {**run, "assistant_id": a}),
        ("POST", "/runs/batch", [run, {**run, "assistant_id": a}]),
        ("POST", "/runs/crons", {**run, "assistant_id": a, "schedule": "0 0 1 1 *"}),
        ("GET", f"/store/items?namespace=notes.{w['tag']}&key=k", None),
    ]


def test_another_users_resources_are_404_on_every_endpoint(alice, bob):
    world = alices_world(alice)
    bob_before = bob.post("/threads/search", json={"limit": 1000}).json()
    for method, path, body in foreign_requests(world):
        r = bob.request(method, path, json=body) if body is not None else bob.request(method, path)
        assert r.status_code == 404, f"{method} {path}: {describe(r)}"
        assert world["tag"] not in r.text, f"{method} {path} leaks: {describe(r)}"
        assert r.json()["error"] == "not_found", describe(r)
    # Protocol commands answer in the protocol's error body: as for a thread that does not exist.
    t = world["thread"]
    for method, params in [("state.get", {}), ("agent.getTree", {}),
                           ("run.start", {"assistant_id": "chain", "input": {"n": 5}})]:
        r = bob.post(f"/threads/{t}/commands", json={"id": 1, "method": method, "params": params})
        assert r.status_code == 200, describe(r)
        assert r.json() == {"type": "error", "id": 1, "error": "invalid_argument",
                            "message": "Thread not found"}, f"{method}: {describe(r)}"
    nowhere = "00000000-0000-4000-8000-%012x" % secrets.randbits(48)
    r = bob.post(f"/threads/{nowhere}/commands", json={"id": 1, "method": "state.get", "params": {}})
    assert r.json() == {"type": "error", "id": 1, "error": "invalid_argument", "message": "Thread not found"}
    # The WebSocket of the thread's protocol stream refuses its upgrade the same way.
    ws_url = alice.base_url.copy_with(scheme="ws").join(f"/threads/{world['thread']}/stream/events")
    async def open_socket():
        async with websockets.connect(str(ws_url), additional_headers={"x-api-key": BOB_KEY}):
            pass
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        asyncio.run(open_socket())
    assert refused.value.response.status_code == 404

    # Nothing of Alice's is listed for Bob.
    listed = [
        bob.post("/threads/search", json={"metadata": {"tag": world["tag"]}}).json(),
        bob.post("/assistants/search", json={"metadata": {"tag": world["tag"]}}).json(),
        bob.post("/runs/crons/search", json={"assistant_id": world["assistant"]}).json(),
        bob.post("/store/items/search", json={"namespace_prefix": ["notes"]}).json()["items"],
        bob.post("/store/namespaces", json={}).json()["namespaces"],
    ]
    assert listed == [[], [], [], [], []], listed
    assert bob.post("/threads/count", json={"metadata": {"tag": world["tag"]}}).json() == 0
    assert bob.post("/assistants/count", json={"metadata": {"tag": world["tag"]}}).json() == 0
    assert bob.post("/runs/crons/count", json={"assistant_id": world["assistant"]}).json() == 0
    # Prune of Alice's thread is not found and touches nothing, also beside a thread of Bob's;
    # Bob made no thread through any refused request.
    bobs = bob.post("/threads", json={}).json()["thread_id"]
    for ids in ([world["thread"]], [bobs, world["thread"]]):
        r = bob.post("/threads/prune", json={"thread_ids": ids, "strategy": "delete"})
        assert_error_body(r, 404)
    assert bob.get(f"/threads/{bobs}").status_code == 200
    assert bob.delete(f"/threads/{bobs}").status_code == 200
    assert bob.post("/threads/search", json={"limit": 1000}).json() == bob_before

    # Alice's world is as she left it.
    t = world["thread"]
    assert alice.get(f"/threads/{t}/state").json()["values"] == world["values"]
    assert alice.get(f"/threads/{t}").json()["metadata"]["tag"] == world["tag"]
    assert world["run"] in [r["run_id"] for r in alice.get(f"/threads/{t}/runs").json()]
    assert alice.get(f"/threads/{t}/runs/{world['run']}").json()["status"] == "success"
    assert alice.get(f"/runs/crons/{world['cron']}").json()["enabled"] is True
    assert alice.get(f"/assistants/{world['assistant']}").json()["name"] == f"alice-{world['tag']}"
    item = alice.get(f"/store/items?namespace=notes.{world['tag']}&key=k").json()
    assert item["value"] == {"secret": world["tag"]}


def test_system_assistants_are_visible_to_all_and_store_namespaces_are_per_user(alice, bob):
    """The graphs' default assistants are everyone's; the same store namespace and key are two
    items, one per user."""
    for who in (alice, bob):
        found = who.post("/assistants/search", json={"graph_id": "chain"}).json()
        assert any(a["metadata"].get("created_by") == "system" for a in found), found
        r = who.post("/threads/search", json={})
        assert r.status_code == 200
    ns = ["shared", secrets.token_hex(4)]
    assert alice.put("/store/items", json={"namespace": ns, "key": "k", "value": {"by": "alice"}}).status_code == 204
    assert bob.put("/store/items", json={"namespace": ns, "key": "k", "value": {"by": "bob"}}).status_code == 204
    for who, name in [(alice, "alice"), (bob, "bob")]:
        item = who.get(f"/store/items?namespace={'.'.join(ns)}&key=k").json()
        assert item["value"] == {"by": name}, item
        found = who.post("/store/items/search", json={"namespace_prefix": ns}).json()["items"]
        assert [i["value"]["by"] for i in found] == [name], found
    # Bob deleting "his" item leaves Alice's.
    assert bob.request("DELETE", "/store/items", json={"namespace": ns, "key": "k"}).status_code == 204
    assert alice.get(f"/store/items?namespace={'.'.join(ns)}&key=k").json()["value"] == {"by": "alice"}


def test_streams_of_another_users_run_never_reach_them(alice, bob):
    """Bob, following Alice's thread or run with every kind of stream while her run executes,
    gets 404 at once and no event of it; Alice's own streams carry it."""
    thread = alice.post("/threads", json={}).json()
    tid = thread["thread_id"]
    run = alice.post(f"/threads/{tid}/runs", json={"assistant_id": "slow",
                                                   "input": {"delay_ms": 600, "ticks": 3}}).json()
    rid = run["run_id"]
    for path in [f"/threads/{tid}/runs/{rid}/stream", f"/threads/{tid}/runs/{rid}/join",
                 f"/threads/{tid}/stream", f"/runs/{rid}/stream"]:
        with bob.stream("GET", path) as r:
            assert r.status_code == 404, f"{path}: {r.status_code}"
    with bob.stream("POST", f"/threads/{tid}/stream/events", json={"channels": ["values"]}) as r:
        assert r.status_code == 404
    # Alice's own join sees the run to its end.
    r = alice.get(f"/threads/{tid}/runs/{rid}/join")
    assert r.status_code == 200, describe(r)
    assert alice.get(f"/threads/{tid}/runs/{rid}").json()["status"] == "success"


def test_a_crons_firings_run_as_the_user_who_made_it(alice, bob):
    thread = alice.post("/threads", json={}).json()
    tid = thread["thread_id"]
    cron = alice.post(f"/threads/{tid}/runs/crons", json={
        "assistant_id": "whoami", "schedule": "* * * * * *", "input": {}}).json()
    try:
        deadline = time.time() + 20
        while len(alice.get(f"/threads/{tid}/runs").json()) < 3 and time.time() < deadline:
            time.sleep(0.3)
        runs = alice.get(f"/threads/{tid}/runs").json()
        assert len(runs) >= 3, runs
    finally:
        assert alice.delete(f"/runs/crons/{cron['cron_id']}").status_code in (200, 204)
    # Every firing ran as Alice, with her permissions (the first run was made by the request).
    for run in runs:
        assert run["kwargs"]["langgraph_auth_user"]["identity"] == "alice", run
    seen = alice.get(f"/threads/{tid}/state").json()["values"]["seen"]
    assert seen["langgraph_auth_user_id"] == "alice" and seen["langgraph_auth_permissions"] == ALICE_PERMISSIONS, seen
    # A client cannot make a cron fire as someone else: the payload's user is the server's.
    cron = alice.post(f"/threads/{tid}/runs/crons", json={
        "assistant_id": "whoami", "schedule": "0 0 1 1 *", "input": {}}).json()
    patched = alice.patch(f"/runs/crons/{cron['cron_id']}", json={
        "langgraph_auth_user": {"identity": "alice", "permissions": ["*"]}})
    assert patched.status_code == 200, describe(patched)
    assert patched.json()["payload"]["langgraph_auth_user"]["permissions"] == ALICE_PERMISSIONS
    alice.delete(f"/runs/crons/{cron['cron_id']}")
    assert bob.post("/runs/crons/search", json={"thread_id": tid}).json() == []


async def test_the_official_client_sees_another_users_thread_as_not_found(auth_server, alice):
    world_thread = alice.post("/threads", json={}).json()["thread_id"]
    bob = get_client(url=auth_server.base_url, api_key=None, headers={"Authorization": f"Bearer {BOB_KEY}"})
    try:
        with pytest.raises(NotFoundError):
            await bob.threads.get(world_thread)
        with pytest.raises(NotFoundError):
            await bob.threads.get_state(world_thread)
        # `wait` reads its answer as a stream: the client raises httpx's error for it.
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await bob.runs.wait(world_thread, "chain", input={"n": 1})
        assert refused.value.response.status_code == 404
    finally:
        await bob.aclose()


# --------------------------------------------------------------------------------------------
# permissions
# --------------------------------------------------------------------------------------------


def test_permissions_refuse_actions_they_do_not_grant(enforcing_server):
    base = enforcing_server.base_url
    alice = httpx.Client(base_url=base, headers={"x-api-key": ALICE_KEY})
    bob = httpx.Client(base_url=base, headers={"x-api-key": BOB_KEY})
    try:
        # Bob may read and search threads and assistants, nothing else.
        assert bob.post("/threads/search", json={}).status_code == 200
        assert bob.post("/assistants/search", json={}).status_code == 200
        for method, path, body in [("POST", "/threads", {}), ("POST", "/runs/wait", {"assistant_id": "chain"}),
                                   ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": {}}),
                                   ("POST", "/runs/crons/search", {}), ("POST", "/assistants", {"graph_id": "chain"})]:
            r = bob.request(method, path, json=body)
            error = assert_error_body(r, 403)
            assert error["error"] == "forbidden" and ":" in error["message"], describe(r)
        assert bob.post("/threads/search", json={}).json() == []
        # A protocol command needs the action of what it does.
        tid = alice.post("/threads", json={}).json()["thread_id"]
        r = bob.post(f"/threads/{tid}/commands", json={"id": 1, "method": "run.start",
                                                      "params": {"assistant_id": "chain", "input": {"n": 1}}})
        assert r.json().get("error") == "permission_denied", describe(r)
        # Alice's grants cover what she does; the permission check never reveals another's
        # resource: Bob's read of Alice's thread is still a 404.
        assert alice.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "chain", "input": {"n": 1}}).status_code == 200
        assert bob.get(f"/threads/{tid}").status_code == 404
    finally:
        alice.close()
        bob.close()


# --------------------------------------------------------------------------------------------
# JWTs signed with public keys: a key file, a JWKS at a URL
# --------------------------------------------------------------------------------------------


class JwksServer(LocalServer):
    """An identity provider's `/.well-known/jwks.json`, counting how often it is read."""

    def __init__(self):
        self.keys: list[dict] = []
        self.reads = 0
        outer = self

        class Handler(QuietHandler):
            def do_GET(self):
                outer.reads += 1
                body = json.dumps({"keys": outer.keys}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(Handler)
        self.url = f"{self.origin}/.well-known/jwks.json"

    def add(self, kid: str, private_key, alg: str) -> None:
        algorithm = jwt.get_algorithm_by_name(alg)
        jwk = json.loads(algorithm.to_jwk(private_key.public_key()))
        self.keys.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})


def signed(private_key, alg: str, kid: str | None = None, **claims) -> str:
    body = {"sub": "dana", "exp": int(time.time()) + 300, **claims}
    return jwt.encode(body, private_key, algorithm=alg, headers={"kid": kid} if kid else None)


def test_tokens_verified_with_a_jwks_url_cached_and_read_again_for_a_new_key(tmp_path):
    idp = JwksServer()
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    idp.add("r1", rsa_key, "RS256")
    idp.add("e1", ec_key, "ES256")
    config = {"graphs": {"chain": str(EXAMPLES / "chain.yaml")},
              "auth": {"jwt": {"jwks_url": idp.url}}}
    try:
        with spindle(tmp_path, "serve", config) as srv:
            def status(token: str) -> httpx.Response:
                return httpx.post(srv.base_url + "/threads/search", json={},
                                  headers={"Authorization": f"Bearer {token}"})
            for _ in range(5):
                assert status(signed(rsa_key, "RS256", "r1")).status_code == 200
                assert status(signed(ec_key, "ES256", "e1")).status_code == 200
            reads = idp.reads
            assert reads <= 2, reads  # read once (at most twice), then cached
            # The provider rotates its keys: a token of the new key is accepted at once.
            new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            idp.add("r2", new_key, "RS256")
            time.sleep(1.1)  # reads are at most one a second
            assert status(signed(new_key, "RS256", "r2")).status_code == 200
            assert idp.reads == reads + 1
            # A key the provider does not publish, or a forged signature, is refused.
            r = status(signed(new_key, "RS256", "nobody"))
            assert "nobody" in assert_error_body(r, 401)["message"], describe(r)
            r = status(signed(new_key, "RS256", "r1"))
            assert "signature" in assert_error_body(r, 401)["message"], describe(r)
            # An HS256 token cannot pass as one of the provider's (algorithm confusion).
            r = status(jwt.encode({"sub": "x", "exp": int(time.time()) + 60}, "k" * 32,
                                  algorithm="HS256", headers={"kid": "r1"}))
            assert_error_body(r, 401)
    finally:
        idp.close()


def test_tokens_verified_with_a_public_key_file(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "idp.pem").write_bytes(pem)
    config = {"graphs": {"chain": str(EXAMPLES / "chain.yaml")},
              "auth": {"jwt": {"public_key_file": str(tmp_path / "idp.pem"),
                               "identity_claim": "email", "permissions_claim": "scope"}}}
    with spindle(tmp_path, "serve", config) as srv:
        good = signed(key, "ES256", email="dana@example.test", scope="threads:read threads:create")
        r = httpx.post(srv.base_url + "/threads", json={}, headers={"Authorization": f"Bearer {good}"})
        assert r.status_code == 200, describe(r)
        assert r.json()["user_id"] == "dana@example.test"
        # Without the claim that names the user, the token names nobody.
        r = httpx.post(srv.base_url + "/threads", json={},
                       headers={"Authorization": f"Bearer {signed(key, 'ES256')}"})
        assert "email" in assert_error_body(r, 401)["message"], describe(r)


def test_docs_can_require_credentials(tmp_path):
    config = {"graphs": {"chain": str(EXAMPLES / "chain.yaml")},
              "auth": {"api_keys": [{"identity": "ann", "key_sha256": hashlib.sha256(b"k").hexdigest()}],
                       "public_docs": False}}
    with spindle(tmp_path, "serve", config) as srv:
        for path in ["/docs/", "/openapi.json"]:
            assert_error_body(httpx.get(srv.base_url + path), 401)
            assert httpx.get(srv.base_url + path, headers={"x-api-key": "k"}).status_code == 200
        assert httpx.get(srv.base_url + "/ok").status_code == 200


def test_an_auth_section_with_a_mistake_stops_the_server_naming_it(tmp_path):
    config = {"graphs": {"chain": str(EXAMPLES / "chain.yaml")},
              "auth": {"api_keys": [{"identity": "ann", "key_env": "E2E_UNSET_KEY"}]}}
    path = tmp_path / "spindle.json"
    path.write_text(json.dumps(config))
    r = harness.run(["serve", "--database-url", f"sqlite://{tmp_path / 'db'}", "--port", "0",
                     "--config", str(path)], tmp_path)
    assert r.returncode != 0
    assert "auth.api_keys[0].key_env" in r.stderr and "E2E_UNSET_KEY" in r.stderr, r.stderr
    assert not (tmp_path / "db").exists()


# --------------------------------------------------------------------------------------------
# LangGraph's custom auth: a Python Auth object (auth.path), run by the workers
# --------------------------------------------------------------------------------------------

CUSTOM_AUTH = '''
from langgraph_sdk import Auth

auth = Auth()

USERS = {
    "tok-ann": {"identity": "ann", "display_name": "Ann", "project": "apollo", "permissions": ["write"]},
    "tok-ben": {"identity": "ben", "project": "gemini"},
    "tok-cat": {"identity": "cat", "project": "apollo"},
}


def mine_or_shared(ctx):
    """LangGraph's filter operators: the caller's project's threads, or those shared with them."""
    return {"$or": [{"project": ctx.user.project},
                    {"shared_with": {"$contains": ctx.user.identity}}]}


@auth.authenticate
async def authenticate(authorization: str | None, headers: dict):
    if headers.get(b"x-client") != b"e2e":
        raise Auth.exceptions.HTTPException(status_code=401, detail="no x-client header")
    if not authorization or not authorization.startswith("Bearer "):
        raise Auth.exceptions.HTTPException(status_code=401, detail="missing token")
    user = USERS.get(authorization.split(" ", 1)[1])
    if user is None:
        raise Auth.exceptions.HTTPException(status_code=401, detail="invalid token")
    return user


@auth.on.threads.create
async def stamp_owner(ctx: Auth.types.AuthContext, value: dict):
    metadata = value.setdefault("metadata", {}) or {}
    metadata.setdefault("project", ctx.user.project)
    metadata["owner"] = ctx.user.identity
    value["metadata"] = metadata


@auth.on.threads.delete
async def keep_threads(ctx, value):
    # One by one, threads are kept; a prune (`thread_ids`) may remove those of the filter.
    if "thread_ids" not in value:
        raise Auth.exceptions.HTTPException(status_code=403, detail="threads are kept")
    return mine_or_shared(ctx)


@auth.on.threads.create_run
async def no_runs_of_nope(ctx, value):
    if value.get("assistant_id") == "nope":
        raise Auth.exceptions.HTTPException(status_code=403, detail="no runs of nope")
    # As LangGraph's examples do: the run (and a thread made for it) carries its owner's project.
    metadata = value.setdefault("metadata", {}) or {}
    metadata["project"] = ctx.user.project
    value["metadata"] = metadata
    return {"project": ctx.user.project}


@auth.on.threads
async def own_project(ctx, value):
    return mine_or_shared(ctx)


@auth.on.crons.create
async def stamp_cron_owner(ctx, value):
    assert ctx.user.identity == "cat", f"crons.{ctx.action} is not allowed"
    metadata = value.setdefault("metadata", {}) or {}
    metadata.setdefault("owner", ctx.user.identity)
    value["metadata"] = metadata


@auth.on.crons
async def cats_crons(ctx, value):
    # Only cat may use crons here (the others meet the default handler's refusal).
    assert ctx.user.identity == "cat", f"crons.{ctx.action} is not allowed"
    return {"$and": [{"$or": [{"owner": ctx.user.identity}, {"team": "crons"}]},
                     {"kind": {"$eq": "cron"}}]}


@auth.on.assistants.create
async def stamp_assistant_owner(ctx, value):
    metadata = value.setdefault("metadata", {}) or {}
    metadata.setdefault("owner", ctx.user.identity)
    value["metadata"] = metadata


@auth.on.assistants.delete
async def unsupported_filter(ctx, value):
    return {"owner": {"$ne": "nobody"}}


@auth.on.assistants
async def own_or_system_assistants(ctx, value):
    return {"$or": [{"owner": ctx.user.identity}, {"created_by": "system"}]}


@auth.on.store
async def own_namespace(ctx, value):
    if "namespace" in value and value["namespace"] is not None:
        value["namespace"] = [ctx.user.identity, *value["namespace"]]
    if ctx.action == "put" and isinstance(value.get("value"), dict):
        value["value"].setdefault("owner", ctx.user.identity)
    if ctx.action == "search":
        return {"owner": ctx.user.identity}


@auth.on
async def default_deny(ctx, value):
    assert ctx.resource in ("assistants",), f"{ctx.resource}.{ctx.action} is not allowed"
'''


@pytest.fixture(scope="module", params=BACKENDS)
def custom_server(request):
    if not WORKER_PYTHON:
        if os.environ.get("SPINDLE_TEST_REQUIRE_PYTHON") == "1":
            pytest.fail("SPINDLE_TEST_REQUIRE_PYTHON=1 but SPINDLE_TEST_PYTHON is not set")
        pytest.skip("SPINDLE_TEST_PYTHON is not set")
    folder = Path(tempfile.mkdtemp(prefix="spindle-e2e-custom-auth-"))
    (folder / "auth.py").write_text(CUSTOM_AUTH)
    (folder / "whoami.yaml").write_text(WHOAMI_GRAPH)
    config = {"graphs": {"whoami": "./whoami.yaml"}, "auth": {"path": "./auth.py:auth"}}
    (folder / "spindle.json").write_text(json.dumps(config))
    # One worker is enough here, and starts sooner on a busy machine.
    args = ["--config", str(folder / "spindle.json"), "--python", WORKER_PYTHON, "--python-workers", "1"]
    try:
        yield from _session_server(request.param, extra_args=args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def custom_client(server, token: str | None) -> httpx.Client:
    headers = {"x-client": "e2e"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=server.base_url, headers=headers, timeout=30)


def test_custom_auth_authenticates_with_the_projects_handler(custom_server):
    for token, detail in [(None, "missing token"), ("tok-nobody", "invalid token")]:
        with custom_client(custom_server, token) as c:
            r = c.post("/threads/search", json={})
            assert assert_error_body(r, 401)["message"] == detail, describe(r)
            assert r.headers["www-authenticate"].startswith("Bearer")
    # The handler reads the headers too.
    r = httpx.post(custom_server.base_url + "/threads/search", json={},
                   headers={"Authorization": "Bearer tok-ann"})
    assert assert_error_body(r, 401)["message"] == "no x-client header", describe(r)
    assert httpx.get(custom_server.base_url + "/ok").status_code == 200


def test_custom_auth_handlers_stamp_filter_and_refuse(custom_server):
    with custom_client(custom_server, "tok-ann") as ann, custom_client(custom_server, "tok-ben") as ben:
        # The create handler's changes to `value` are what is stored.
        mine = ann.post("/threads", json={"metadata": {"topic": "moon"}}).json()
        assert mine["metadata"] == {"topic": "moon", "project": "apollo", "owner": "ann"}, mine
        # A thread of another project (the client set it): outside ann's filter.
        other = ann.post("/threads", json={"metadata": {"project": "artemis"}}).json()
        assert other["metadata"]["project"] == "artemis"
        found = ann.post("/threads/search", json={"limit": 100}).json()
        assert mine["thread_id"] in [t["thread_id"] for t in found]
        assert all(t["metadata"]["project"] == "apollo" for t in found), found
        assert ann.post("/threads/count", json={}).json() == len(found)
        # Asking for what the filter excludes finds nothing, even the thread that has it.
        assert ann.post("/threads/search", json={"metadata": {"project": "artemis"}}).json() == []
        assert ann.post("/threads/count", json={"metadata": {"project": "artemis"}}).json() == 0
        r = ann.get(f"/threads/{other['thread_id']}")
        assert_error_body(r, 404)
        assert ann.get(f"/threads/{mine['thread_id']}").status_code == 200
        # Refusals: the handler's status and detail.
        r = ann.delete(f"/threads/{mine['thread_id']}")
        assert assert_error_body(r, 403)["message"] == "threads are kept", describe(r)
        r = ann.post("/runs/crons/search", json={})
        assert "crons.search is not allowed" in assert_error_body(r, 403)["message"], describe(r)
        # A run, and a protocol command starting one, go through the create_run handler.
        tid = mine["thread_id"]
        r = ann.post(f"/threads/{tid}/runs", json={"assistant_id": "nope"})
        assert assert_error_body(r, 403)["message"] == "no runs of nope", describe(r)
        r = ann.post(f"/threads/{tid}/commands", json={"id": 1, "method": "run.start",
                                                        "params": {"assistant_id": "nope"}})
        assert r.json()["error"] == "permission_denied" and "no runs of nope" in r.json()["message"], describe(r)
        r = ann.post(f"/threads/{tid}/commands", json={"id": 2, "method": "state.get", "params": {}})
        assert r.json()["type"] == "success", describe(r)
        # Each user reaches only their own, as always.
        assert_error_body(ben.get(f"/threads/{mine['thread_id']}"), 404)
        # The graph sees the caller with the handler's extra fields.
        r = ann.post(f"/threads/{mine['thread_id']}/runs/wait", json={"assistant_id": "whoami", "input": {}})
        seen = r.json()["seen"]
        assert seen["langgraph_auth_user"]["project"] == "apollo", seen
        assert seen["langgraph_auth_user"]["display_name"] == "Ann", seen
        assert seen["langgraph_auth_permissions"] == ["write"], seen
        # A thread moved out of the filter takes its runs along, also when named by run id.
        run_id = ann.get(f"/threads/{tid}/runs").json()[0]["run_id"]
        assert ann.get(f"/runs/{run_id}/stream").status_code == 200
        assert ann.patch(f"/threads/{tid}", json={"metadata": {"project": "artemis"}}).status_code == 200
        assert_error_body(ann.get(f"/runs/{run_id}/stream"), 404)
        assert_error_body(ann.get(f"/threads/{tid}/runs/{run_id}"), 404)


def test_custom_auth_store_handlers_rewrite_namespaces(custom_server):
    with custom_client(custom_server, "tok-ann") as ann:
        ns = ["notes", secrets.token_hex(4)]
        r = ann.put("/store/items", json={"namespace": ns, "key": "k", "value": {"v": 1}})
        assert r.status_code == 204, describe(r)
        item = ann.get(f"/store/items?namespace={'.'.join(ns)}&key=k").json()
        assert item["namespace"] == ["ann", *ns], item
        found = ann.post("/store/items/search", json={"namespace_prefix": ns}).json()["items"]
        assert [i["namespace"] for i in found] == [["ann", *ns]], found


def custom_sdk(server, token: str):
    """The official client, as a custom-auth deployment's users call it."""
    return get_client(url=server.base_url, api_key=None, timeout=30,
                      headers={"x-client": "e2e", "Authorization": f"Bearer {token}"})


@pytest.fixture
def cat(custom_server):
    client = custom_sdk(custom_server, "tok-cat")
    yield client
    _loop().run_until_complete(client.aclose())


@pytest.fixture
def ben(custom_server):
    client = custom_sdk(custom_server, "tok-ben")
    yield client
    _loop().run_until_complete(client.aclose())


async def wait_not_found(run) -> None:
    """`runs.wait` reads its answer as a stream: the client raises httpx's error for a 404."""
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await run
    assert refused.value.response.status_code == 404


async def test_custom_auth_filters_with_operators_select_threads(custom_server, cat):
    """`$or` and `$contains` (the threads handler: the caller's project, or shared with them)
    select what a search, a count and a read reach, in the database and on each thread, as
    LangGraph evaluates them; the client's own metadata filter applies besides."""
    tag = secrets.token_hex(4)
    own = await cat.threads.create(metadata={"tag": tag})
    shared = await cat.threads.create(metadata={"tag": tag, "project": "zeta", "shared_with": ["dan", "cat"]})
    other = await cat.threads.create(metadata={"tag": tag, "project": "zeta", "shared_with": ["dan"]})
    # `$contains` asks for a list holding the value: a plain string does not.
    plain = await cat.threads.create(metadata={"tag": tag, "project": "zeta", "shared_with": "cat"})
    assert own["metadata"]["project"] == "apollo", own
    found = await cat.threads.search(metadata={"tag": tag}, limit=100)
    assert {t["thread_id"] for t in found} == {own["thread_id"], shared["thread_id"]}, found
    assert await cat.threads.count(metadata={"tag": tag}) == 2
    zeta = await cat.threads.search(metadata={"tag": tag, "project": "zeta"})
    assert [t["thread_id"] for t in zeta] == [shared["thread_id"]], zeta
    assert (await cat.threads.get(shared["thread_id"]))["metadata"]["project"] == "zeta"
    for hidden in (other, plain):
        with pytest.raises(NotFoundError):
            await cat.threads.get(hidden["thread_id"])
        with pytest.raises(NotFoundError):
            await cat.runs.list(hidden["thread_id"])
    # The create_run handler's filter (the caller's project) holds on the thread a run is
    # started on, by a request or by the agent protocol's command: a shared thread of another
    # project can be read, not run on.
    with pytest.raises(NotFoundError):
        await cat.runs.create(shared["thread_id"], "whoami", input={})
    with custom_client(custom_server, "tok-cat") as http:
        command = {"id": 1, "method": "run.start", "params": {"assistant_id": "whoami", "input": {}}}
        answer = http.post(f"/threads/{shared['thread_id']}/commands", json=command).json()
    assert (answer["type"], answer["error"]) == ("error", "permission_denied"), answer
    assert await cat.runs.list(shared["thread_id"]) == []


async def test_custom_auth_filters_with_operators_select_assistants(custom_server, cat):
    """LangGraph's own example, `{"$or": [{"owner": identity}, {"created_by": "system"}]}`: the
    caller's assistants and the system's are readable, searchable and runnable; another
    owner's (set by the client) is not found anywhere, and a run of it is refused, as
    creating a run needs read access to its assistant."""
    tag = secrets.token_hex(4)
    mine = await cat.assistants.create("whoami", metadata={"tag": tag})
    theirs = await cat.assistants.create("whoami", metadata={"tag": tag, "owner": "dan"})
    assert mine["metadata"]["owner"] == "cat", mine
    assert (await cat.assistants.get(mine["assistant_id"]))["assistant_id"] == mine["assistant_id"]
    system = await cat.assistants.get("whoami")
    assert system["metadata"]["created_by"] == "system", system
    found = await cat.assistants.search(metadata={"tag": tag})
    assert [a["assistant_id"] for a in found] == [mine["assistant_id"]], found
    assert await cat.assistants.count(metadata={"tag": tag}) == 1
    everything = await cat.assistants.search(limit=1000)
    assert system["assistant_id"] in [a["assistant_id"] for a in everything]
    assert theirs["assistant_id"] not in [a["assistant_id"] for a in everything]
    with pytest.raises(NotFoundError):
        await cat.assistants.get(theirs["assistant_id"])
    # Runs: of their own assistant and the system's, yes; of another owner's, not found, and
    # nothing is created (on a new thread, or on a thread of theirs).
    thread = await cat.threads.create(metadata={"tag": tag})
    tid = thread["thread_id"]
    assert "seen" in await cat.runs.wait(tid, mine["assistant_id"], input={})
    assert "seen" in await cat.runs.wait(tid, "whoami", input={})
    with pytest.raises(NotFoundError):
        await cat.runs.create(tid, theirs["assistant_id"], input={})
    await wait_not_found(cat.runs.wait(None, theirs["assistant_id"], input={}))
    with pytest.raises(NotFoundError):
        await cat.runs.create_batch([{"assistant_id": "whoami", "input": {}},
                                     {"assistant_id": theirs["assistant_id"], "input": {}}])
    # A run started by the agent protocol's command needs read access to its assistant too.
    with custom_client(custom_server, "tok-cat") as http:
        command = {"id": 1, "method": "run.start",
                   "params": {"assistant_id": theirs["assistant_id"], "input": {}}}
        answer = http.post(f"/threads/{tid}/commands", json=command).json()
    assert (answer["type"], answer["error"]) == ("error", "permission_denied"), answer
    assert len(await cat.runs.list(tid)) == 2


async def test_custom_auth_filters_with_operators_select_crons(custom_server, cat):
    """`$and` of an `$or` and an `$eq` (the crons handler) selects the crons a search, a count
    and a read reach."""
    tag = secrets.token_hex(4)

    async def cron(**metadata):
        return await cat.crons.create("whoami", schedule="0 0 1 1 *", enabled=False,
                                      metadata={"tag": tag, "kind": "cron", **metadata})
    mine = await cron()
    team = await cron(owner="dan", team="crons")
    theirs = await cron(owner="dan")
    other_kind = await cron(kind="job")
    assert mine["metadata"]["owner"] == "cat", mine
    found = await cat.crons.search(metadata={"tag": tag}, limit=100)
    assert {c["cron_id"] for c in found} == {mine["cron_id"], team["cron_id"]}, found
    assert await cat.crons.count(metadata={"tag": tag}) == 2
    with custom_client(custom_server, "tok-cat") as http:
        assert http.get(f"/runs/crons/{team['cron_id']}").status_code == 200
        for hidden in (theirs, other_kind):
            assert_error_body(http.get(f"/runs/crons/{hidden['cron_id']}"), 404)


async def test_custom_auth_filter_spindle_cannot_apply_is_an_error(custom_server, cat):
    """A handler's operator Spindle cannot apply (`$ne` here) is an error naming it, never a
    filter that matches nothing or everything, and the request changes nothing."""
    mine = await cat.assistants.create("whoami", metadata={"tag": secrets.token_hex(4)})
    with custom_client(custom_server, "tok-cat") as http:
        r = http.delete(f"/assistants/{mine['assistant_id']}")
    assert "$ne" in assert_error_body(r, 500)["message"], describe(r)
    assert (await cat.assistants.get(mine["assistant_id"]))["assistant_id"] == mine["assistant_id"]


async def test_custom_auth_runs_on_new_threads_stay_their_owners(custom_server, cat):
    """A run on a thread made for it (stateless with `on_completion: keep`, `/runs/batch`,
    `if_not_exists: create`) carries what the create_run handler stamped on the run into the
    thread's metadata, as LangGraph does: its owner can join it and read the thread."""
    kept = await cat.runs.create(None, "whoami", input={}, on_completion="keep")
    assert "seen" in await cat.runs.join(kept["thread_id"], kept["run_id"])
    thread = await cat.threads.get(kept["thread_id"])
    assert thread["metadata"]["project"] == "apollo", thread
    batch = await cat.runs.create_batch([
        {"assistant_id": "whoami", "input": {}, "on_completion": "keep"},
        {"assistant_id": "whoami", "input": {}, "on_completion": "keep", "metadata": {"n": 2}},
    ])
    for run in batch:
        assert "seen" in await cat.runs.join(run["thread_id"], run["run_id"])
        assert (await cat.threads.get(run["thread_id"]))["metadata"]["project"] == "apollo"
    assert (await cat.threads.get(batch[1]["thread_id"]))["metadata"]["n"] == 2
    tid = str(uuid.uuid4())
    made = await cat.runs.create(tid, "whoami", input={}, if_not_exists="create")
    assert "seen" in await cat.runs.join(tid, made["run_id"])


async def test_custom_auth_another_users_thread_is_not_found_for_prune_and_runs(cat, ben):
    """Another user's thread, or one of the caller's outside the filter, is 404 for a prune
    (which then prunes nothing) and for a run with `if_not_exists: create` (which creates
    nothing); the caller's own threads are pruned."""
    bens = await ben.threads.create(metadata={"keep": True})
    mine = await cat.threads.create()
    outside = await cat.threads.create(metadata={"project": "zeta"})
    for ids in ([bens["thread_id"]], [mine["thread_id"], bens["thread_id"]], [outside["thread_id"]]):
        with pytest.raises(NotFoundError):
            await cat.threads.prune(ids)
    assert (await cat.threads.get(mine["thread_id"]))["thread_id"] == mine["thread_id"]
    await wait_not_found(cat.runs.wait(bens["thread_id"], "whoami", input={}, if_not_exists="create"))
    assert await ben.runs.list(bens["thread_id"]) == []
    assert (await ben.threads.get(bens["thread_id"]))["metadata"] == {"keep": True, "project": "gemini", "owner": "ben"}
    assert await cat.threads.prune([mine["thread_id"]]) == {"pruned_count": 1}
    with pytest.raises(NotFoundError):
        await cat.threads.get(mine["thread_id"])


async def test_custom_auth_store_search_meets_the_handlers_filter(custom_server, cat):
    """A store search handler's filter is on the items' values, as in LangGraph: it holds
    besides the client's own filter."""
    ns = ["notes", secrets.token_hex(4)]
    await cat.store.put_item(ns, "mine", {"n": 1})
    await cat.store.put_item(ns, "theirs", {"n": 2, "owner": "dan"})
    found = (await cat.store.search_items(ns, limit=100))["items"]
    assert [(i["key"], i["value"]) for i in found] == [("mine", {"n": 1, "owner": "cat"})], found
    assert (await cat.store.search_items(ns, filter={"n": 2}))["items"] == []
    assert [i["key"] for i in (await cat.store.search_items(ns, filter={"n": 1}))["items"]] == ["mine"]


def test_custom_auth_users_permissions_are_enforced_when_asked(tmp_path):
    """`enforce_permissions` holds under custom auth too: the permissions the handler answers
    must grant each route's action, as they must an API key's."""
    if not WORKER_PYTHON:
        if os.environ.get("SPINDLE_TEST_REQUIRE_PYTHON") == "1":
            pytest.fail("SPINDLE_TEST_REQUIRE_PYTHON=1 but SPINDLE_TEST_PYTHON is not set")
        pytest.skip("SPINDLE_TEST_PYTHON is not set")
    (tmp_path / "auth.py").write_text(CUSTOM_AUTH)
    config = {"graphs": {"chain": str(EXAMPLES / "chain.yaml")},
              "auth": {"path": "./auth.py:auth", "enforce_permissions": True},
              "server": {"python": WORKER_PYTHON, "python_workers": 1}}
    with spindle(tmp_path, "serve", config) as srv, custom_client(srv, "tok-ann") as ann:
        # Ann's handler-given permissions are ["write"]: no `threads:search`.
        r = ann.post("/threads/search", json={})
        assert "threads:search" in assert_error_body(r, 403)["message"], describe(r)
        assert ann.get("/ok").status_code == 200
