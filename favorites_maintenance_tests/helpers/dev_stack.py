"""Helpers of the end-to-end tests: ``favorites-maintenance dev`` as a user runs it, the
webserver's GraphQL API over HTTP, and headless Chromium from the system packages."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from favorites_maintenance.pipeline.assets import ASSET_KEY

ROOT = Path(__file__).resolve().parent.parent
LOCATION = "favorites_maintenance"
REPOSITORY = "__repository__"
ASSET_PATH = list(ASSET_KEY.path)

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(predicate, timeout: float, interval: float = 1.0, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; return it, or fail after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(interval)


def descendants(pid: int) -> set[int]:
    """Pids of every live descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_until_serving(service, timeout: float, *, what: str, who: str = "") -> None:
    """Wait until ``service`` (with ``proc``, ``url``, ``tail()`` and ``seen_pids``) answers
    ``/server_info``; fail at once, with the tail of its log, if its process exits."""
    def up():
        if service.proc.poll() is not None:
            raise AssertionError(f"{who + ' ' if who else ''}exited with "
                                 f"{service.proc.returncode}:\n{service.tail()}")
        service.seen_pids |= descendants(service.proc.pid)
        try:
            with urllib.request.urlopen(f"{service.url}/server_info", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    wait_for(up, timeout, what=what)


@dataclass
class DevStack:
    """``favorites-maintenance dev`` running in a fresh checkout.

    Attributes:
        checkout: folder holding ``dagster.yaml`` and ``workspace.yaml`` (and the local state).
        port: port of the Dagster UI on 127.0.0.1.
        proc: the ``favorites-maintenance dev`` process, leader of its own process group.
        log: its stdout and stderr.
    """

    checkout: Path
    port: int
    proc: subprocess.Popen
    log: Path
    seen_pids: set[int] = field(default_factory=set)

    @classmethod
    def start(cls, checkout: Path, rows: int, env_extra: dict[str, str]) -> "DevStack":
        for name in ("dagster.yaml", "workspace.yaml"):
            shutil.copyfile(ROOT / name, checkout / name)
        os.chmod(checkout, 0o755)
        port = free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FAVORITES_", "DAGSTER_"))}
        env.update(env_extra)
        log = checkout / "dev.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "favorites_maintenance", "dev", "--port", str(port),
                 "--rows", str(rows)],
                cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        return cls(checkout=checkout, port=port, proc=proc, log=log)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pgdata(self) -> Path:
        return self.checkout / ".favorites-maintenance" / "pgdata"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output().splitlines()[-n:])

    def wait_until_serving(self, timeout: float = 120) -> None:
        wait_until_serving(self, timeout, what=f"the Dagster UI on {self.url}", who="dev")
        self.seen_pids |= descendants(self.proc.pid)

    def favorites_engine(self) -> sa.Engine:
        """An engine on the favorites database of the running embedded server (its Unix socket
        and port from ``postmaster.pid``)."""
        lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        port, socket_dir = lines[3].strip(), lines[4].strip()
        return sa.create_engine(sa.URL.create(
            "postgresql+psycopg", username="postgres", database="favorites",
            query={"host": socket_dir, "port": port}))

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            payload = json.load(resp)
        assert not payload.get("errors"), payload["errors"]
        return payload["data"]

    def interrupt(self, timeout: float = 120) -> int:
        """Ctrl-C as a terminal sends it: SIGINT to the foreground process group."""
        self.seen_pids |= descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=timeout)

    def force_cleanup(self) -> None:
        """Whatever happened, leave no process behind: the dev process and everything it
        started, then the embedded server if it still runs."""
        self.seen_pids |= descendants(self.proc.pid) if self.proc.poll() is None else set()
        if self.proc.poll() is None:
            try:
                self.interrupt(timeout=90)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pid in self.seen_pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if (self.pgdata / "postmaster.pid").exists():
            from favorites_maintenance.local.embedded import EmbeddedPostgres

            EmbeddedPostgres(self.pgdata).start().stop()


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(binary: str, url: str, profile: Path, *args: str, budget_ms: int = 15000,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """Run headless Chromium on ``url`` with a fresh profile; ``args`` say what to produce
    (``--dump-dom``, ``--screenshot=PATH``)."""
    profile.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1600,1300",
         f"--virtual-time-budget={budget_ms}", *args, url],
        capture_output=True, text=True, timeout=timeout)


def visible_text(dom: str) -> str:
    """The text of a dumped DOM, scripts and styles dropped, whitespace collapsed."""
    import html
    import re

    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text)
    return re.sub(r"\s+", " ", html.unescape(text))


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    """POST ``query`` to the webserver at ``url``; return its ``data``, failing on ``errors``."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"{url}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            payload = json.load(resp)
    except urllib.error.HTTPError as exc:
        # The webserver answers 500 when the data holds a PythonError: the data is the answer.
        body = exc.read().decode(errors="replace")
        try:
            payload = json.loads(body)
        except ValueError:
            payload = {"errors": f"HTTP {exc.code}: {body[:2000]}"}
    assert not payload.get("errors"), payload["errors"]
    return payload["data"]


@dataclass
class DagsterService:
    """One process of a deployment as ``README.md`` ("Deploying") runs it: ``dagster-webserver``
    or ``dagster-daemon run`` over ``workspace.yaml``, with its own environment.

    Attributes:
        proc: the process, leader of its own process group (its code server runs in it too).
        log: its stdout and stderr.
        port: the webserver's port on 127.0.0.1 (``None`` for the daemon).
    """

    proc: subprocess.Popen
    log: Path
    port: int | None = None
    seen_pids: set[int] = field(default_factory=set)

    @classmethod
    def start(cls, command: str, args: list[str], env: dict[str, str], log: Path,
              port: int | None = None) -> "DagsterService":
        binary = str(Path(sys.executable).parent / command)
        with open(log, "wb") as out:
            proc = subprocess.Popen([binary, *args, "-w", str(ROOT / "workspace.yaml")],
                                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        return cls(proc=proc, log=log, port=port)

    @classmethod
    def webserver(cls, env: dict[str, str], log: Path, *extra: str) -> "DagsterService":
        port = free_port()
        return cls.start("dagster-webserver", ["-h", "127.0.0.1", "-p", str(port), *extra],
                         env, log, port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def wait_until_serving(self, timeout: float = 180) -> None:
        wait_until_serving(self, timeout, what=f"the Dagster webserver on {self.url}")

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        return graphql(self.url, query, variables)

    def stop(self, timeout: float = 60) -> None:
        """SIGINT to the process (it stops its code server), then SIGKILL to whatever of it
        is left."""
        if self.proc.poll() is None:
            self.seen_pids |= descendants(self.proc.pid)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.seen_pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
