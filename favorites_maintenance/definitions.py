"""The code location: every retention policy of ``favorites_maintenance/defs/`` and the
resources they share, built the one way production, the tests and the command line use.

Each policy is one folder, ``defs/<policy>/defs.yaml``, of component type
``favorites_maintenance.RetentionPolicy`` (README, "Adding a retention policy");
``defs/resources.py`` holds the shared resources. Settings are read and validated when the code
location loads: an invalid ``FAVORITES_*`` variable or policy field stops the load with a
message naming it.
"""

from __future__ import annotations

import dagster as dg

from favorites_maintenance.components.policy_tree import (
    component_tree,
    load_policies,
    quiet_previews,
)
from favorites_maintenance.config.deployment import load_deployment_settings
from favorites_maintenance.pipeline.resources import deployed_retention


def code_location(tree: dg.ComponentTree | None = None) -> dg.Definitions:
    """The definitions of the components of ``tree`` (default: ``defs/``), plus the one
    resource that depends on every policy: ``retention``, the run limits a launch may set
    (:func:`~favorites_maintenance.pipeline.resources.deployed_retention`).

    Raises:
        favorites_maintenance.config.parsers.SettingsError: a deployment variable that is
            malformed, named (checked first, before any policy).
        favorites_maintenance.components.policy_tree.PolicyLoadError: a malformed policy or
            setting, named.
    """
    load_deployment_settings()  # a bad URL is named here, not inside Dagster's tree error
    tree = tree or component_tree()
    policies = load_policies(tree)
    with quiet_previews():
        component_defs = tree.build_defs()
    return dg.Definitions.merge(
        component_defs,
        dg.Definitions(resources={"retention": deployed_retention(policies)}),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The code location Dagster loads (``workspace.yaml``, ``pyproject.toml``)."""
    return code_location()
