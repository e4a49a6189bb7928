"""Helpers of the end-to-end tests: ``favorites-maintenance dev`` as a user runs it, the
webserver's GraphQL API over HTTP, and headless Chromium from the system packages."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from favorites_maintenance_tests.helpers.jobs import ASSET_KEY
from favorites_maintenance.local import processes
from favorites_maintenance.local.processes import Process

#: The checkout: dagster.yaml, workspace.yaml (this file is in favorites_maintenance_tests/helpers).
ROOT = Path(__file__).resolve().parents[2]
LOCATION = "favorites_maintenance"
REPOSITORY = "__repository__"
ASSET_PATH = list(ASSET_KEY.path)

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def wait_for(predicate, timeout: float, interval: float = 1.0, what: str = "condition"):
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy; return
    it, or raise ``TimeoutError`` after ``timeout`` seconds (the helper's ``wait_for``, polling
    a webserver's API once a second by default)."""
    return processes.wait_for(predicate, timeout, interval=interval, what=what)


def server_info(url: str):
    """A probe: the Dagster webserver at ``url`` answers ``/server_info``."""
    return processes.http_probe(f"{url}/server_info", timeout=5)


@dataclass
class DevStack:
    """``favorites-maintenance dev`` running in a fresh checkout.

    Attributes:
        checkout: folder holding ``dagster.yaml`` and ``workspace.yaml`` (and the local state).
        port: port of the Dagster UI on 127.0.0.1.
        process: the ``favorites-maintenance dev`` process, leader of its own process group,
            stopped as a terminal's Ctrl-C stops it (SIGINT to the group).
    """

    checkout: Path
    port: int
    process: Process

    @classmethod
    def start(cls, checkout: Path, rows: int, env_extra: dict[str, str]) -> "DevStack":
        for name in ("dagster.yaml", "workspace.yaml"):
            shutil.copyfile(ROOT / name, checkout / name)
        os.chmod(checkout, 0o755)
        port = processes.free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FAVORITES_", "DAGSTER_"))}
        env.update(env_extra)
        process = Process.start(
            [sys.executable, "-m", "favorites_maintenance", "dev", "--port", str(port),
             "--rows", str(rows)],
            log=checkout / "dev.log", name="dev", cwd=checkout, env=env,
            stop_signal=signal.SIGINT, stop_group=True, grace_s=90)
        return cls(checkout=checkout, port=port, process=process)

    @property
    def proc(self) -> subprocess.Popen:
        return self.process.popen

    @property
    def log(self) -> Path:
        """Its stdout and stderr."""
        return self.process.log

    @property
    def seen_pids(self) -> set[int]:
        """Every process of the stack seen so far (the embedded server included: it leaves the
        group)."""
        return self.process.seen_pids

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pgdata(self) -> Path:
        return self.checkout / ".favorites-maintenance" / "pgdata"

    def output(self) -> str:
        return self.process.log_text()

    def tail(self, n: int = 60) -> str:
        return self.process.tail(n)

    def wait_until_serving(self, timeout: float = 120) -> None:
        """Wait until the UI answers; fail at once, with the tail of the log, if dev exits."""
        self.process.wait_until_ready(server_info(self.url), timeout, interval=1.0,
                                      what=f"the Dagster UI on {self.url}")
        self.process.note_descendants()

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
        """Ctrl-C as a terminal sends it: SIGINT to the foreground process group; its exit code
        (``subprocess.TimeoutExpired`` after ``timeout`` seconds)."""
        self.process.send_signal(signal.SIGINT, group=True)
        return self.process.wait(timeout)

    def force_cleanup(self) -> None:
        """Whatever happened, leave no process behind: the dev process and everything it
        started, then the embedded server if it still runs."""
        self.process.stop()
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
    """One process of a deployment as ``docs/deploying.md`` runs it: ``dagster-webserver``
    or ``dagster-daemon run`` over ``workspace.yaml``, with its own environment.

    Attributes:
        process: the process, leader of its own process group (its code server runs in it too),
            stopped with SIGINT (it stops its code server), SIGKILL after the grace period.
        port: the webserver's port on 127.0.0.1 (``None`` for the daemon).
    """

    process: Process
    port: int | None = None

    @classmethod
    def start(cls, command: str, args: list[str], env: dict[str, str], log: Path,
              port: int | None = None, workspace: Path | None = None) -> "DagsterService":
        """Start ``command`` over ``workspace`` (default: the repository's
        ``workspace.yaml``)."""
        binary = str(Path(sys.executable).parent / command)
        workspace = workspace or ROOT / "workspace.yaml"
        process = Process.start([binary, *args, "-w", str(workspace)], log=log,
                                name=command, cwd=ROOT, env=env, stop_signal=signal.SIGINT,
                                grace_s=60)
        return cls(process=process, port=port)

    @classmethod
    def webserver(cls, env: dict[str, str], log: Path, *extra: str,
                  workspace: Path | None = None) -> "DagsterService":
        port = processes.free_port()
        return cls.start("dagster-webserver", ["-h", "127.0.0.1", "-p", str(port), *extra],
                         env, log, port, workspace)

    @property
    def proc(self) -> subprocess.Popen:
        return self.process.popen

    @property
    def log(self) -> Path:
        """Its stdout and stderr."""
        return self.process.log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 40) -> str:
        return self.process.tail(n)

    def wait_until_serving(self, timeout: float = 180) -> None:
        """Wait until the webserver answers; fail at once, with the tail of its log, if it
        exits."""
        self.process.wait_until_ready(server_info(self.url), timeout, interval=1.0,
                                      what=f"the Dagster webserver on {self.url}")

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        return graphql(self.url, query, variables)

    def stop(self, timeout: float = 60) -> None:
        """SIGINT to the process (it stops its code server), then SIGKILL after ``timeout``
        seconds; then whatever of it is left."""
        self.process.stop(grace_s=timeout)
