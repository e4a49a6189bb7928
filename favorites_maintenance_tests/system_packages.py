"""Tests that need a program from the system's packages (Chromium, PgBouncer, PostgreSQL,
Prometheus' promtool and Pushgateway)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

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
