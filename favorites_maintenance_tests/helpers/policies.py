"""Code locations of several policies, for the tests of policies on several databases: a defs
folder holding the real ``guest_favorites/defs.yaml`` plus the policies a test writes, loaded
by :func:`~favorites_maintenance.components.policy_tree.code_location` in this process
(:meth:`PolicySandbox.code_location`) or served by a code server process through Dagster's
stock loader (:meth:`PolicySandbox.location_target`, the way ``dagster-daemon`` and the
webserver serve ``workspace.yaml``); :func:`policy_folder` is such a folder that other
processes find too. :func:`location` is the short way in: the code location of such a folder,
its variables set first.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml
from favorites_maintenance_tests.helpers.dagster_internals import ModuleTarget
from dagster.components.testing import DefsFolderSandbox, create_defs_folder_sandbox

import favorites_maintenance.defs
from favorites_maintenance.components.policy_tree import code_location

DEFS = Path(favorites_maintenance.defs.__file__).parent
LOCATION = "favorites_maintenance"

#: The code location module written into a sandbox: its project's stock loader.
_LOCATION_MODULE = '''"""A test's code location: the policies of the sibling defs folder."""
from pathlib import Path

import dagster as dg


@dg.definitions
def defs():
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
'''
#: The policy file of ``attributes``, as :meth:`PolicySandbox.write_policy` writes it.
_POLICY_TYPE = "favorites_maintenance.RetentionPolicy"


def favorites_policy(name: str, **attributes) -> dict:
    """The attributes of a policy on the dev table ``favorites.favorites`` (the guest rule, a
    365-day retention, fixed batches, days from 2026-01-01 as the tests run them), with
    ``attributes`` on top (``database_url_env``, ...)."""
    return {"name": name, "table": "favorites.favorites", "key_column": "id",
            "age_column": "updated_at", "null_columns": ["user_id"],
            "target_batch_duration": "PT0S", "partitions_start": "2026-01-01", **attributes}


@dataclass
class PolicySandbox:
    """A defs folder: the real guest-favorites policy and shared resources, and more policies.

    Attributes:
        sandbox: Dagster's sandbox project (``src/<project>/defs`` inside).
    """

    sandbox: DefsFolderSandbox

    @property
    def defs_folder(self) -> Path:
        return self.sandbox.defs_folder_path

    def write_policy(self, attributes: dict | str) -> None:
        """Add ``<name>/defs.yaml``: a ``favorites_maintenance.RetentionPolicy`` of
        ``attributes``, or, given a string, that text as it stands (its folder named after the
        ``name`` it gives)."""
        if isinstance(attributes, str):
            text, name = attributes, yaml.safe_load(attributes)["attributes"]["name"]
        else:
            text = yaml.safe_dump({"type": _POLICY_TYPE, "attributes": attributes})
            name = attributes["name"]
        folder = self.defs_folder / name
        folder.mkdir()
        (folder / "defs.yaml").write_text(text)

    @contextlib.contextmanager
    def tree(self) -> Iterator[dg.ComponentTree]:
        """The component tree of the folder, importable while the block runs."""
        with self.sandbox.build_component_tree() as tree:
            yield tree

    def code_location(self) -> dg.Definitions:
        """The code location of the folder, loaded now in this process."""
        with self.tree() as tree:
            return code_location(tree)

    def location_target(self) -> ModuleTarget:
        """The folder's code location as a code server loads it (a module of the sandbox,
        imported from its ``src``), under the deployed location's name."""
        module = self.defs_folder.parent / "location.py"
        if not module.exists():
            module.write_text(_LOCATION_MODULE)
        return ModuleTarget(module_name=f"{self.sandbox.project_name}.location", attribute=None,
                            working_directory=str(self.sandbox.project_root / "src"),
                            location_name=LOCATION)


@contextlib.contextmanager
def policy_sandbox(*policies: dict | str) -> Iterator[PolicySandbox]:
    """A :class:`PolicySandbox` holding the real guest-favorites policy and ``policies``
    (attributes of each, or a ``defs.yaml`` text: :meth:`PolicySandbox.write_policy`)."""
    with create_defs_folder_sandbox() as made:
        defs_folder = made.defs_folder_path
        (defs_folder.parent / "__init__.py").touch()
        (defs_folder / "__init__.py").touch()
        (defs_folder / "guest_favorites").mkdir()
        shutil.copy(DEFS / "guest_favorites" / "defs.yaml", defs_folder / "guest_favorites")
        sandbox = PolicySandbox(made)
        for attributes in policies:
            sandbox.write_policy(attributes)
        yield sandbox


def location(*policies: dict | str, env: dict[str, str | None] | None = None,
             monkeypatch: pytest.MonkeyPatch | None = None) -> dg.Definitions:
    """The code location of a temporary project holding the real guest-favorites policy and
    ``policies`` (attributes of each, or a ``defs.yaml`` text), built now in this process as
    Dagster's loader builds it, after each variable of ``env`` is set (``None``: unset) with
    ``monkeypatch``, for the rest of the test: a run reads them when it runs.

    Raises:
        What :func:`~favorites_maintenance.components.policy_tree.code_location` raises for
        a policy or a variable it refuses.
    """
    if env:
        assert monkeypatch is not None, "env is set for the test: pass its monkeypatch"
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
    with policy_sandbox(*policies) as sandbox:
        return sandbox.code_location()


def policy_folder(*policies: dict) -> dg.ComponentTree:
    """The component tree of a defs folder holding the real guest-favorites policy and
    ``policies`` (attributes of each), in the system's temporary folder under a name made from
    what it holds: every process asking for the same policies gets the same folder (the
    executor's step processes and Celery workers reconstruct a job from it). Written once, by
    the first process to ask, and kept for the next ones."""
    files = {"guest_favorites": (DEFS / "guest_favorites" / "defs.yaml").read_text(),
             **{a["name"]: yaml.safe_dump({"type": _POLICY_TYPE, "attributes": a})
                for a in policies}}
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    package = f"favorites_policies_{digest}"
    parent = Path(tempfile.gettempdir()) / "favorites-maintenance-tests"
    root = parent / package
    if not root.exists():
        parent.mkdir(exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=parent, prefix=".staging-"))
        defs = staging / package / "defs"
        defs.mkdir(parents=True)
        (staging / package / "__init__.py").touch()
        (defs / "__init__.py").touch()
        for name, text in files.items():
            (defs / name).mkdir()
            (defs / name / "defs.yaml").write_text(text)
        try:
            staging.rename(root)
        except OSError:  # another process wrote the same folder first
            shutil.rmtree(staging, ignore_errors=True)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    module = importlib.import_module(f"{package}.defs")
    return dg.ComponentTree(defs_module=module, project_root=root)
