"""Clients cannot hold a server's connections: request headers must arrive whole within
`--header-timeout-secs` (a client sending them a byte at a time held its connection for as long
as it liked), and at most `--max-connections` are served at once, the rest waiting until one
closes. Streams that last longer than the header timeout are not cut."""

from __future__ import annotations

import socket
import time

import harness
import httpx
import pytest
from conftest import BACKENDS, EXTERNAL_URL, _session_server
from langgraph_sdk import get_client

HEADER_TIMEOUT = 1
MAX_CONNECTIONS = 4

pytestmark = pytest.mark.skipif(bool(EXTERNAL_URL), reason="needs a server of its own")


@pytest.fixture(scope="module", params=BACKENDS)
def bounded(request):
    """A server with a 1 s header timeout and 4 connections at most (its own: the session
    server's clients keep connections idle for longer)."""
    yield from _session_server(
        request.param,
        extra_args=[
            "--header-timeout-secs", str(HEADER_TIMEOUT),
            "--max-connections", str(MAX_CONNECTIONS),
        ],
    )


def connect(server: harness.Server) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def closed_after(sock: socket.socket, within: float, trickle: bytes = b"") -> float | None:
    """Sends `trickle` a byte every 0.2 s while waiting for the server to end the connection
    (EOF, after any response); the seconds it took, or None when still open after `within`."""
    start = time.monotonic()
    sock.settimeout(0.2)
    sent = 0
    while time.monotonic() - start < within:
        try:
            if not sock.recv(4096):
                return time.monotonic() - start
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - start
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent : sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - start
            sent += 1
    return None


def test_headers_sent_a_byte_at_a_time_are_cut_off(bounded):
    with connect(bounded) as sock:
        slow_head = b"GET /ok HTTP/1.1\r\nHost: spindle\r\nX-Slow: " + b"a" * 100
        took = closed_after(sock, within=HEADER_TIMEOUT + 3, trickle=slow_head)
    assert took is not None, "a client trickling its headers kept its connection"
    assert took >= HEADER_TIMEOUT - 0.2, took


def test_an_idle_connection_is_closed(bounded):
    with connect(bounded) as sock:
        assert closed_after(sock, within=HEADER_TIMEOUT + 3) is not None


def test_whole_requests_are_served_on_kept_alive_connections(bounded):
    with httpx.Client(base_url=bounded.base_url, timeout=5) as http:
        for _ in range(3):
            assert http.get("/ok").status_code == 200
            time.sleep(HEADER_TIMEOUT / 4)


async def test_a_stream_longer_than_the_header_timeout_is_not_cut(bounded):
    client = get_client(url=bounded.base_url, api_key=None, timeout=30)
    try:
        thread = await client.threads.create()
        chunks = [
            chunk
            async for chunk in client.runs.stream(
                thread["thread_id"], "slow", input={"delay_ms": 900, "ticks": 0},
                stream_mode="values",
            )
        ]
    finally:
        await client.aclose()
    assert chunks[-1].data["ticks"] == 2, chunks


def open_stream(server: harness.Server, thread_id: str) -> socket.socket:
    """A connection held by a thread's join stream (which lasts until the client leaves)."""
    sock = connect(server)
    sock.sendall(f"GET /threads/{thread_id}/stream HTTP/1.1\r\nHost: spindle\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "the stream did not start"
    return sock


def test_connections_beyond_the_cap_wait_until_one_closes(bounded):
    with httpx.Client(base_url=bounded.base_url, timeout=5) as http:
        thread_id = http.post("/threads", json={}).json()["thread_id"]
    streams = [open_stream(bounded, thread_id) for _ in range(MAX_CONNECTIONS)]
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.get(bounded.base_url + "/ok", timeout=HEADER_TIMEOUT * 1.5)
        streams.pop().close()
        assert httpx.get(bounded.base_url + "/ok", timeout=5).status_code == 200
    finally:
        for sock in streams:
            sock.close()
