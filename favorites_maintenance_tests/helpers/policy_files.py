"""A policy file in the real ``favorites_maintenance/defs/`` folder for the length of a test, as
a newcomer adds one: what the code location, ``dg`` and the command line read."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import favorites_maintenance.defs

DEFS = Path(favorites_maintenance.defs.__file__).parent

#: A second policy with a misspelled field (``retention_dayz``, line 8), as a newcomer writes it.
MISSPELLED = """\
type: favorites_maintenance.RetentionPolicy
attributes:
  name: guest_carts
  table: carts.guest_carts
  key_column: cart_uuid
  age_column: touched_at
  null_columns: [customer_ref]
  retention_dayz: 30
"""
#: The one line every tool shows for :data:`MISSPELLED` written as ``defs/guest_carts``.
MISSPELLED_ERROR = ("favorites_maintenance/defs/guest_carts/defs.yaml:8: policy guest_carts, "
                    "retention_dayz: not a field of a retention policy (did you mean "
                    "retention_days?)")


@contextlib.contextmanager
def defs_folder(name: str, text: str | None = None) -> Iterator[Path]:
    """``favorites_maintenance/defs/<name>/`` (with ``defs.yaml`` holding ``text``, when given)
    for the length of the ``with`` block; removed after, whatever happened."""
    folder = DEFS / name
    assert not folder.exists(), f"{folder} exists already: remove it"
    try:
        if text is not None:
            folder.mkdir()
            (folder / "defs.yaml").write_text(text)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
