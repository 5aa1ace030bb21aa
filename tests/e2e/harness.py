"""Starting and stopping the real `spindle` binary, and scratch PostgreSQL databases."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO / "target" / "release" / "spindle"

POSTGRES_URL = os.environ.get("SPINDLE_TEST_POSTGRES_URL", "").strip()
START_TIMEOUT = float(os.environ.get("SPINDLE_E2E_START_TIMEOUT", "10"))

POSTGRES_SKIP_REASON = (
    "SPINDLE_TEST_POSTGRES_URL is not set: the PostgreSQL end-to-end tests were SKIPPED "
    "(set it, e.g. postgres://postgres@127.0.0.1:5432/test, to run them)"
)


@dataclass
class Server:
    backend: str
    base_url: str
    proc: subprocess.Popen | None = None
    stdout_path: Path | None = None
    stderr_path: Path | None = None
    argv: list[str] = field(default_factory=list)
    database: str | None = None

    def output(self) -> str:
        """Everything the server printed so far (stdout then stderr)."""
        parts = []
        for label, path in (("stdout", self.stdout_path), ("stderr", self.stderr_path)):
            if path and path.exists():
                parts.append(f"--- {label} ---\n" + path.read_text(errors="replace"))
        return "\n".join(parts)


def spindle_bin() -> Path:
    path = Path(os.environ.get("SPINDLE_BIN") or DEFAULT_BIN)
    if not path.is_file():
        pytest.fail(
            f"spindle binary not found at {path}: build it with `cargo build --release` "
            "or point SPINDLE_BIN at it",
            pytrace=False,
        )
    return path


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without SPINDLE_* settings, which would override the test's flags."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINDLE_")}
    env.setdefault("RUST_BACKTRACE", "1")
    env.update(extra or {})
    return env


def tail(text: str, limit: int = 6000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error = "no attempt"
    with httpx.Client(timeout=2.0) as c:
        while time.monotonic() < deadline:
            if server.proc is not None and server.proc.poll() is not None:
                raise RuntimeError(f"exited with code {server.proc.returncode}")
            try:
                r = c.get(server.base_url + "/ok")
                if r.status_code == 200:
                    return
                last_error = f"GET /ok answered {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as e:
                last_error = f"{type(e).__name__}: {e}"
            time.sleep(0.05)
    raise RuntimeError(f"GET /ok not ready after {timeout:.0f}s ({last_error})")


def stop(server: Server) -> None:
    """Terminate the process, then kill it if it does not exit within 10 s."""
    proc = server.proc
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def start(
    backend: str,
    args_for_port: Callable[[int], list[str]],
    workdir: Path,
    *,
    timeout: float = START_TIMEOUT,
    env: dict[str, str] | None = None,
) -> Server:
    """Start the binary on a free 127.0.0.1 port and wait for GET /ok.

    The process runs in ``workdir``, which holds no spindle.json, so the built-in example graphs
    are served (`serve` needs ``--examples`` for that). On failure the test fails with the server's captured output.
    """
    binary = spindle_bin()
    failure = ""
    for attempt in range(3):
        port = free_port()
        stem = f"{backend}.{int(time.time() * 1000)}.{attempt}"
        server = Server(
            backend=backend,
            base_url=f"http://127.0.0.1:{port}",
            stdout_path=workdir / f"{stem}.stdout.log",
            stderr_path=workdir / f"{stem}.stderr.log",
        )
        server.argv = [str(binary), *args_for_port(port)]
        with open(server.stdout_path, "wb") as out, open(server.stderr_path, "wb") as err:
            server.proc = subprocess.Popen(
                server.argv,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=child_env(env),
            )
        try:
            _wait_ready(server, timeout)
            return server
        except RuntimeError as e:
            stop(server)
            output = server.output()
            failure = (
                f"spindle ({backend}) did not become ready: {e}\n"
                f"command: {' '.join(server.argv)}\n{tail(output)}"
            )
            if "already in use" in output.lower() or "addrinuse" in output.lower():
                continue  # lost the race for the port; try another one
            break
    pytest.fail(failure, pytrace=False)


def run(args: list[str], workdir: Path, env: dict[str, str] | None = None, timeout: float = 60):
    """Run a one-shot spindle command (e.g. migrate) and return the CompletedProcess."""
    return subprocess.run(
        [str(spindle_bin()), *args],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=child_env(env),
        timeout=timeout,
    )


@contextlib.contextmanager
def serve_on_one_database(count: int, workdir: Path, *extra_args: str) -> Iterator[list[Server]]:
    """``count`` `spindle serve` processes on one fresh PostgreSQL database (dropped after)."""
    dbname = create_database()
    url = pg_url_with_db(POSTGRES_URL, dbname)
    servers = []
    try:
        for _ in range(count):
            servers.append(
                start(
                    "postgres",
                    lambda port: [
                        "serve", "--host", "127.0.0.1", "--port", str(port),
                        "--database-url", url, "--examples", *extra_args,
                    ],
                    workdir,
                )
            )
        yield servers
    finally:
        for server in servers:
            stop(server)
        drop_database(dbname)


# --------------------------------------------------------------------------------------------
# PostgreSQL scratch databases
# --------------------------------------------------------------------------------------------


def pg_url_with_db(url: str, dbname: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + dbname))


def _pg_admin(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement)


def create_database(admin_url: str = POSTGRES_URL) -> str:
    """Create an empty database spindle_e2e_<random> and return its name."""
    dbname = f"spindle_e2e_{secrets.token_hex(6)}"
    try:
        _pg_admin(admin_url, f'CREATE DATABASE "{dbname}"')
    except Exception as e:
        pytest.fail(
            f"SPINDLE_TEST_POSTGRES_URL={admin_url} is set but a database could not be created "
            f"there: {e}",
            pytrace=False,
        )
    return dbname


def drop_database(dbname: str, admin_url: str = POSTGRES_URL) -> None:
    try:
        try:
            _pg_admin(admin_url, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        except Exception:  # PostgreSQL < 13 has no WITH (FORCE)
            _pg_admin(
                admin_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{dbname}' AND pid <> pg_backend_pid()",
            )
            _pg_admin(admin_url, f'DROP DATABASE IF EXISTS "{dbname}"')
    except Exception as e:  # never hide the test outcome behind a cleanup error
        print(f"warning: could not drop database {dbname}: {e}")


class Storage:
    """One database several server processes in a row are started on: a SQLite file in
    `workdir`, or a PostgreSQL database made for it (skipped without PostgreSQL), dropped by
    `close`. Tests that restart or kill servers subclass it with the arguments they serve."""

    def __init__(self, backend: str, workdir: Path):
        self.backend = backend
        self.workdir = workdir
        self.dbname: str | None = None
        if backend == "postgres":
            if not POSTGRES_URL:
                pytest.skip(POSTGRES_SKIP_REASON)
            self.dbname = create_database()
            self.database_url = pg_url_with_db(POSTGRES_URL, self.dbname)
        else:
            self.database_url = str(workdir / "spindle.db")

    def close(self) -> None:
        if self.dbname:
            drop_database(self.dbname)


def storage_in_tempdir(make: Callable[[str, Path], Storage], backend: str, prefix: str) -> Iterator[Storage]:
    """A fixture body: `make(backend, workdir)` in a fresh folder, closed and removed after."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-{backend}-"))
    st = make(backend, workdir)
    try:
        yield st
    finally:
        st.close()
        shutil.rmtree(workdir, ignore_errors=True)

