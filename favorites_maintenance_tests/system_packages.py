"""Tests that need a program from the system's packages (Chromium, PgBouncer, PostgreSQL)."""

from __future__ import annotations

import os

import pytest


def missing(message: str) -> None:
    """The program a test needs is not installed: skip the test locally, fail it under
    ``CI=true`` (where ``.ci/run`` installs it, so its absence is a broken CI)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)
