"""The ``favorites_maintenance.RetentionPolicy`` component: a retention policy declared as YAML.

One folder per policy, ``favorites_maintenance/defs/<policy>/defs.yaml``::

    type: favorites_maintenance.RetentionPolicy
    attributes:
      name: guest_carts                 # snake_case; every Dagster name derives from it
      table: carts.guest_carts          # schema.table
      key_column: cart_uuid             # unique key (bigint, uuid, text, ...)
      age_column: touched_at            # timestamptz
      null_columns: [customer_ref]      # the guard: rows with all of them NULL are guest rows
      retention_days: 30                # optional, like every field below
      cron: "{{ env.GUEST_CARTS_CLEANUP_CRON }}"

The component builds everything the policy runs (:func:`build_policy_defs`). Each optional field
defaults as the guest-favorites policy does; a value may come from the environment through the
component's templating (``"{{ env.X }}"``: an unset variable is the default, an empty one an
error naming the variable). Identifiers reach SQL only as SQLAlchemy ``Table``/``Column``
objects, never formatted into a statement.

Errors, at load (the code location does not load):

- a name that is not an identifier, an empty ``null_columns``, a value out of bounds:
  :class:`~favorites_maintenance.policy.PolicyError` or
  :class:`~favorites_maintenance.settings.SettingsError`, naming the policy, the field (or the
  variable it was read from) and the value;

and at the policy's first run, before anything is deleted: a missing table or column, an age
column that is not ``timestamptz``, a key that is not unique
(:class:`~favorites_maintenance.retention.table_check.TableShapeError`, naming the table and the
column).
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path

import dagster as dg
import yaml
from dagster.components.core.component_tree import ComponentTreeException
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from favorites_maintenance.assets import build_cleanup_asset
from favorites_maintenance.checks import build_asset_checks
from favorites_maintenance.jobs import build_job
from favorites_maintenance.policy import Policy, PolicyError
from favorites_maintenance.retention.rule import RetentionRule, RuleError
from favorites_maintenance.schedules import build_schedule
from favorites_maintenance.sensors import (
    build_failure_sensor,
    build_stale_sensor,
    build_tick_failure_sensor,
)
from favorites_maintenance.settings import GUEST_VARIABLES, SettingsError, parse_policy_settings

#: A whole field written as ``{{ env.NAME }}``: messages then name the variable.
_ENV_TEMPLATE = re.compile(r"^\s*\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}\s*$")

#: Text or a whole number: a templated value is text, a literal one may be either.
Value = int | str | None


class RetentionPolicy(dg.Component, dg.Resolvable, dg.Model):
    """A retention policy: delete rows of ``table`` whose ``null_columns`` are all NULL and
    whose ``age_column`` is older than ``retention_days``, in ``SKIP LOCKED`` batches, once a
    day on ``cron``.

    Attributes:
        name: snake_case, at most 40 characters; the asset is ``<schema>/<name>_cleanup``, the
            job ``<name>_cleanup_job``, the schedule ``<name>_cleanup_schedule``, the sensors
            ``<name>_cleanup_stale_sensor``, ``<name>_cleanup_failure_sensor`` and
            ``<name>_cleanup_tick_failure_sensor``, the concurrency pool ``<name>_cleanup``.
        table: ``schema.table``, lower-case identifiers.
        key_column: a unique, NOT NULL key; batches are ordered and matched by it.
        age_column: the ``timestamptz`` column compared with the cutoff.
        null_columns: the guard, one column at least; a row is deleted only while all of them
            are NULL (a delete without its guard is refused).
        retention_days: days (1 to 36,500; default 365).
        batch_size: rows of the first batch (1 to 100,000; default 1,000).
        cron: 5-field cron, UTC (default ``0 3 * * *``).
        max_run_duration: time budget of a run, ``HH:MM:SS`` or ISO 8601 (1 s to 50 min;
            default 10 min).
        stale_after: no successful run for this long alerts (1 s to 30 days; default 48 h).
        batch_size_max, target_batch_duration, max_replication_lag_bytes,
        max_wal_bytes_per_second, max_pause: how the purge shares the database (README,
            "Sharing the database"); defaults as the guest-favorites policy.
        metrics_prefix: snake_case start of the names of the gauges each run pushes to a
            Prometheus Pushgateway (README, "Metrics"); default ``<name>_cleanup``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="snake_case; every Dagster name of the policy derives from it")
    table: str = Field(description="schema.table")
    key_column: str = Field(description="unique, NOT NULL key column")
    age_column: str = Field(description="timestamptz column compared with the cutoff")
    null_columns: list[str] = Field(description="guard: columns that must all be NULL")
    retention_days: Value = Field(default=None, description="days, 1 to 36500 (default 365)")
    batch_size: Value = Field(default=None, description="rows of the first batch (default 1000)")
    cron: Value = Field(default=None, description="5-field cron, UTC (default 0 3 * * *)")
    max_run_duration: Value = Field(default=None, description="HH:MM:SS or ISO 8601 (PT10M)")
    stale_after: Value = Field(default=None, description="HH:MM:SS or ISO 8601 (PT48H)")
    batch_size_max: Value = None
    target_batch_duration: Value = None
    max_replication_lag_bytes: Value = None
    max_wal_bytes_per_second: Value = None
    max_pause: Value = None
    metrics_prefix: str | None = Field(default=None, description="start of the Prometheus "
                                       "gauges' names (default <name>_cleanup)")
    _variables: dict[str, str] = PrivateAttr(default_factory=dict)
    _source_text: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext
             ) -> "RetentionPolicy":
        """Resolve the YAML as Dagster does, remembering which field was read from which
        variable (``"{{ env.X }}"``), so a bad value is reported under the variable's name."""
        component = super().load(attributes, context)
        raw = attributes.model_dump() if attributes is not None else {}
        component._variables = {
            key: match.group(1) for key, value in raw.items()
            if key in GUEST_VARIABLES and isinstance(value, str)
            and (match := _ENV_TEMPLATE.match(value))}
        component._source_text = _settings_as_written(context.path, component.name)
        return component

    @cached_property
    def policy(self) -> Policy:
        """The validated :class:`~favorites_maintenance.policy.Policy`.

        Raises:
            PolicyError: a malformed name, table, column or guard, naming the policy.
            SettingsError: a setting out of bounds, naming the policy and the field (or its
                variable) and the value.
        """
        variables = self._variables
        try:
            rule = RetentionRule.define(self.table, key_column=self.key_column,
                                        age_column=self.age_column,
                                        null_columns=self.null_columns)
        except RuleError as exc:
            raise PolicyError(f"policy {self.name!r}: {exc}") from None
        labels = {key: variables.get(key, f"policy {self.name}, {key}")
                  for key in GUEST_VARIABLES}
        # A setting as written in the file, not as YAML 1.1 reads it (030 is 24 to YAML, yes
        # is 1): the same text a variable would hold, read by the same rules.
        values = {key: self._source_text.get(key, getattr(self, key)) if key not in variables
                  else getattr(self, key) for key in GUEST_VARIABLES}
        for key, value in values.items():
            if isinstance(value, bool):
                raise SettingsError(labels[key], f"{value!r} is a YAML boolean, not a value")
        settings = parse_policy_settings(values, labels)
        return Policy(self.name, rule, settings, labels={k: v for k, v in labels.items()
                                                         if k in variables},
                      metrics_prefix=self.metrics_prefix)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """The policy's asset, checks, job, schedule and sensors (no resources: the code
        location provides them, see :mod:`favorites_maintenance.definitions`)."""
        return build_policy_defs(self.policy)


