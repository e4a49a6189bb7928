"""The drop phase's state: what it was given, what it decided so far, and how it alters the
table (one statement under ``lock_timeout``, retried after a lock timeout, a stop heard between
attempts). :func:`~favorites_maintenance.retention.partitioned.drop_expired_partitions` is the
phase's front; "partition" here is a PostgreSQL table partition
(:mod:`~favorites_maintenance.retention.table_partitions`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

from favorites_maintenance.retention.errors import ErrorKind, describe
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.table_partitions import TablePartition, quote_identifier

# One logger for the whole drop phase, whichever module logs.
log = logging.getLogger("favorites_maintenance.retention.partitioned")

#: Attempts of one DETACH or DROP that ``lock_timeout`` cancels, and the pause before the
#: second, in seconds (doubled after each).
LOCK_ATTEMPTS = 5
LOCK_BACKOFF_S = 1.0
#: What makes a statement of the drop phase run again: a lock wait ``lock_timeout`` cut, and a
#: deadlock PostgreSQL broke by rolling this transaction back (two runs at once detaching and
#: marking the same table's partitions meet in one).
_RETRIED = frozenset({ErrorKind.LOCK_NOT_AVAILABLE, ErrorKind.DEADLOCK_DETECTED})


#: The function a table's owner installs so that a role that may not alter the table has its
#: expired partitions detached and dropped (``least_privilege_partitions.sql``, rendered for
#: the rule by ``least_privilege.partition_functions_sql``):
#: ``<schema>.<table>_detach_partition(regclass, timestamptz, integer)`` and
#: ``<schema>.<table>_drop_detached(regclass, interval, integer)``.
DETACH_FUNCTION = "{schema}.{table}_detach_partition"
DROP_FUNCTION = "{schema}.{table}_drop_detached"
DETACH_ARGS = "(regclass, timestamptz, integer)"
DROP_ARGS = "(regclass, interval, integer)"


class Action(enum.StrEnum):
    """What the drop phase did with one partition or detached table."""

    DETACHED = "detached"
    """Detached from the parent (its rows counted as removed); dropped by a later run."""
    DROPPED = "dropped"
    """A table this job detached, dropped once ``detached_retention`` had passed."""
    KEPT = "kept"
    """Left attached: its prunable rows are deleted in batches as any other row."""
    KEPT_DETACHED = "kept_detached"
    """A detached table left in place (its retention not over, or a check failed)."""


@dataclass(frozen=True)
class PartitionDecision:
    """What the drop phase decided for one partition (or detached table), and why.

    Attributes:
        partition: ``schema.name``.
        action: the :class:`Action`.
        checks: the checks' results, one phrase each, in the order run (``upper bound
            2024-02-01T00:00:00+00:00 <= cutoff``, ``no account row (index scan on ...)``,
            ...); the last one is the reason when ``action`` is ``kept``.
        rows: rows of the partition counted when it was detached (or dropped), else 0.
        detached_as: for a partition detached, the name (``schema.name``) its table took
            (``partition_marks.DETACHED_SUFFIX``); empty otherwise.
    """

    partition: str
    action: Action
    checks: tuple[str, ...] = ()
    rows: int = 0
    detached_as: str = ""

    @property
    def ends_after_cutoff(self) -> bool:
        """Kept for its range alone: it ends after the cutoff (the run's log names such
        partitions together)."""
        return (self.action is Action.KEPT and len(self.checks) == 1
                and self.checks[0].startswith("upper bound ") and " > cutoff " in self.checks[0])

    def describe(self) -> str:
        """One log line: ``partition favorites.favorites_20240101 detached (1,000 rows): ...``,
        ``detached table favorites.favorites_20240101 dropped: ...``."""
        rows = f" ({self.rows:,} rows)" if self.rows else ""
        if self.action in (Action.DROPPED, Action.KEPT_DETACHED):
            what = "detached table"
            action = "kept" if self.action is Action.KEPT_DETACHED else "dropped"
        else:
            what, action = "partition", str(self.action)
        return f"{what} {self.partition} {action}{rows}: {'; '.join(self.checks)}"


@dataclass(frozen=True)
class PartitionDropResult:
    """What one drop phase did (see
    :func:`~favorites_maintenance.retention.partitioned.drop_expired_partitions`).

    Attributes:
        detached: partitions detached by this run (``schema.name``), an interrupted detach
            it finalized included.
        dropped: detached tables this run dropped.
        rows_removed: rows of the partitions this run detached (they left the table: the
            run's ``deletedTotal`` counts them).
        decisions: one :class:`PartitionDecision` per partition and detached table looked at.
        privilege: how the job altered the table: ``owner`` (its role may), ``function`` (the
            owner's ``SECURITY DEFINER`` function), or ``none`` (neither: nothing detached).
    """

    detached: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    rows_removed: int = 0
    decisions: tuple[PartitionDecision, ...] = ()
    privilege: str = "none"

    def figures(self) -> tuple[int, int, int]:
        """(partitions detached, detached tables dropped, rows of the detached partitions)."""
        return len(self.detached), len(self.dropped), self.rows_removed


@dataclass
class DropPhase:
    """One run's drop phase: its settings, the decisions taken so far (one
    :class:`PartitionDecision` each, in order), whether its stop was logged, and how the job
    may alter the table (``privilege``: ``owner``, ``function`` or ``none``)."""

    engine: sa.Engine
    rule: RetentionRule
    cutoff: dt.datetime
    detached_retention: dt.timedelta | None
    lock_timeout: dt.timedelta
    statement_timeout: dt.timedelta
    should_stop: Callable[[], bool] = lambda: False
    decisions: list[PartitionDecision] = field(default_factory=list)
    stop_logged: bool = False
    privilege: str = "none"

    @property
    def parent(self) -> str:
        """The partitioned table, ``schema.name``."""
        return self.rule.qualified_name

    @property
    def quoted_parent(self) -> str:
        """The partitioned table, quoted for SQL text."""
        table = self.rule.table
        return quote_identifier(table.schema) + "." + quote_identifier(table.name)

    def function(self, template: str, args: str) -> str:
        """The owner's function ``template`` (:data:`DETACH_FUNCTION`, :data:`DROP_FUNCTION`)
        named for the table, followed by ``args``."""
        return template.format(schema=self.rule.table.schema, table=self.rule.table.name) + args

    def stopped(self) -> bool:
        """Whether a stop was requested (logged once, the first time it is seen)."""
        if not self.should_stop():
            return False
        if not self.stop_logged:
            self.stop_logged = True
            log.warning("drop_expired_partitions stopped on request after %d partitions "
                        "decided; the others stay attached", len(self.decisions))
        return True

    def result(self, privilege: str) -> PartitionDropResult:
        """The :class:`PartitionDropResult` of the decisions so far (each logged at DEBUG)."""
        for decision in self.decisions:
            log.debug("%s", decision.describe())
        detached = tuple(d.partition for d in self.decisions if d.action is Action.DETACHED)
        return PartitionDropResult(
            detached=detached,
            dropped=tuple(d.partition for d in self.decisions if d.action is Action.DROPPED),
            rows_removed=sum(d.rows for d in self.decisions if d.action is Action.DETACHED),
            decisions=tuple(self.decisions), privilege=privilege)

    def alter(self, statement: str) -> None:
        """Run one ``ALTER TABLE`` outside a transaction block (``CONCURRENTLY`` demands it),
        under ``lock_timeout`` set for the session and reset after."""
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("SELECT set_config('lock_timeout', :ms, false)"),
                         {"ms": ms(self.lock_timeout)})
            try:
                conn.exec_driver_sql(statement)
            finally:
                if not conn.invalidated:
                    with contextlib.suppress(sa.exc.DBAPIError):
                        conn.exec_driver_sql("RESET lock_timeout")

    def with_lock_retries(self, what: str, table: TablePartition,
                          attempt: Callable[[], None]) -> str | None:
        """Run ``attempt``; after a lock timeout or a deadlock (its transaction rolled back),
        again up to :data:`LOCK_ATTEMPTS` times with a doubling pause. Returns ``None`` on
        success, else why it failed (for the log)."""
        pause = LOCK_BACKOFF_S
        for number in range(1, LOCK_ATTEMPTS + 1):
            try:
                attempt()
                return None
            except sa.exc.DBAPIError as exc:
                error = describe(exc)
                refused = refusal(exc)
                if refused is not None:
                    return refused
                if error.kind not in _RETRIED or number == LOCK_ATTEMPTS:
                    log.warning("%s of %s failed: %s", what, table.qualified_name,
                                error)
                    return error
                cause = (f"lock_timeout ({ms(self.lock_timeout)})"
                         if error.kind is ErrorKind.LOCK_NOT_AVAILABLE else str(error.kind))
                log.warning("%s of %s: %s on attempt %d/%d; again in %g s", what,
                            table.qualified_name, cause, number, LOCK_ATTEMPTS, pause)
                if self.pause_or_stop(pause):
                    return "a stop was requested before the next attempt"
                pause *= 2
        return "no attempt left"  # pragma: no cover - the loop returns

    def pause_or_stop(self, seconds: float) -> bool:
        """Sleep ``seconds``, polling :attr:`should_stop` every tenth of a second; whether a
        stop was requested."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.stopped():
                return True
            time.sleep(min(left, 0.1))
        return self.stopped()


def refusal(exc: sa.exc.DBAPIError) -> str | None:
    """The reason the owner's function gave for keeping a table (it raises SQLSTATE 55000
    with a message starting ``kept:``, naming schema objects only), else ``None``."""
    orig = getattr(exc, "orig", None)
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None) or ""
    if getattr(orig, "sqlstate", None) == "55000" and primary.startswith("kept: "):
        return primary.removeprefix("kept: ")
    return None


def iso(value: dt.timedelta | None) -> str:
    """ISO 8601: ``P7D``, ``P1DT12H``, ``PT0S``; ``null`` for ``None``."""
    if value is None:
        return "null"
    days, seconds = value.days, value.seconds + value.microseconds / 1e6
    time_part = f"T{seconds:g}S" if seconds else ""
    return f"P{days}D{time_part}" if days else f"PT{seconds:g}S"


def ms(value: dt.timedelta) -> str:
    return f"{max(1, round(value.total_seconds() * 1000))}ms"


def ms_int(value: dt.timedelta) -> int:
    return max(1, round(value.total_seconds() * 1000))
