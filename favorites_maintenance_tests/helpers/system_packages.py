"""Tests that need a program from the system's packages (Chromium, PgBouncer, PostgreSQL,
Prometheus' promtool and Pushgateway)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from favorites_maintenance.local.processes import Probe, Process, StartError, free_port


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


class ServerProcess:
    """A program from the system's packages run as a server for a test: started in a temporary
    folder, on a free port of 127.0.0.1 (another if that one was taken meanwhile), its output
    in ``<name>.log`` there, and stopped by its pid (a
    :class:`~favorites_maintenance.local.processes.Process`).

    Subclasses give :attr:`name`, the command (:meth:`_command`, with :attr:`port` and
    :attr:`folder` set), what tells it serves (:meth:`_probe`, see
    :data:`~favorites_maintenance.local.processes.Probe`) and, if not SIGTERM,
    :attr:`stop_signal`.

    Args:
        binary: the executable (see :func:`require_program`).
    """

    name = "server"
    stop_signal = signal.SIGTERM

    def __init__(self, binary: str):
        self.binary = binary
        self.port: int | None = None
        self.folder: Path | None = None
        self._proc: Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def log_text(self) -> str:
        """What the server has logged so far (its stdout and stderr)."""
        return "" if self._proc is None else self._proc.log_text()

    def start(self, timeout: float = 10.0):
        """Start the server and wait until it serves; returns ``self``.

        Raises:
            StartError: (a ``RuntimeError``) it exited, or did not serve within ``timeout``
                seconds; the message ends with the tail of its log.
        """
        attempts = 3  # another process may take the free port before the server binds it
        while True:
            attempts -= 1
            self.folder = Path(tempfile.mkdtemp(prefix=f"favorites-{self.name}-"))
            self.port = free_port()
            try:
                self._proc = Process.start(self._command(), log=self.folder / f"{self.name}.log",
                                           name=self.name, cwd=self.folder,
                                           stop_signal=self.stop_signal)
                self._proc.wait_until_ready(self._probe(), timeout)
                return self
            except StartError:
                port_taken = "address already in use" in self.log_text().lower()
                self.stop()
                if not port_taken or not attempts:
                    raise
            except BaseException:
                self.stop()
                raise

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its pid (:attr:`stop_signal`, then SIGKILL after ``timeout``
        seconds) and remove its folder; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(grace_s=timeout)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _probe(self) -> Probe:
        raise NotImplementedError