def build_policy_defs(policy: Policy) -> dg.Definitions:
    """Everything Dagster runs for ``policy``, under its own names: the cleanup asset and its
    checks, the job, the schedule and the three sensors. The resources are the code
    location's (:func:`~favorites_maintenance.definitions.build_resources`)."""
    return dg.Definitions(
        assets=[build_cleanup_asset(policy)],
        asset_checks=build_asset_checks(policy),
        jobs=[build_job(policy)],
        schedules=[build_schedule(policy.settings.cron, policy)],
        sensors=[build_stale_sensor(policy.settings.stale_after, policy=policy),
                 build_failure_sensor(policy), build_tick_failure_sensor(policy)],
    )


class PolicyLoadError(Exception):
    """The policies of ``defs/`` could not be loaded: a YAML file that does not fit the
    component's schema (a misspelled or missing field), a malformed policy, a setting out of
    bounds, or two policies of one name. The message is the cause's, without Dagster's tree."""


def component_tree() -> dg.ComponentTree:
    """The component tree of ``favorites_maintenance/defs/``."""
    from favorites_maintenance import defs as defs_folder

    return dg.ComponentTree.from_module(defs_module=defs_folder,
                                        project_root=Path(__file__).resolve().parent.parent)


def load_policies(tree: dg.ComponentTree | None = None) -> list[Policy]:
    """Every policy of ``tree`` (default: ``defs/``), validated, names unique.

    Raises:
        PolicyLoadError: see the class; a :class:`~favorites_maintenance.policy.PolicyError` or
            :class:`~favorites_maintenance.settings.SettingsError` is its ``__cause__``.
    """
    try:
        components = (tree or component_tree()).get_all_components(RetentionPolicy)
        policies = [component.policy for component in components]
    except (PolicyError, SettingsError) as exc:
        raise PolicyLoadError(str(exc)) from exc
    except ComponentTreeException as exc:
        raise PolicyLoadError(_root_cause(exc)) from exc
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyLoadError(f"policy names must be unique, got {sorted(names)!r}")
    return policies


def _settings_as_written(path: Path, name: str) -> dict[str, str]:
    """The settings of policy ``name`` as their text in its YAML file (``path``: the file or
    its folder's ``defs.yaml``), read without YAML 1.1's type rules; empty when the file cannot
    be read (the values Dagster parsed are used then)."""
    file = path / "defs.yaml" if path.is_dir() else path
    try:
        documents = list(yaml.load_all(file.read_text(), Loader=yaml.BaseLoader))
    except (OSError, yaml.YAMLError):
        return {}
    for document in documents:
        attributes = document.get("attributes") if isinstance(document, dict) else None
        if isinstance(attributes, dict) and attributes.get("name") == name:
            # A YAML null (or nothing) leaves the setting to its default.
            return {key: value for key, value in attributes.items()
                    if key in GUEST_VARIABLES and isinstance(value, str)
                    and value not in ("", "~", "null", "Null", "NULL")}
    return {}


def _root_cause(exc: BaseException) -> str:
    """The innermost cause's message: pydantic's, naming the file, line and field."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc)
    return "\n".join(line for line in text.splitlines() if "errors.pydantic.dev" not in line)
