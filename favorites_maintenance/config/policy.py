"""A retention policy: a rule, its settings, and the names of everything run for it.

A policy is declared as data (``favorites_maintenance/defs/<policy>/defs.yaml``, loaded by the
:class:`~favorites_maintenance.components.retention_policy.RetentionPolicy` component) and
becomes one
:class:`Policy`. Every Dagster name of the policy is derived from its ``name``, so a second
policy never collides with the first:

================================  ============================================
asset                             ``<schema>/<name>_cleanup``
job                               ``<name>_cleanup_job``
schedule                          ``<name>_cleanup_schedule``
concurrency pool                  ``<name>_cleanup``
Prometheus metric names           ``<metrics_prefix>_*`` (default ``<name>_cleanup_*``)
restore job (with an archive)     ``restore_<name>_job``
================================  ============================================

The freshness check and the metadata keys of its rows follow its ``row_noun`` and its age
column (:mod:`~favorites_maintenance.config.names`).

Three sensors serve every policy of a code location and name the policy in each alert
(``favorites_maintenance_stale_sensor``, ``favorites_maintenance_failure_sensor``,
``favorites_maintenance_tick_failure_sensor``).

A policy's database is named by the environment variable holding its URL
(``database_url_env``, default ``FAVORITES_DATABASE_URL``); the names derived from that
variable are shared by every policy on it:

================================  ============================================
resource                          ``database`` (``FAVORITES_DATABASE_URL``), else
                                  ``database_<variable in lower case>``
concurrency pool                  ``database_<variable in lower case>``
asset group (unless ``group``)    ``<variable in lower case, without _database_url>``
run tag                           ``favorites_maintenance/database: <variable>``
================================  ============================================

This module imports no Dagster: the command line uses it too.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from favorites_maintenance.config.names import PolicyNames
from favorites_maintenance.config.policy_settings import PolicySettings
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.retention.holds import HoldTable
from favorites_maintenance.retention.rule import RetentionRule, RuleError, split_table_name

#: A policy name: snake_case, short enough that every derived name stays a valid Dagster name.
_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_MAX_NAME = 40
#: The variable of a policy's database: upper case, short enough for a run tag's value.
_VARIABLE = re.compile(r"[A-Z][A-Z0-9_]*")
_MAX_VARIABLE = 63
#: Text that may be echoed in an error: a name, which cannot be a URL.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: The run tag each run of a policy's job carries, its value the variable of the policy's
#: database: ``dagster.yaml`` limits the runs in progress per value of it.
DATABASE_TAG = "favorites_maintenance/database"


#: The start of every resource key of the package: a policy's definitions are merged into a
#: host's code location beside resources of its own, which may be named anything else.
RESOURCE_PREFIX = "favorites_maintenance_"
#: The alert sink and the metrics push, one each for every policy of a code location.
ALERTS_KEY = f"{RESOURCE_PREFIX}alerts"
METRICS_KEY = f"{RESOURCE_PREFIX}metrics"


def database_resource_key(variable: str) -> str:
    """The resource serving the database of ``variable``: ``favorites_maintenance_<variable in
    lower case>`` (``favorites_maintenance_favorites_database_url``), shared by the policies
    naming it."""
    return f"{RESOURCE_PREFIX}{variable.lower()}"


def run_limits_key(policy_name: str) -> str:
    """The resource holding the run limits a launch sets for a run of policy ``policy_name``:
    ``favorites_maintenance_<policy>_run_limits``."""
    return f"{RESOURCE_PREFIX}{policy_name}_run_limits"


def database_pool(variable: str) -> str:
    """The concurrency pool of the database of ``variable``: ``database_<variable in lower
    case>``; every run of a policy on it holds a slot (limit 1: one run per database)."""
    return f"database_{variable.lower()}"


def database_group(variable: str) -> str:
    """The asset group of the policies on the database of ``variable`` that set no ``group``:
    the variable in lower case without its ``_database_url`` suffix (``CARTS_DATABASE_URL``:
    ``carts``; ``FAVORITES_DATABASE_URL``: ``favorites``), a valid Dagster group name."""
    return variable.lower().removesuffix("_database_url")


def named_field(default: str | None, description: str, *, as_written: bool = False) -> Any:
    """A :class:`Policy` field that is not a setting (a name the policy file writes), declared
    with what it means: the component's schema takes its description from here.
    ``as_written``: the component takes the value as written, never rendering a template (a
    variable's name, whose value may be a URL)."""
    return field(default=default, metadata={"description": description,
                                            "as_written": as_written})


class PolicyError(ValueError):
    """A policy is malformed. The message names the policy, the field and the value at fault.

    Attributes:
        field: the field at fault, when the message alone does not start with it.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Policy:
    """One retention policy.

    Attributes:
        name: snake_case name, at most 40 characters; every Dagster name derives from it.
        rule: the table and the predicate (see :class:`~favorites_maintenance.retention.rule.
            RetentionRule`); its comparison with the cutoff is the one ``settings``'
            ``cutoff_inclusive`` says, whatever rule was given.
        settings: retention days, batch size, schedule and limits.
        labels: field of
            :class:`~favorites_maintenance.config.policy_settings.PolicySettings` -> what
            messages call it (the variable it was read from, or ``policy P, field F``).
        metrics_prefix, database_url_env, archive_table: the policy's fields that are not
            settings, each described by its declaration below (:data:`NAMED_FIELDS`), which
            the component's schema shows as written.

    Raises:
        PolicyError: ``name`` is not snake_case or is too long; ``metrics_prefix`` is not
            snake_case; ``database_url_env`` is not an upper-case variable name (its value is
            shown only when it is a name: it may hold a URL); ``archive_table`` is not
            ``schema.table`` of identifiers, or is the policy's table;
            ``archive_retention_days`` is set without an ``archive_table``;
            ``max_parallel_partitions`` or ``drop_expired_partitions`` is set with an
            ``archive_table``; ``detached_retention`` is set without
            ``drop_expired_partitions``; ``hold_column`` is set without a ``hold_table``, or
            ``hold_table`` is the policy's own table.

    A policy with a ``hold_table`` setting gets a rule whose predicate skips held rows
    (:meth:`~favorites_maintenance.retention.rule.RetentionRule.with_hold`, docs/holds.md).
    """

    name: str
    rule: RetentionRule
    settings: PolicySettings = field(default_factory=PolicySettings)
    labels: dict[str, str] = field(default_factory=dict, compare=False)
    metrics_prefix: str | None = named_field(
        None, "start of the Prometheus gauges' names (default <name>_cleanup)")
    database_url_env: str = named_field(
        DATABASE_URL_VAR, "the environment variable holding the SQLAlchemy URL of the policy's "
        "database, by name (default FAVORITES_DATABASE_URL)", as_written=True)
    archive_table: str | None = named_field(
        None, "optional schema.table the purge moves deleted rows into (same database), kept "
        "archive_retention_days; unset: rows are deleted, no archive")

    def __post_init__(self):
        if self.rule.cutoff_inclusive != self.settings.cutoff_inclusive:
            # The setting is where a policy says it; every statement takes it from the rule.
            object.__setattr__(self, "rule", dataclasses.replace(
                self.rule, cutoff_inclusive=self.settings.cutoff_inclusive))
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name) \
                or len(self.name) > _MAX_NAME:
            raise PolicyError(f"policy {self.name!r}: name must be snake_case (a-z, 0-9, single "
                              f"underscores, a letter first), at most {_MAX_NAME} characters")
        if self.metrics_prefix is None:
            object.__setattr__(self, "metrics_prefix", self.cleanup)
        elif not isinstance(self.metrics_prefix, str) or not _NAME.fullmatch(self.metrics_prefix):
            # Snake case is a valid Prometheus metric name and the convention for one.
            raise PolicyError(f"policy {self.name!r}: metrics_prefix {self.metrics_prefix!r} "
                              "must be snake_case (a-z, 0-9, single underscores, a letter first)")
        variable = self.database_url_env
        if not isinstance(variable, str) or not _VARIABLE.fullmatch(variable) \
                or len(variable) > _MAX_VARIABLE:
            shown = (f"{variable!r}" if isinstance(variable, str)
                     and _IDENTIFIER.fullmatch(variable) else "the value (not shown)")
            raise PolicyError(f"policy {self.name!r}: database_url_env names the environment "
                              "variable that holds the database's URL, never the URL itself: "
                              f"A-Z, 0-9 and underscores, a letter first, at most "
                              f"{_MAX_VARIABLE} characters (e.g. CARTS_DATABASE_URL); got "
                              f"{shown}")
        if self.archive_table is not None and self.settings.drop_expired_partitions:
            raise PolicyError(
                f"policy {self.name!r}: archive_table and "
                f"{self.label('drop_expired_partitions')} cannot be set together: a dropped "
                "partition's rows would never reach the archive. Keep one of them")
        if self.settings.hold_column is not None and self.settings.hold_table is None:
            raise PolicyError(
                f"policy {self.name!r}: {self.label('hold_column')} is set, but the policy has "
                "no hold_table: there are no holds to match. Remove it, or name the hold table "
                "(hold_table: schema.table)", field="hold_column")
        holds = None
        if self.settings.hold_table is not None:
            holds = HoldTable.define(self.settings.hold_table,
                                     self.settings.hold_column or self.rule.key.name, self.name)
            if holds.qualified_name == self.rule.qualified_name:
                raise PolicyError(f"policy {self.name!r}: hold_table {holds.qualified_name} is "
                                  "the policy's own table; name another table",
                                  field="hold_table")
        if holds != self.rule.hold:
            try:
                object.__setattr__(self, "rule", self.rule.with_hold(holds))
            except RuleError as exc:
                raise PolicyError(f"policy {self.name!r}: {exc}", field="hold_column") from None
        if ("detached_retention" in self.settings.explicit
                and not self.settings.drop_expired_partitions):
            raise PolicyError(
                f"policy {self.name!r}: {self.label('detached_retention')} is set, but "
                f"{self.label('drop_expired_partitions')} is not true: no partition is "
                "detached, so there is no detached table to keep. Remove it, or set "
                "drop_expired_partitions: true", field="detached_retention")
        if self.archive_table is not None:
            try:
                split_table_name(self.archive_table, "archive_table")
            except RuleError as exc:
                raise PolicyError(f"policy {self.name!r}: {exc}") from None
            if self.archive_table == self.rule.qualified_name:
                raise PolicyError(f"policy {self.name!r}: archive_table {self.archive_table} "
                                  "is the policy's own table; name another table")
            if self.purges_partitions:
                # Each partition step would prune the one archive after its own purge.
                raise PolicyError(
                    f"policy {self.name!r}: {self.label('max_parallel_partitions')} and "
                    "archive_table cannot be set together: a policy with an archive purges "
                    "its table in one step. Remove one of them", field="max_parallel_partitions")
        elif "archive_retention_days" in self.settings.explicit:
            raise PolicyError(
                f"policy {self.name!r}: {self.label('archive_retention_days')} is set, but the "
                "policy has no archive_table: there is no archive to keep rows in. Remove it, "
                "or name the archive (archive_table: schema.table)")

    @property
    def purges_partitions(self) -> bool:
        """Whether the policy's table is purged one partition per step: its
        ``max_parallel_partitions`` is set (in the YAML, or by its variable; unset by
        default). The policy declares the shape, so the definitions load without reaching the
        database; the first run refuses a table that is not range-partitioned by the age
        column."""
        return self.settings.max_parallel_partitions is not None

    def label(self, setting: str) -> str:
        """What a message calls ``setting``: its variable, or ``policy <name>, <setting>``."""
        return self.labels.get(setting) or f"policy {self.name}, {setting}"

    @property
    def names(self) -> PolicyNames:
        """The names of the policy's rows: its freshness check, the metadata keys of its rows
        and the noun of its messages (:mod:`~favorites_maintenance.config.names`)."""
        return PolicyNames(self.settings.row_noun, self.rule.age.name)

    @property
    def cleanup(self) -> str:
        """``<name>_cleanup``: the asset's name and the concurrency pool."""
        return f"{self.name}_cleanup"

    @property
    def asset_key_path(self) -> tuple[str, str]:
        """The asset key's path: the table's schema, then ``<name>_cleanup``."""
        return (self.rule.table.schema, self.cleanup)

    @property
    def pool(self) -> str:
        """Concurrency pool of the purge: one run of the policy at a time."""
        return self.cleanup

    @property
    def database_key(self) -> str:
        """The resource serving the policy's database (see :func:`database_resource_key`)."""
        return database_resource_key(self.database_url_env)

    @property
    def run_limits_key(self) -> str:
        """The resource of the run limits of the policy's runs (see :func:`run_limits_key`)."""
        return run_limits_key(self.name)

    @property
    def database_pool(self) -> str:
        """Concurrency pool of the policy's database (see :func:`database_pool`)."""
        return database_pool(self.database_url_env)

    @property
    def group(self) -> str:
        """The cleanup asset's group: the ``group`` setting, else its database's
        (:func:`database_group`)."""
        return self.settings.group or database_group(self.database_url_env)

    @property
    def pools(self) -> tuple[str, str]:
        """Every pool a run of the policy holds: its own, then its database's."""
        return (self.pool, self.database_pool)

    @property
    def job_name(self) -> str:
        return f"{self.cleanup}_job"

    @property
    def restore_job_name(self) -> str:
        """``restore_<name>_job``: moves archived rows back (only with an ``archive_table``)."""
        return f"restore_{self.name}_job"

    @property
    def schedule_name(self) -> str:
        return f"{self.cleanup}_schedule"


#: The fields of a :class:`Policy` that are not settings, each a policy file's optional
#: attribute: name -> its declaration's metadata (``description``, ``as_written``).
NAMED_FIELDS: dict[str, dict[str, Any]] = {
    f.name: dict(f.metadata) for f in dataclasses.fields(Policy) if "description" in f.metadata}
