"""A host project: a Dagster project of a team's own, made as ``create-dagster project`` makes
one (``pyproject.toml`` with ``[tool.dg]``, the stock ``definitions.py``, a ``defs`` folder), in
a temporary folder, with the package installed beside it rather than inside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DG = Path(sys.executable).parent / "dg"

#: The ``definitions.py`` ``create-dagster project`` writes.
STOCK_DEFINITIONS = '''\
from pathlib import Path

from dagster import definitions, load_from_defs_folder


@definitions
def defs():
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
'''


def host_project(root: Path, module: str = "my_platform") -> Path:
    """A project ``root`` whose package is ``module``, its ``definitions.py`` Dagster's stock
    one and its ``defs/`` folder empty; returns ``root``."""
    package = root / "src" / module
    (package / "defs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(STOCK_DEFINITIONS)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{module.replace("_", "-")}"\nversion = "0.1.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n'
        f'[tool.dg.project]\nroot_module = "{module}"\n')
    return root


#: A module of a host project's own ``defs/``: an asset, resources named as the package's once
#: were, and an executor of its own.
HOST_DEFINITIONS = '''\
import dagster as dg


class Warehouse(dg.ConfigurableResource):
    name: str = "warehouse"


@dg.asset
def daily_report(database: Warehouse) -> str:
    return database.name


defs = dg.Definitions(
    assets=[daily_report],
    resources={"database": Warehouse(), "alerts": Warehouse(name="pager"),
               "retention": Warehouse(name="legal")},
    executor=dg.multiprocess_executor.configured({"max_concurrent": 2}, name="host_executor"),
)
'''

#: A guest-favorites policy on the dev table, as a host fills in a scaffolded file.
HOST_POLICY = '''\
type: favorites_maintenance.RetentionPolicy

attributes:
  name: {name}
  table: favorites.favorites
  key_column: id
  age_column: updated_at
  null_columns: [user_id]
  retention_days: 30
  partitions_start: 2026-01-01
  target_batch_duration: PT0S
'''


def add_policy(root: Path, name: str, module: str = "my_platform") -> Path:
    """``defs/<name>/defs.yaml`` of project ``root``: :data:`HOST_POLICY` for ``name``."""
    folder = root / "src" / module / "defs" / name
    folder.mkdir(parents=True)
    (folder / "defs.yaml").write_text(HOST_POLICY.format(name=name))
    return folder / "defs.yaml"


def run_dg(root: Path, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    """``dg *args`` in project ``root``, on an instance of its own (default settings, in a
    folder of ``root``), its package importable from ``src/``, no ``FAVORITES_`` variable
    but those of ``env``."""
    if not DG.exists():
        pytest.fail(f"dg not found next to {sys.executable}: install the test extras "
                    "(pip install -e '.[test]')")
    home = root / ".dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    clean.update(env or {}, DAGSTER_HOME=str(home), PYTHONPATH=str(root / "src"))
    return subprocess.run([str(DG), *args], cwd=root, env=clean, capture_output=True,
                          text=True, timeout=300)
