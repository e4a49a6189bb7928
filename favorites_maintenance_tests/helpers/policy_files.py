"""Policy files as a newcomer adds them, in a Dagster project of the test's own (a host project
in its temporary folder, beside the real guest-favorites policy): what ``dg`` and the command
line read, with ``-m`` or from the project's folder. No test writes into the package's own
``favorites_maintenance/defs/``: every other test's code location reads it."""

from __future__ import annotations

from pathlib import Path

import favorites_maintenance.defs
from favorites_maintenance_tests.helpers.host_project import host_project

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


def misspelled_error(folder: str) -> str:
    """The one line every tool shows for :data:`MISSPELLED` written as ``<folder>/guest_carts``
    (``folder`` relative to its project's root)."""
    return (f"{folder}/guest_carts/defs.yaml:8: policy guest_carts, retention_dayz: not a field "
            "of a retention policy (did you mean retention_days?)")


def policy_project(root: Path, policies: dict[str, str | None] | None = None,
                   module: str = "my_platform") -> Path:
    """A host project ``root`` (package ``module``, under ``src/``) whose ``defs/`` holds the
    real guest-favorites policy and a folder per entry of ``policies`` (folder name: the
    ``defs.yaml`` text, or ``None`` for an empty folder); returns ``root``.

    A test loading it in its own process names a ``module`` of its own: Python imports a
    package name once per process."""
    host_project(root, module)
    defs = root / "src" / module / "defs"
    for name, text in {"guest_favorites": (DEFS / "guest_favorites" / "defs.yaml").read_text(),
                       **(policies or {})}.items():
        (defs / name).mkdir()
        if text is not None:
            (defs / name / "defs.yaml").write_text(text)
    return root
