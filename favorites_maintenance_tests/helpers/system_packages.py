"""Tests that need a program from the system's packages (Chromium, PgBouncer, PostgreSQL,
Prometheus' promtool and Pushgateway)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest


def missing(message: str) -> None:
    """The program a test needs is not installed: skip the test locally, fail it under
    ``CI=true`` (where ``.ci/run`` installs it, so its absence is a broken CI)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def require_program(name: str, install_hint: str) -> str:
    """Path of the executable ``name`` (also looked for in ``/usr/sbin`` and ``/usr/bin``, often
    not on a user's PATH); without it skip the test, or fail it when ``CI=true``."""
    binary = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if binary is None:
        missing(f"{name} is not installed ({install_hint})")
    return binary


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop ``proc`` by its pid: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)


class ServerProcess:
    """A program from the system's packages run as a server for a test: started in a temporary
    folder, on a free port of 127.0.0.1 (another if that one was taken meanwhile), its output
    in ``<name>.log`` there, and stopped by its pid.

    Subclasses give :attr:`name`, the command (:meth:`_command`, with :attr:`port` and
    :attr:`folder` set) and the wait until it serves (:meth:`_wait_until_serving`).

    Args:
        binary: the executable (see :func:`require_program`).
    """

    name = "server"

    def __init__(self, binary: str):
        self.binary = binary
        self.port: int | None = None
        self.folder: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def log_text(self) -> str:
        """What the server has logged so far (its stdout and stderr)."""
        if self.folder is None or not (self.folder / f"{self.name}.log").exists():
            return ""
        return (self.folder / f"{self.name}.log").read_text(errors="replace")

    def start(self, timeout: float = 10.0):
        """Start the server and wait until it serves; returns ``self``.

        Raises:
            RuntimeError: it exited, or did not serve within ``timeout`` seconds; the message
                ends with its log.
        """
        from favorites_maintenance_tests.helpers.dev_stack import free_port

        attempts = 3  # another process may take the free port before the server binds it
        while True:
            attempts -= 1
            self.folder = Path(tempfile.mkdtemp(prefix=f"favorites-{self.name}-"))
            self.port = free_port()
            try:
                args = self._command()
                self._log = open(self.folder / f"{self.name}.log", "ab")
                self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                              stderr=subprocess.STDOUT, cwd=self.folder)
                self._wait_until_serving(timeout)
                return self
            except RuntimeError:
                port_taken = "address already in use" in self.log_text().lower()
                self.stop()
                if not port_taken or not attempts:
                    raise
            except BaseException:
                self.stop()
                raise

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its pid (SIGTERM, then SIGKILL after ``timeout`` seconds) and
        remove its folder; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _wait_until_serving(self, timeout: float) -> None:
        raise NotImplementedError
