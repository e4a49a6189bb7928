"""The code location: every retention policy of ``favorites_maintenance/defs/`` and the
resources they share, built the one way production, the tests and the command line use.

Each policy is one folder, ``defs/<policy>/defs.yaml``, of component type
``favorites_maintenance.RetentionPolicy`` (README, "Adding a retention policy");
``defs/resources.py`` holds the resources every policy shares. Settings are read and validated
when the code location loads: an invalid ``FAVORITES_*`` variable, policy field or database
URL stops the load with a message naming it. A database variable that is unset does not: only
the runs of the policies on it are refused, naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from favorites_maintenance.components.policy_tree import (
    PolicyLoadError,
    component_tree,
    load_policies,
    quiet_previews,
)
from favorites_maintenance.config.deployment import (
    check_database_urls,
    load_deployment_settings,
)
from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.policy_defs import policy_definitions
from favorites_maintenance.pipeline.resources import (
    deployed_databases,
    deployed_retention,
)


def code_location(tree: dg.ComponentTree | None = None,
                  extra_policies: Sequence[Policy] = ()) -> dg.Definitions:
    """The definitions of the components of ``tree`` (default: ``defs/``) and of
    ``extra_policies`` (``dev`` adds the policy of its second database this way), plus the
    resources that depend on the policies: ``retention``, the run limits a launch may set
    (:func:`~favorites_maintenance.pipeline.resources.deployed_retention`), and one database
    resource per variable the policies name
    (:func:`~favorites_maintenance.pipeline.resources.deployed_databases`).

    Raises:
        favorites_maintenance.config.parsers.SettingsError: a deployment variable that is
            malformed, named (checked first, before any policy); then a policy's database
            variable set to a malformed URL, named.
        favorites_maintenance.components.policy_tree.PolicyLoadError: a malformed policy or
            setting, named, or two policies of one name.
    """
    load_deployment_settings()  # a bad URL is named here, not inside Dagster's tree error
    tree = tree or component_tree()
    policies = [*load_policies(tree), *extra_policies]
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyLoadError(f"policy names must be unique, got {sorted(names)!r}")
    check_database_urls(p.database_url_env for p in policies)
    with quiet_previews():
        component_defs = [tree.build_defs(),
                          *(policy_definitions(policy) for policy in extra_policies)]
    return dg.Definitions.merge(
        *component_defs,
        dg.Definitions(resources={"retention": deployed_retention(policies),
                                  **deployed_databases(policies)}),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The code location Dagster loads (``workspace.yaml``, ``pyproject.toml``)."""
    return code_location()
