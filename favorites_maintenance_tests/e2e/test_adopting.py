"""docs/adopting.md end to end, as a team adopts the package: the package's wheel installed into
a project made by ``create-dagster project`` (from PyPI, in a virtual environment of the test's
own, made and filled by uv as Dagster's docs make a project's), beside an asset, resources named
``database``, ``alerts`` and ``retention`` and an executor of the project's; ``dg list
components``, ``dg scaffold defs``, ``dg check defs``, ``dg launch`` of a partition; the rows
deleted and kept, the project's executor, and nothing written into the environment."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from uv import find_uv_bin

from favorites_maintenance_tests.helpers.host_project import HOST_DEFINITIONS

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "my-platform"
MODULE = "my_platform"

pytestmark = pytest.mark.e2e


def _run(args, *, cwd: Path, env: dict | None = None, timeout: float = 900
         ) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def adopter_venv(tmp_path_factory) -> Path:
    """A virtual environment holding create-dagster, dg and the package's wheel (built from
    this checkout), made once per session."""
    folder = tmp_path_factory.mktemp("adopter")
    wheels = folder / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, ROOT],
                 cwd=folder)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = wheels.glob("favorites_maintenance-*.whl")
    venv = folder / "venv"
    made = _run([find_uv_bin(), "venv", "-q", "--python", sys.executable, venv], cwd=folder)
    assert made.returncode == 0, made.stderr
    installed = _run([find_uv_bin(), "pip", "install", "-q", "--python", venv / "bin" / "python",
                      "create-dagster>=1.13.27,<1.14", "dagster-dg-cli>=1.13.27,<1.14", wheel],
                     cwd=folder, timeout=1800)
    if installed.returncode != 0:
        pytest.fail("could not install create-dagster and the wheel from the package index: "
                    + installed.stderr[-2000:])
    return venv


def _files(folder: Path) -> set[str]:
    """Every file under ``folder`` but Python's bytecode caches."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_a_team_adds_a_policy_to_its_own_project_and_it_runs(adopter_venv, db_url, rows,
                                                              tmp_path):
    bin_ = adopter_venv / "bin"
    home = tmp_path / "dagster_home"  # Dagster's default instance: nothing of the package's
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAVORITES_", "DAGSTER_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(PATH=f"{bin_}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(adopter_venv),
               DAGSTER_HOME=str(home))
    made = _run([bin_ / "create-dagster", "project", "--no-uv-sync", PROJECT], cwd=tmp_path,
                env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    project = tmp_path / PROJECT
    (project / "src" / MODULE / "defs" / "platform.py").write_text(HOST_DEFINITIONS)
    linked = _run([find_uv_bin(), "pip", "install", "-q", "--python", bin_ / "python",
                   "--no-deps", "-e", project], cwd=tmp_path, env=env)
    assert linked.returncode == 0, linked.stderr[-2000:]
    before = _files(adopter_venv)

    def dg(*args: str, **extra: str) -> subprocess.CompletedProcess:
        result = _run([bin_ / "dg", *args], cwd=project, env={**env, **extra})
        assert result.returncode == 0, " ".join(args) + "\n" + result.stdout + result.stderr
        return result

    listed = json.loads(dg("list", "components", "--json").stdout)
    assert "favorites_maintenance.RetentionPolicy" in {i["key"] for i in listed["items"]}
    dg("scaffold", "defs", "favorites_maintenance.RetentionPolicy", "guest_favorites",
       "--table", "favorites.favorites", "--key-column", "id", "--age-column", "updated_at",
       "--null-columns", "user_id")
    policy = project / "src" / MODULE / "defs" / "guest_favorites" / "defs.yaml"
    policy.write_text(policy.read_text().replace("  # retention_days: 365",
                                                 "  retention_days: 30"))
    dg("check", "defs")

    now = dt.datetime.now(dt.timezone.utc)
    old = set(rows.add_many(5, updated_at=now - dt.timedelta(days=90)))
    kept = {rows.add(updated_at=now - dt.timedelta(days=90), user_id=7),
            rows.add(updated_at=now - dt.timedelta(days=3))}
    yesterday = (now.date() - dt.timedelta(days=1)).isoformat()
    url = db_url.render_as_string(hide_password=False)
    dg("launch", "--job", "guest_favorites_cleanup_job", "--partition", yesterday,
       FAVORITES_DATABASE_URL=url)
    assert rows.ids() == kept
    assert not old & rows.ids()

    # The project's own asset keeps the project's executor; the policy's job runs in process.
    shown = _run([bin_ / "python", "-c",
                  "import dagster as dg, pathlib, my_platform\n"
                  "defs = dg.load_from_defs_folder(path_within_project=pathlib.Path("
                  "my_platform.__file__).parent)\n"
                  "print(defs.resolve_implicit_global_asset_job_def().executor_def.name,"
                  " defs.resolve_job_def('guest_favorites_cleanup_job').executor_def.name,"
                  " defs.resources['database'].name)"], cwd=project, env=env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert shown.stdout.split() == ["host_executor", "in_process", "warehouse"]
    # Nothing written into the environment: no embedded server, no state of the package's.
    assert _files(adopter_venv) == before
