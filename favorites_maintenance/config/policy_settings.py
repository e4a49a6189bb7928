"""The settings of a retention policy: one declarative table.

Each field of :class:`PolicySettings` is declared once, with :func:`setting`: its default, its
parser (which holds its bounds), what it means, and whether a launch may set it for one run.
Everything else derives from that declaration:

- the :class:`~favorites_maintenance.components.retention_policy.RetentionPolicy` component's
  optional YAML fields, their types and descriptions (what ``dg`` shows);
- the bounds checks (:func:`parse_policy_settings`, the only place a value is validated);
- the run limits a launch may set (:data:`LAUNCH_LIMITS`, served by each policy's
  ``favorites_maintenance_<policy>_run_limits`` resource);
- the configuration table of the README (:func:`markdown_table`; a test keeps them equal).

Adding a policy setting is one :func:`setting` field here plus its use; a setting of the purge
is used as a field of :class:`~favorites_maintenance.retention.batch_loop.PurgeOptions`,
which :meth:`PolicySettings.purge_options` fills.

This module imports no Dagster.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from favorites_maintenance.config.names import DEFAULT_ROW_NOUN, parse_row_noun
from favorites_maintenance.config.parsers import (
    SettingsError,
    date_between,
    duration_between,
    duration_up_to,
    int_between,
    iso_duration,
    number_between,
    read_optional,
    validate_cron,
)
from favorites_maintenance.retention.batch_loop import PurgeOptions
from favorites_maintenance.retention.defaults import (
    DEFAULT_MAX_PAUSE,
    DEFAULT_MAX_REPLICATION_LAG_BYTES,
)
from favorites_maintenance.retention.health import HealthLimits

# Upper bounds keep every value inside what the arithmetic and the database can hold, and inside
# what is sensible: a batch is one transaction holding row locks; a run is one daily tick.
MAX_RETENTION_DAYS = 36_500  # 100 years
MAX_BATCH_SIZE = 100_000
MIN_DURATION = dt.timedelta(seconds=1)
# Below the 1 h hard ceiling of run monitoring in dagster.yaml (max_runtime_seconds: 3600), which
# would otherwise end a long purge as FAILURE instead of letting it stop on its own budget.
MAX_RUN_DURATION_LIMIT = dt.timedelta(minutes=50)
MAX_STALE_AFTER = dt.timedelta(days=30)
# A batch aiming at more than this would sit near the batch's statement timeout (30 s).
MAX_TARGET_BATCH_DURATION = dt.timedelta(seconds=10)
MAX_LAG_BYTES = 2**40  # 1 TiB
# Pausing 100 times each batch's time is 1% of the database's time: gentler is a smaller batch.
MAX_SLEEP_RATIO = 100

DEFAULT_RETENTION_DAYS = 365
DEFAULT_BATCH_SIZE = 1000
DEFAULT_CRON = "0 3 * * *"
DEFAULT_MAX_RUN_DURATION = dt.timedelta(minutes=10)
DEFAULT_STALE_AFTER = dt.timedelta(hours=48)
#: The largest batch the adaptive batch size may reach when neither batch_size nor
#: batch_size_max is set (never below the first batch's size), and the same in keyset order,
#: whose 10,000-row batches take milliseconds: there the target bounds a batch.
DEFAULT_BATCH_SIZE_MAX, DEFAULT_KEYSET_BATCH_SIZE_MAX = 10_000, MAX_BATCH_SIZE
#: Wall time one batch transaction aims at; 0 turns adaptation off (every batch the first size).
DEFAULT_TARGET_BATCH_DURATION = dt.timedelta(milliseconds=200)
#: How long an archived row stays in a policy's archive (the undo window), days.
DEFAULT_ARCHIVE_RETENTION_DAYS = 30
#: More purges at once than this would hold as many connections and WAL streams as a busy
#: application; the executor's processes (or a distributed executor's workers) are the limit.
MAX_PARALLEL_PARTITIONS = 64
#: How long a partition the job detached is kept, as a table of its own, before a later run
#: drops it (the window in which it can be attached again).
DEFAULT_DETACHED_RETENTION = dt.timedelta(days=7)
MAX_DETACHED_RETENTION = dt.timedelta(days=3650)
EARLIEST_PARTITIONS_START = dt.date(2000, 1, 1)
LATEST_PARTITIONS_START = dt.date(2099, 12, 31)


@dataclass(frozen=True)
class Setting:
    """The declaration of one policy setting (the metadata of a :class:`PolicySettings` field).

    Attributes:
        parse: text -> typed value; raises ``ValueError`` naming the value (the bounds live
            here).
        yaml_type: what a literal YAML value of the setting may be, for the component's schema
            (``int``; ``str``; a duration is text, or the number YAML 1.1 reads ``48:00:00``
            as, whose text is then taken as written).
        description: one line for the component's schema and the README.
        bounds: the accepted values, as the README writes them.
        launch: the run-config key under ``resources.<run limits key>.config`` (:func:`~favorites_maintenance.config.policy.run_limits_key`) through which a
            launch may set it for one run, or ``None``.
        launch_unit: how the launch key's number maps onto the setting (``"seconds"`` for a
            duration given in seconds, ``None`` for the value itself).
        launch_bounds: (low, high) a launch's value must lie in, in the launch key's unit.
    """

    parse: Callable[[str], Any]
    yaml_type: Any
    description: str
    bounds: str
    launch: str | None = None
    launch_unit: str | None = None
    launch_bounds: tuple[float, float] | None = None
    null_is_value: bool = False
    """A YAML ``null`` written for the setting is a value of its own (given to ``parse`` as
    the text ``null``), not "unset"."""
    default_text: str | None = None
    """The default as the README says it, when its value alone would not say it (one that
    follows the calendar, or is derived from another field)."""


def default_partitions_start(today: dt.date | None = None) -> dt.date:
    """The first daily partition of a policy that sets none: the first day of the month before
    ``today``'s (default: the current UTC date), so a deployment lists 28 to 62 days to run,
    whenever it is installed, never a year of days no run was meant for. A policy sets its own
    to the day it went into service (``dg scaffold`` writes the day before the one the policy
    was written, whose partition its first run launches)."""
    today = today or dt.datetime.now(dt.timezone.utc).date()
    return (today.replace(day=1) - dt.timedelta(days=1)).replace(day=1)


def setting(default: Any, parse: Callable[[str], Any], yaml_type: Any, description: str,
            bounds: str, **launch: Any) -> Any:
    """A :class:`PolicySettings` field declared by its :class:`Setting` (see the class)."""
    metadata = {"setting": Setting(parse, yaml_type, description, bounds, **launch)}
    if callable(default):  # a default that follows the calendar, computed when read
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


class BatchSizeMode(enum.StrEnum):
    """How a run sizes its batches (the run's ``batchSizeMode`` metadata).

    - ``fixed``: no batch has more than ``batch_size`` rows; the size may shrink below it (a
      slow batch, sessions waiting on its locks), never grow past it. ``batch_size`` set and
      ``batch_size_max`` not, a launch's ``batch_size``, or ``target_batch_duration`` zero
      (then every batch has ``batch_size`` rows).
    - ``capped``: ``batch_size_max`` set: the size adapts between ``batch_size`` and it.
    - ``adaptive``: neither set: the size adapts from the default first size toward the
      default max (1,000 to 10,000 rows; in keyset order to 100,000).
    """

    FIXED = "fixed"
    CAPPED = "capped"
    ADAPTIVE = "adaptive"


_DURATION_FORMS = "ISO 8601 (PT10M) or HH:MM:SS"
#: A literal number of the YAML: an integer or a float.
_NUMBER_YAML = int | float | str
#: Unquoted, YAML 1.1 reads ``48:00:00`` as the number 172800: accepted, then read as written.
_DURATION_YAML = str | int | float


def parse_bool(raw: str) -> bool:
    """``true`` or ``false`` (any case), as YAML writes them."""
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{raw!r} is not true or false")
    return value == "true"


def _detached_retention(raw: str) -> dt.timedelta | None:
    """A duration from ``PT0S`` (drop on the next run) to the maximum, or ``null``: kept for
    good."""
    if raw.strip() in ("null", "~", "None"):
        return None
    if raw.lstrip().startswith("-"):
        # PT0S does not turn it off here: it drops a detached table on the next run.
        raise ValueError(f"{raw!r} must not be negative (PT0S drops a detached table on the "
                         "next run, null keeps it for good)")
    value = duration_up_to(dt.timedelta.max, low=dt.timedelta(0))(raw)
    if value > MAX_DETACHED_RETENTION:
        raise ValueError(f"{raw!r} must be at most P{MAX_DETACHED_RETENTION.days}D")
    return value


def _hold_table(raw: str) -> str:
    """``schema.table`` of lower-case identifiers."""
    from favorites_maintenance.retention.rule import RuleError, split_table_name

    try:
        split_table_name(raw.strip(), "hold_table")
    except RuleError as exc:
        raise ValueError(str(exc)) from None
    return raw.strip()


def _hold_column(raw: str) -> str:
    """A lower-case SQL identifier."""
    if not re.fullmatch(r"[a-z_][a-z0-9_$]{0,62}", raw.strip()) or raw.strip() == "ctid":
        raise ValueError(f"{raw!r} is not a lower-case SQL identifier (letters, digits, _; at "
                         "most 63 characters)")
    return raw.strip()


#: Dagster's rules for the asset's catalog fields (owners, tags, kinds, group), checked here
#: so that a bad value stops the load naming the policy and the field, not Dagster's asset.
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Z|a-z]{2,7}\b")
_TAG_PART = r"[A-Za-z0-9_.-]{1,63}"
_TAG_KEY = re.compile(rf"(?:{_TAG_PART}/)?{_TAG_PART}")
_TAG_VALUE = re.compile(r"[A-Za-z0-9_.-]{0,63}")
_GROUP = re.compile(r"[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)*")
#: Dagster refuses an asset with more kinds than this.
MAX_KINDS = 10
DEFAULT_KINDS = ("postgres",)


def _yaml_value(raw: str, shape: type) -> Any:
    """``raw`` read as YAML (a list or a mapping in flow style, or JSON, which the component
    writes for a block-style one); every scalar read as its text."""
    import yaml

    try:
        value = yaml.load(raw, Loader=yaml.BaseLoader)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, shape):
        raise ValueError(f"{raw!r} is not a YAML {'list' if shape is list else 'mapping'}")
    return value


def _text_list(raw: str) -> list[str]:
    """A YAML list (``[a, b]``), or comma-separated text (``a, b``: what a variable holds)."""
    if raw.lstrip().startswith("["):
        items = _yaml_value(raw, list)
    else:
        items = raw.split(",")
    if any(not isinstance(item, str) for item in items):
        raise ValueError(f"{raw!r} must be a list of text values")
    return [item.strip() for item in items]


def _owners(raw: str) -> tuple[str, ...]:
    """Owners as Dagster takes them: each an email address or ``team:<name>``, repeats
    dropped."""
    owners = _text_list(raw)
    for owner in owners:
        is_team = owner.startswith("team:") and len(owner) > len("team:")
        if not (is_team or _EMAIL.fullmatch(owner)):
            raise ValueError(f"owner {json.dumps(owner)} is neither an email address nor a "
                             "team (team:<name>); write e.g. [team:data-platform, "
                             "someone@example.com]")
    return tuple(dict.fromkeys(owners))


def _kinds(raw: str) -> tuple[str, ...]:
    """Kinds as Dagster takes them: each 1 to 63 of A-Z a-z 0-9 _ . -, at most ten."""
    kinds = [k for k in _text_list(raw) if k]
    for kind in kinds:
        if not re.fullmatch(_TAG_PART, kind):
            raise ValueError(f"kind {json.dumps(kind)} must be 1 to 63 of A-Z, a-z, 0-9, _, ., "
                             "-")
    kinds = list(dict.fromkeys(kinds))
    if len(kinds) > MAX_KINDS:
        raise ValueError(f"{len(kinds)} kinds: an asset has at most {MAX_KINDS}")
    return tuple(kinds)


def _tags(raw: str) -> tuple[tuple[str, str], ...]:
    """Asset tags as Dagster's strict rules take them: a mapping of key to text; a key is
    ``[prefix/]name``, each part 1 to 63 of A-Z a-z 0-9 _ . -, not under ``dagster/``; a
    value 0 to 63 of the same."""
    tags = _yaml_value(raw, dict)
    for key, value in tags.items():
        if isinstance(key, str) and key.startswith("dagster/"):
            raise ValueError(f"tag key {json.dumps(key)} is under dagster/, which Dagster "
                             "keeps for itself (a kind is written in kinds)")
        if not isinstance(key, str) or not _TAG_KEY.fullmatch(key):
            raise ValueError(f"tag key {json.dumps(key)} must be [prefix/]name, each part 1 to "
                             "63 of A-Z, a-z, 0-9, _, ., -")
        if not isinstance(value, str) or not _TAG_VALUE.fullmatch(value):
            raise ValueError(f"the value of tag {key} ({json.dumps(value)}) must be text of at "
                             "most 63 of A-Z, a-z, 0-9, _, ., - (quote a number)")
    return tuple(tags.items())


def _group(raw: str) -> str:
    """An asset group name as Dagster takes it: A-Z a-z 0-9 _, segments joined by ``/``."""
    if not _GROUP.fullmatch(raw.strip()):
        raise ValueError(f"{raw!r} is not a group name: A-Z, a-z, 0-9 and _, segments "
                         "separated by / (e.g. billing or billing/sessions)")
    return raw.strip()


@dataclass(frozen=True)
class PolicySettings:
    """The validated settings of one retention policy; every field has a default.

    Read a policy's settings with :func:`parse_policy_settings`; the declarations below are
    the only list of them (see the module docstring). Durations are :class:`datetime.timedelta`,
    sizes rows, lags bytes.

    ``explicit`` (not a setting) names the settings that were set rather than defaulted: a
    literal in the policy's YAML, its variable set (and not empty), or a launch's run limit.
    An explicit ``batch_size`` is the bound of every batch unless ``batch_size_max`` is set
    too (:attr:`batch_size_mode`); ``batch_size_max`` always holds the largest size a batch of
    the run may have, rows.
    """

    retention_days: int = setting(
        DEFAULT_RETENTION_DAYS, int_between(1, MAX_RETENTION_DAYS), int,
        "retention period in days: a row whose age column is further past than this is "
        "prunable",
        f"1 to {MAX_RETENTION_DAYS:,}")
    cutoff_inclusive: bool = setting(
        False, parse_bool, bool,
        "true: a row whose age column is exactly at the cutoff is prunable too (age <= cutoff, "
        "as Laravel's expires_at <= now() - 30 days); false: only rows strictly older "
        "(age < cutoff)",
        "true or false")
    batch_size: int = setting(
        DEFAULT_BATCH_SIZE, int_between(1, MAX_BATCH_SIZE), int,
        "rows per batch transaction: set, no batch has more (a batch may shrink under load); "
        "unset, the first batch's size when no earlier run's time per row is known, which "
        "then adapts",
        f"1 to {MAX_BATCH_SIZE:,}",
        launch="batch_size", launch_bounds=(1, MAX_BATCH_SIZE))
    cron: str = setting(
        DEFAULT_CRON, validate_cron, str,
        "when the schedule runs: a 5-field cron expression, evaluated in UTC",
        "a valid 5-field cron that fires")
    max_run_duration: dt.timedelta = setting(
        DEFAULT_MAX_RUN_DURATION,
        duration_between(MIN_DURATION, MAX_RUN_DURATION_LIMIT), _DURATION_YAML,
        "time budget of one purge; past it the run ends successfully with a backlog",
        f"{iso_duration(MIN_DURATION)} to {iso_duration(MAX_RUN_DURATION_LIMIT)}, "
        + _DURATION_FORMS,
        launch="max_run_duration_seconds", launch_unit="seconds",
        launch_bounds=(MIN_DURATION.total_seconds(), MAX_RUN_DURATION_LIMIT.total_seconds()))
    stale_after: dt.timedelta = setting(
        DEFAULT_STALE_AFTER, duration_between(MIN_DURATION, MAX_STALE_AFTER), _DURATION_YAML,
        "no successful run for this long raises the staleness alert; the freshness policy "
        "fails after it",
        f"{iso_duration(MIN_DURATION)} to {iso_duration(MAX_STALE_AFTER)}, " + _DURATION_FORMS)
    partitions_start: dt.date = setting(
        default_partitions_start,
        date_between(EARLIEST_PARTITIONS_START, LATEST_PARTITIONS_START), str | dt.date,
        "the first daily partition of the cleanup asset (UTC), e.g. the day the policy went "
        "into service: the days the UI offers to run and backfill start there",
        f"a date YYYY-MM-DD, {EARLIEST_PARTITIONS_START.isoformat()} to "
        f"{LATEST_PARTITIONS_START.isoformat()}",
        default_text="the first day of the previous month (UTC)")
    batch_size_max: int = setting(
        None, int_between(1, MAX_BATCH_SIZE), int,
        "set, the batch size adapts between batch_size and it (unset: batch_size when that is "
        "set, else 10,000, in keyset order 100,000: there the target bounds a batch)",
        f"batch_size to {MAX_BATCH_SIZE:,}")
    target_batch_duration: dt.timedelta = setting(
        DEFAULT_TARGET_BATCH_DURATION, duration_up_to(MAX_TARGET_BATCH_DURATION), _DURATION_YAML,
        "wall time a batch transaction aims at; PT0S keeps every batch at batch_size",
        f"PT0S, or PT0.01S to {iso_duration(MAX_TARGET_BATCH_DURATION)}")
    max_replication_lag_bytes: int = setting(
        DEFAULT_MAX_REPLICATION_LAG_BYTES, int_between(1, MAX_LAG_BYTES), int,
        "replication lag (bytes of WAL) of a standby or slot above which the purge pauses",
        f"1 to {MAX_LAG_BYTES:,}")
    max_wal_bytes_per_second: int | None = setting(
        None, int_between(1, MAX_LAG_BYTES), int,
        "WAL written per second by the whole server above which the purge pauses (unset: "
        "not watched)",
        f"1 to {MAX_LAG_BYTES:,}")
    max_pause: dt.timedelta = setting(
        DEFAULT_MAX_PAUSE, duration_between(MIN_DURATION, MAX_RUN_DURATION_LIMIT), _DURATION_YAML,
        "how long the purge may stay paused on an unhealthy database before the run ends "
        "(stopReason db_unhealthy)",
        f"{iso_duration(MIN_DURATION)} to {iso_duration(MAX_RUN_DURATION_LIMIT)}, "
        + _DURATION_FORMS)
    sleep_ratio: float = setting(
        0, number_between(0, MAX_SLEEP_RATIO), _NUMBER_YAML,
        "pause between batches, as a multiple of the last batch's time (1: the purge holds the "
        "database at most half the time); 0 turns it off",
        f"0 to {MAX_SLEEP_RATIO}, a decimal number")

    archive_retention_days: int = setting(
        DEFAULT_ARCHIVE_RETENTION_DAYS, int_between(1, MAX_RETENTION_DAYS), int,
        "with an archive_table: days an archived row is kept; older ones are deleted by the "
        "policy's runs after the purge",
        f"1 to {MAX_RETENTION_DAYS:,}")

    max_parallel_partitions: int | None = setting(
        None, int_between(1, MAX_PARALLEL_PARTITIONS), int,
        "set, the table is range-partitioned by the age column and each partition with "
        "prunable rows is purged by its own step, at most this many at once (docs/dagster.md, "
        "\"Partitioned tables on several workers\"); unset: one purge of the whole table",
        f"1 to {MAX_PARALLEL_PARTITIONS}")
    drop_expired_partitions: bool = setting(
        False, parse_bool, bool,
        "on a table partitioned by range on the age column, detach and later drop each "
        "partition wholly before the cutoff that holds no row the rule keeps, instead of "
        "deleting its rows (docs/partitioned-tables.md)",
        "true or false")
    detached_retention: dt.timedelta | None = setting(
        DEFAULT_DETACHED_RETENTION, _detached_retention, _DURATION_YAML | None,
        "with drop_expired_partitions: how long a detached partition is kept before a later "
        "run drops it; null keeps it for good",
        f"PT0S to P{MAX_DETACHED_RETENTION.days}D ({_DURATION_FORMS}), or null",
        null_is_value=True)

    hold_table: str | None = setting(
        None, _hold_table, str,
        "set, a row an active hold of this table covers (its policy, the row's hold_column "
        "value, released_at NULL) is never deleted, archived or detached (docs/holds.md); "
        "unset: no holds",
        "schema.table")
    hold_column: str | None = setting(
        None, _hold_column, str,
        "with hold_table: the column of the policy's table a hold's value matches (unset: "
        "key_column)",
        "a column of the table")

    # The catalog: what the cleanup asset carries for the UI's filters (docs/dagster.md,
    # "The catalog").
    owners: tuple[str, ...] = setting(
        (), _owners, list[str] | str,
        "the cleanup asset's owners (the Catalog's owner filter): [team:data-platform, "
        "someone@example.com]; a variable holds them comma-separated",
        "a list of email addresses and `team:<name>`")
    kinds: tuple[str, ...] = setting(
        DEFAULT_KINDS, _kinds, list[str] | str,
        "the cleanup asset's kinds (the Catalog's kind filter and icon); a list replaces the "
        "default, [] sets none",
        f"a list of at most {MAX_KINDS}, each 1 to 63 of A-Z a-z 0-9 _ . -")
    tags: tuple[tuple[str, str], ...] = setting(
        (), _tags, dict[str, str] | str,
        "the cleanup asset's tags (the Catalog's tag filter): {team: billing}",
        "a mapping; keys [prefix/]name, values up to 63 of A-Z a-z 0-9 _ . -; not dagster/")
    group: str | None = setting(
        None, _group, str,
        "the cleanup asset's group; unset, its database's: the database variable in lower "
        "case without _database_url (CARTS_DATABASE_URL: carts)",
        "A-Z a-z 0-9 _, segments separated by /",
        default_text="its database's (`favorites` for `FAVORITES_DATABASE_URL`)")
    row_noun: str = setting(
        DEFAULT_ROW_NOUN, parse_row_noun, str,
        "what the policy's freshness check, metadata keys and messages call a row the rule "
        "admits (guest row: the check no_guest_row_older_than_retention_plus_one_day, the key "
        "overdueGuestRows); changing it renames them (docs/dagster.md, \"Names\")",
        "lower-case words, e.g. guest row")

    explicit: frozenset[str] = field(default=frozenset())

    def __post_init__(self):
        object.__setattr__(self, "explicit", frozenset(self.explicit))
        # Unset, the max is batch_size when that was set (an explicit size is the bound), else
        # the default max, or the first batch's size when that is larger. A max set below
        # batch_size is refused by parse_policy_settings.
        if self.batch_size_max is None:
            largest = (self.batch_size if "batch_size" in self.explicit
                       else max(DEFAULT_BATCH_SIZE_MAX, self.batch_size))
            object.__setattr__(self, "batch_size_max", largest)

    @property
    def batch_size_mode(self) -> BatchSizeMode:
        """How the run sizes its batches (see :class:`BatchSizeMode`)."""
        if not self.target_batch_duration or self.batch_size_max <= self.batch_size:
            return BatchSizeMode.FIXED
        if "batch_size_max" in self.explicit:
            return BatchSizeMode.CAPPED
        return BatchSizeMode.ADAPTIVE

    def purge_options(self, previous_row_s: float | None = None) -> PurgeOptions:
        """The purge's options (:class:`~favorites_maintenance.retention.batch_loop.
        PurgeOptions`, its health thresholds a :class:`~favorites_maintenance.retention.health.
        HealthLimits`): each field named like a setting takes the setting's value, the others
        keep their defaults. ``previous_row_s`` is the previous run's time per row, seconds
        (``None``: not known); mode ``adaptive`` lets keyset order's batches grow further."""
        adaptive = self.batch_size_mode is BatchSizeMode.ADAPTIVE
        return PurgeOptions(**self._same_names(PurgeOptions), previous_row_s=previous_row_s,
                            keyset_batch_size_max=DEFAULT_KEYSET_BATCH_SIZE_MAX if adaptive
                            else None, health=HealthLimits(**self._same_names(HealthLimits)))

    def _same_names(self, options: type) -> dict[str, Any]:
        """Setting name -> value, for the settings ``options`` (a dataclass) has a field of."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(options)
                if f.name in SETTINGS}

    def launched(self, **values: Any) -> PolicySettings:
        """These settings with the run limits a launch set for one run (setting name -> typed
        value: ``batch_size`` rows, ``max_run_duration`` a timedelta), the others kept.

        A launch's ``batch_size`` is explicit: it bounds every batch of the run (mode
        ``fixed``), as the policy's own explicit ``batch_size`` does, whatever the policy's
        mode.

        Raises:
            ValueError: a ``batch_size`` above an explicit ``batch_size_max`` (a launch never
                raises the policy's cap), or a name that is not a policy setting.
        """
        unknown = sorted(set(values) - set(SETTINGS))
        if unknown:
            raise ValueError(f"unknown policy settings {unknown!r}")
        if not values:
            return self
        changed = dict(values)
        if "batch_size" in values:
            size = values["batch_size"]
            if "batch_size_max" in self.explicit and size > self.batch_size_max:
                raise ValueError(f"batch_size {size} is above batch_size_max "
                                 f"({self.batch_size_max}), the largest batch the policy "
                                 "allows; a launch may lower the bound, never raise it")
            changed["batch_size_max"] = size
        return dataclasses.replace(self, **changed, explicit=self.explicit | set(values))


#: Every policy setting: field name -> its declaration, in declaration order.
SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"]
                                for f in dataclasses.fields(PolicySettings)
                                if "setting" in f.metadata}

#: The run limits a launch may set: run-config key -> the setting it stands in for.
LAUNCH_LIMITS: dict[str, str] = {s.launch: name for name, s in SETTINGS.items() if s.launch}


def default_of(name: str) -> Any:
    """The default of setting ``name`` (``None``: unset); one that follows the calendar
    (``partitions_start``) as of now."""
    declared = PolicySettings.__dataclass_fields__[name]
    if declared.default_factory is not dataclasses.MISSING:
        return declared.default_factory()
    return declared.default


def parse_policy_settings(values: Mapping[str, str | int | None],
                          labels: Mapping[str, str]) -> PolicySettings:
    """Validate one policy's settings, given as text (or whole numbers) by field name.

    This is where every value is checked: each setting by its declared parser, then the one
    rule between two settings (``batch_size_max`` is at least ``batch_size``). A missing or
    ``None`` value takes the default; an empty or blank string is an error. The values given
    are the settings' :attr:`PolicySettings.explicit` ones.

    Args:
        values: field name of :class:`PolicySettings` -> raw value.
        labels: field name -> what an error calls it (a variable, or ``policy P, field F``).

    Raises:
        SettingsError: the first invalid value, its label named, with the value at fault.
        ValueError: a name that is not a policy setting.
    """
    unknown = sorted(set(values) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown policy settings {unknown!r}")
    parsed = {}
    for name, declared in SETTINGS.items():
        raw = values.get(name)
        parsed[name] = read_optional({name: None if raw is None else str(raw)}, name,
                                     declared.parse, default_of(name),
                                     label=labels.get(name, name))
    first, largest = parsed["batch_size"], parsed["batch_size_max"]
    if largest is not None and largest < first:
        raise SettingsError(labels.get("batch_size_max", "batch_size_max"),
                            f"'{largest}' is below {labels.get('batch_size', 'batch_size')} "
                            f"({first}), the first batch's size; the max must be at least that")
    return PolicySettings(**parsed, explicit=frozenset(
        name for name, raw in values.items() if raw is not None))


def setting_text(value: Any) -> str | None:
    """A setting's value as a policy file writes it: a duration in ISO 8601 (``PT10M``), a
    boolean ``true``/``false``, a list ``[a, b]``, a mapping ``{k: v}``; ``None`` for unset
    (or an empty list or mapping)."""
    if isinstance(value, dt.timedelta):
        return iso_duration(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple) and value and all(
            isinstance(v, tuple) and len(v) == 2 for v in value):
        value = dict(value)  # tags, kept as pairs
    if isinstance(value, (tuple, list, frozenset)):
        return "[" + ", ".join(map(str, value)) + "]" if value else None
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}" if value else None
    return None if value is None else str(value)


def markdown_table() -> str:
    """The policy settings as the README's configuration table (Markdown)."""
    lines = ["| field | default | accepted | what it does |", "|---|---|---|---|"]
    for name, declared in SETTINGS.items():
        default = setting_text(default_of(name))
        shown = (declared.default_text if declared.default_text is not None
                 else "unset" if default is None else f"`{default}`")
        lines.append(f"| `{name}` | {shown} | {declared.bounds} | {declared.description} |")
    return "\n".join(lines)
