"""The component in a project of a team's own: found by ``dg``, scaffolded, and complete on its
own under the project's stock ``definitions.py``."""

from __future__ import annotations

import json

from favorites_maintenance_tests.helpers.host_project import host_project, run_dg

COMPONENT = "favorites_maintenance.RetentionPolicy"


def test_dg_lists_the_component_in_a_project_that_does_not_name_the_package(tmp_path):
    root = host_project(tmp_path)
    listed = run_dg(root, "list", "components", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    keys = {item["key"] for item in json.loads(listed.stdout)["items"]}
    assert COMPONENT in keys
    assert "dagster.DefsFolderComponent" in keys
