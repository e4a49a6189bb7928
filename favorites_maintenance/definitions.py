"""The code location: every retention policy of ``favorites_maintenance/defs/``, and the
resources they share.

Each policy is one folder, ``defs/<policy>/defs.yaml``, of component type
``favorites_maintenance.RetentionPolicy`` (README, "Adding a retention policy"). Settings are
read and validated when this module is imported, i.e. when the code location loads: an invalid
``FAVORITES_*`` variable or policy field stops the load with a message naming it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import dagster as dg

from favorites_maintenance.policy import GUEST_POLICY, Policy, PolicyError
from favorites_maintenance.resources import (
    AlertSink,
    MetricsPush,
    deployed_database,
    deployed_retention,
)
from favorites_maintenance.retention_policy import (
    build_policy_defs,
    component_tree,
    load_policies,
)
from favorites_maintenance.settings import (
    ALERT_WEBHOOK_URL_VAR,
    METRICS_PUSHGATEWAY_URL_VAR,
    Settings,
    load_settings,
)


def build_resources(settings: Settings, policies: Sequence[Policy]) -> dict[str, object]:
    """The resources every policy shares: ``database``, ``retention`` (the run limits a launch
    may set), ``alerts`` and ``metrics`` (the Pushgateway each run pushes its gauges to).

    The database, webhook and Pushgateway URLs are passed as ``dg.EnvVar`` so they are read at
    run time and never shown in the UI; ``settings`` only proves them valid (an absent database
    URL fails the run, naming the variable). A run's config may set the run limits and nothing else (see
    :func:`~favorites_maintenance.resources.deployed_retention`).
    """
    return {
        # What the job deletes is the deployment's: run config may set only run limits.
        "database": deployed_database(),
        "retention": deployed_retention(policies),
        # The webhook URL holds a token: pass it by reference, only when it is set.
        "alerts": AlertSink(webhook_url=dg.EnvVar(ALERT_WEBHOOK_URL_VAR)
                            if settings.alert_webhook_url else None),
        # The gateway URL may hold a user and password: by reference too.
        "metrics": MetricsPush(gateway_url=dg.EnvVar(METRICS_PUSHGATEWAY_URL_VAR)
                               if settings.metrics_pushgateway_url else None),
    }


def build_defs(settings: Settings, policies: Sequence[Policy] | None = None) -> dg.Definitions:
    """The definitions of ``policies`` with the shared resources.

    Args:
        settings: the deployment's settings; when ``policies`` is ``None`` they are also the
            guest-favorites policy's, which is then the only policy (tests and the command
            line use this form).
        policies: the policies, names unique.

    Raises:
        PolicyError: two policies of one name.
    """
    if policies is None:
        policies = [dataclasses.replace(GUEST_POLICY, settings=settings.policy_settings())]
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyError(f"policy names must be unique, got {sorted(names)!r}")
    return dg.Definitions.merge(
        *(build_policy_defs(p) for p in policies),
        dg.Definitions(resources=build_resources(settings, policies)),
    )


def load_defs(settings: Settings | None = None,
              tree: dg.ComponentTree | None = None) -> dg.Definitions:
    """The code location's definitions: the components of ``tree`` (default: ``defs/``, one
    per policy) and the shared resources, for ``settings`` (default: the environment's).

    Raises:
        favorites_maintenance.retention_policy.PolicyLoadError: a malformed policy or setting,
            named.
    """
    settings = settings or load_settings()
    tree = tree or component_tree()
    with warnings.catch_warnings():
        # Components and code references are preview and beta in Dagster 1.13: said here
        # once, not at every load of the code location.
        warnings.simplefilter("ignore", dg.PreviewWarning)
        warnings.simplefilter("ignore", dg.BetaWarning)
        policies = load_policies(tree)
        component_defs = tree.build_defs()
    return dg.Definitions.merge(
        component_defs,
        dg.Definitions(resources=build_resources(settings, policies)),
    )


defs = load_defs()
