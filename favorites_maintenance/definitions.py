"""The code location: every retention policy of ``favorites_maintenance/defs/``, each with the
resources it uses, built the one way production, the tests and the command line use.

Each policy is one folder, ``defs/<policy>/defs.yaml``, of component type
``favorites_maintenance.RetentionPolicy`` (README, "Adding a retention policy"), whose
definitions are complete on their own, as in any project's defs folder (docs/adopting.md); the
component tree is built once. Settings are read and validated
when the code location loads: an invalid ``FAVORITES_*`` variable, policy field or database
URL stops the load with one line naming it (a policy's: the file, the line, the policy and the
field). A database variable that is unset does not: only the runs of the policies on it are
refused, naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
from dagster._core.errors import DagsterUserCodeProcessError
from dagster._utils.error import SerializableErrorInfo

from favorites_maintenance.components.policy_tree import (
    PolicyLoadError,
    component_tree,
    load_policies,
    policy_files,
    quiet_previews,
    root_cause,
)
from favorites_maintenance.components.retention_policy import RetentionPolicy
from favorites_maintenance.config.deployment import (
    check_database_urls,
    load_deployment_settings,
)
from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.heartbeat import build_dead_run_sensor
from favorites_maintenance.pipeline.policy_defs import policy_definitions
from favorites_maintenance.pipeline.sensors import one_sensor_per_name


def code_location(tree: dg.ComponentTree | None = None,
                  extra_policies: Sequence[Policy] = (), *,
                  only: str | None = None) -> dg.Definitions:
    """The definitions of the components of ``tree`` (default: ``defs/``), built once, and of
    ``extra_policies`` (policies built beside the tree's, in tests). Each policy's definitions
    carry the resources they use
    (:func:`~favorites_maintenance.pipeline.resources.policy_resources`); the location adds
    the sensor that ends a run whose steps stopped beating (:func:`_location_wide`).

    Args:
        tree: the component tree (default: ``defs/``).
        extra_policies: policies built beside the tree's.
        only: the name of one policy (of the tree or of ``extra_policies``): build that policy
            alone, whatever the other policy files hold (the command line's commands for one
            policy).

    Raises:
        favorites_maintenance.config.parsers.SettingsError: a deployment variable that is
            malformed, named (checked first, before any policy); then a policy's database
            variable set to a malformed URL, named.
        favorites_maintenance.components.policy_tree.PolicyLoadError: a malformed policy or
            setting, one line per broken file, or two policies of one name; with ``only``,
            that policy broken or not found.
    """
    load_deployment_settings()  # a bad URL is named here, not inside Dagster's tree error
    tree = tree or component_tree()
    if only is not None:
        return _one_policy(tree, extra_policies, only)
    try:
        with quiet_previews():
            defs = one_sensor_per_name(dg.Definitions.merge(
                tree.build_defs(), *(policy_definitions(policy) for policy in extra_policies)))
            policies = [*(c.policy for c in tree.get_all_components(RetentionPolicy)),
                        *extra_policies]
    except Exception as exc:  # Dagster's tree error, around any component's
        cause = root_cause(exc)
        if isinstance(cause, SettingsError):
            raise cause from None
        load_policies(tree)  # one line per broken file, each loaded on its own
        raise PolicyLoadError(f"{type(cause).__name__}: {cause}") from exc
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyLoadError(f"policy names must be unique, got {sorted(names)!r}")
    check_database_urls(p.database_url_env for p in policies)
    return dg.Definitions.merge(defs, _location_wide())


def _location_wide() -> dg.Definitions:
    """What this code location adds beside its policies: the sensor that ends a run whose steps
    stopped beating (:func:`~favorites_maintenance.pipeline.heartbeat.build_dead_run_sensor`)."""
    return dg.Definitions(
        sensors=[build_dead_run_sensor(load_deployment_settings().run_heartbeat_timeout)])


def _one_policy(tree: dg.ComponentTree, extra_policies: Sequence[Policy],
                name: str) -> dg.Definitions:
    """Policy ``name`` of ``tree`` (built from its own file's tree) or of ``extra_policies``,
    with the resources it uses."""
    files = policy_files(tree)
    extra = [p for p in extra_policies if p.name == name]
    with quiet_previews():
        if extra:
            [policy] = extra
            own = policy_definitions(policy)
        else:
            found = [(f, p) for f in files for p in f.policies if p.name == name]
            if not found:
                broken = [f.error for f in files if f.error]
                valid = sorted([p.name for f in files for p in f.policies]
                               + [p.name for p in extra_policies])
                raise PolicyLoadError(f"no valid policy named {name!r}; the valid ones are "
                                      f"{', '.join(valid) or 'none'}"
                                      + "".join(f"\n{e}" for e in broken))
            [(file, policy)] = found
            own = file.tree.build_defs()
    check_database_urls([policy.database_url_env])
    return dg.Definitions.merge(own, _location_wide())


def load_error(exc: PolicyLoadError | SettingsError) -> DagsterUserCodeProcessError:
    """``exc`` as the code location's load error, shown without a stack trace.

    Dagster shows a load error with the stack of the exception it caught (the UI's code
    location page, ``dg check defs``, ``dagster dev``). A policy's or a setting's error is the
    configuration's, not the code's: Dagster reports an error it received from a code process
    as that process serialized it, so it is handed over that way, its message alone.
    """
    info = SerializableErrorInfo(message=f"{type(exc).__name__}: {exc}\n", stack=[],
                                 cls_name=type(exc).__name__)
    return DagsterUserCodeProcessError(str(exc), user_code_process_error_infos=[info])


def location_definitions(tree: dg.ComponentTree | None = None,
                         extra_policies: Sequence[Policy] = ()) -> dg.Definitions:
    """:func:`code_location` as Dagster loads it: an invalid setting or policy raised as
    :func:`load_error`, its message alone.

    Raises:
        dagster._core.errors.DagsterUserCodeProcessError: see :func:`load_error`.
    """
    try:
        return code_location(tree, extra_policies)
    except (PolicyLoadError, SettingsError) as exc:
        raise load_error(exc) from exc


@dg.definitions
def defs() -> dg.Definitions:
    """The code location Dagster loads (``workspace.yaml``, ``pyproject.toml``); see
    :func:`location_definitions`."""
    return location_definitions()
