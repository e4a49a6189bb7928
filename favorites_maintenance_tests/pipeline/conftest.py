"""Fixtures shared by the pipeline tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dagster.components.testing import create_defs_folder_sandbox

import favorites_maintenance.defs

DEFS = Path(favorites_maintenance.defs.__file__).parent
GUEST_FAVORITES_YAML = DEFS / "guest_favorites" / "defs.yaml"


@pytest.fixture
def sandbox():
    """A defs folder with the real guest_favorites policy; tests add more."""
    with create_defs_folder_sandbox() as sandbox:
        (sandbox.defs_folder_path / "guest_favorites").mkdir()
        shutil.copy(GUEST_FAVORITES_YAML, sandbox.defs_folder_path / "guest_favorites")
        yield sandbox
