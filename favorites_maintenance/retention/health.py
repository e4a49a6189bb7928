"""Database health between batches: the purge pauses while the primary or its standbys strain.

A purge at full speed writes WAL as fast as the primary can: standbys fall behind (their
readers see stale data; a replication slot keeps every WAL segment the standby has not
confirmed, on the primary's disk), and a VACUUM of the table competes with it for the same
pages. :class:`HealthMonitor` reads these indicators between batches, at most every
``check_every`` while healthy, and holds the purge while one is over its threshold:

- ``replication_lag``: bytes of WAL between the primary's current position and the replay
  position of any connected standby (``pg_stat_replication``, states ``streaming`` and
  ``catchup``), or the position any replication slot still holds
  (``pg_replication_slots``: ``confirmed_flush_lsn`` of a logical slot, ``restart_lsn`` of a
  physical one), whether a client is connected to it or not;
- ``vacuum``: a VACUUM, manual or autovacuum, running on the rule's table
  (``pg_stat_progress_vacuum``);
- ``wal_rate``: bytes of WAL the whole server wrote per second since the previous reading
  (``pg_current_wal_insert_lsn()``), only when a threshold is set.

While paused, no transaction is open: the monitor sleeps with a backoff (``first_backoff``
doubling up to ``max_backoff``), polls the stop request every :data:`STOP_POLL_S`, reads the
indicators again after each sleep, and lets the purge go on once none is over. Paused longer
than ``max_pause``, or past the run's deadline, it gives up: the run ends (``db_unhealthy``) and
the backlog waits for the next one.

Reading another session's replication position or VACUUM progress needs the privileges of
``pg_read_all_stats`` (part of ``pg_monitor``). A role without them sees nothing there, which
would read as "healthy": the monitor checks the privilege once, reports each indicator it
cannot read (a log line and :attr:`HealthMonitor.unreadable`, naming the grant) and skips it.
Replication slots and the WAL position are readable by any role.

A reading is one statement for every indicator (one round trip); where the server refuses this
role any part of it, the indicators are read one statement at a time from then on, and those it
may not read are skipped.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.defaults import (
    DEFAULT_MAX_PAUSE,
    DEFAULT_MAX_REPLICATION_LAG_BYTES,
)
from favorites_maintenance.retention.errors import ErrorKind, describe
from favorites_maintenance.retention.rule import RetentionRule

log = logging.getLogger(__name__)

#: How often a pause polls the stop request, in seconds.
STOP_POLL_S = 0.2

#: The grant that lets a role read the indicators of other sessions.
MONITOR_GRANT = "GRANT pg_monitor TO <role> WITH INHERIT TRUE (see least_privilege.sql)"


class Indicator(str, enum.Enum):
    """A database health indicator (metadata ``throttledBy`` starts with its value)."""

    REPLICATION_LAG = "replication_lag"
    VACUUM = "vacuum"
    WAL_RATE = "wal_rate"


@dataclass(frozen=True)
class Reading:
    """An indicator found over its threshold.

    Attributes:
        indicator: which one.
        value: bytes behind (``replication_lag``), bytes per second (``wal_rate``), the
            VACUUM's backend pid (``vacuum``).
        threshold: the limit it is over (``None`` for ``vacuum``: any VACUUM counts).
        source: what it was read from: a standby or a slot by name, the VACUUM's kind and
            phase. Schema and server objects only, never row data.
    """

    indicator: Indicator
    value: int
    threshold: int | None
    source: str
    #: The table a ``vacuum`` reading is about, ``schema.table``; ``None`` for the others.
    table: str | None = None

    def __str__(self) -> str:
        if self.indicator is Indicator.REPLICATION_LAG:
            return (f"replication_lag {self.value:,} bytes > {self.threshold:,} "
                    f"({self.source})")
        if self.indicator is Indicator.WAL_RATE:
            return f"wal_rate {self.value:,} bytes/s > {self.threshold:,} ({self.source})"
        return f"vacuum running on {self.table} ({self.source})"


@dataclass(frozen=True)
class HealthLimits:
    """The thresholds and pacing of :class:`HealthMonitor`. A policy's thresholds come from
    its settings, whose declarations hold their bounds; they are not checked again here.

    Attributes:
        max_replication_lag_bytes: a standby or slot further behind than this pauses the purge
            (bytes of WAL, > 0).
        max_wal_bytes_per_second: WAL written per second above which the purge pauses;
            ``None``: not watched.
        watch_vacuum: pause while a VACUUM runs on the table.
        max_pause: the longest one pause may last before the run gives up.
        check_every: the least time between two readings while healthy.
        first_backoff, max_backoff: sleep after the first reading that pauses, doubled after
            each further one, up to the max.
    """

    max_replication_lag_bytes: int = DEFAULT_MAX_REPLICATION_LAG_BYTES
    max_wal_bytes_per_second: int | None = None
    watch_vacuum: bool = True
    max_pause: dt.timedelta = DEFAULT_MAX_PAUSE
    check_every: dt.timedelta = dt.timedelta(seconds=1)
    first_backoff: dt.timedelta = dt.timedelta(milliseconds=500)
    max_backoff: dt.timedelta = dt.timedelta(seconds=10)


class Outcome(enum.Enum):
    """What :meth:`HealthMonitor.wait` decided."""

    GO = "go"
    """Healthy (or cleared after a pause): run the next batch."""
    STOP_REQUESTED = "stop_requested"
    """A stop was requested while paused."""
    UNHEALTHY = "unhealthy"
    """Paused longer than ``max_pause``, or out of the run's time budget while paused."""


_STATS_PRIVILEGE = sa.text("SELECT pg_has_role('pg_read_all_stats', 'USAGE')")

_STANDBY_LAG = sa.text("""
    SELECT 'standby ' || quote_literal(coalesce(nullif(application_name, ''),
                                                client_addr::text, 'pid ' || pid)),
           pg_wal_lsn_diff(pg_current_wal_lsn(), coalesce(replay_lsn, flush_lsn))::bigint
      FROM pg_stat_replication
     WHERE state IN ('streaming', 'catchup')
       AND coalesce(replay_lsn, flush_lsn) IS NOT NULL
     ORDER BY 2 DESC LIMIT 1""")

_SLOT_LAG = sa.text("""
    SELECT 'slot ' || quote_literal(slot_name),
           pg_wal_lsn_diff(pg_current_wal_lsn(),
                           coalesce(confirmed_flush_lsn, restart_lsn))::bigint
      FROM pg_replication_slots
     WHERE coalesce(confirmed_flush_lsn, restart_lsn) IS NOT NULL
     ORDER BY 2 DESC LIMIT 1""")

_VACUUM = sa.text("""
    SELECT p.pid, p.phase, coalesce(a.backend_type, '') = 'autovacuum worker'
      FROM pg_stat_progress_vacuum p
      LEFT JOIN pg_stat_activity a ON a.pid = p.pid
     WHERE p.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND p.relid = to_regclass(:table)
     LIMIT 1""")

_WAL_POSITION = sa.text("SELECT pg_current_wal_insert_lsn()::text")

#: Every indicator in one statement (the four above, each only where it is read): one round
#: trip for a reading. Any part this role is refused fails it; the reading then goes statement
#: by statement, skipping what it may not read.
_ALL = sa.text("""
    SELECT st.privileged, sl.source, sl.lag, sb.source, sb.lag, v.pid, v.phase, v.auto,
           CASE WHEN CAST(:wal AS boolean) THEN pg_current_wal_insert_lsn()::text END
      FROM (SELECT pg_has_role('pg_read_all_stats', 'USAGE') AS privileged) AS st
      LEFT JOIN LATERAL (
           SELECT 'slot ' || quote_literal(slot_name),
                  pg_wal_lsn_diff(pg_current_wal_lsn(),
                                  coalesce(confirmed_flush_lsn, restart_lsn))::bigint
             FROM pg_replication_slots
            WHERE coalesce(confirmed_flush_lsn, restart_lsn) IS NOT NULL
            ORDER BY 2 DESC LIMIT 1) AS sl(source, lag) ON true
      LEFT JOIN LATERAL (
           SELECT 'standby ' || quote_literal(coalesce(nullif(application_name, ''),
                                                       client_addr::text, 'pid ' || pid)),
                  pg_wal_lsn_diff(pg_current_wal_lsn(), coalesce(replay_lsn, flush_lsn))::bigint
             FROM pg_stat_replication
            WHERE st.privileged AND state IN ('streaming', 'catchup')
              AND coalesce(replay_lsn, flush_lsn) IS NOT NULL
            ORDER BY 2 DESC LIMIT 1) AS sb(source, lag) ON true
      LEFT JOIN LATERAL (
           SELECT p.pid, p.phase, coalesce(a.backend_type, '') = 'autovacuum worker'
             FROM pg_stat_progress_vacuum p
             LEFT JOIN pg_stat_activity a ON a.pid = p.pid
            WHERE st.privileged AND CAST(:vacuum AS boolean)
              AND p.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND p.relid = to_regclass(:table)
            LIMIT 1) AS v(pid, phase, auto) ON true""")

#: Waiters on a lock this session holds. ``pg_blocking_pids`` takes the lock manager's
#: shared state for a moment: only computed for sessions waiting on a lock at all.
_LOCK_WAITERS = sa.text("""
    SELECT count(*) FROM pg_stat_activity
     WHERE wait_event_type = 'Lock' AND pg_backend_pid() = ANY(pg_blocking_pids(pid))""")


class HealthMonitor:
    """Reads the indicators between batches and pauses the purge while one is over.

    Args:
        limits: thresholds and pacing.
        rule: the rule being purged; a VACUUM on its table pauses the purge.
        clock: monotonic clock in seconds (tests may pass their own).
        sleep: sleeps that many seconds.

    Attributes:
        paused_s: time spent paused, all pauses together, in seconds.
        pauses: how many pauses began.
        throttled_by: the latest reading that paused the purge (``None``: never paused).
        unreadable: indicator -> why it is skipped (the grant it needs), once per monitor.
    """

    def __init__(self, limits: HealthLimits, *, rule: RetentionRule,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.limits = limits
        self._table = rule.qualified_name
        self._clock = clock
        self._sleep = sleep
        self._last_check = -float("inf")
        self._stats_privilege: bool | None = None
        self._wal: tuple[int, float] | None = None
        self.paused_s = 0.0
        self.pauses = 0
        self.throttled_by: Reading | None = None
        self.unreadable: dict[str, str] = {}
        self._in_one = True  # whether a reading may be one statement (see _ALL)

    # ---------------------------------------------------------------------------------------
    # pausing

    def wait(self, conn: sa.Connection, *, should_stop: Callable[[], bool],
             deadline: float) -> Outcome:
        """Before a batch: return at once when the last reading is recent or healthy; else
        pause (no transaction open) until every indicator is under its threshold again.

        Args:
            conn: a connection on the primary with no transaction open; each reading is its
                own short transaction, and none is left open.
            should_stop: polled every :data:`STOP_POLL_S` while paused.
            deadline: the run's time budget, on :attr:`clock`; a pause never sleeps past it.

        Returns:
            :class:`Outcome`: ``GO``, ``STOP_REQUESTED`` (asked to stop while paused) or
            ``UNHEALTHY`` (paused longer than ``max_pause``, or out of budget while paused).
        """
        now = self._clock()
        if now - self._last_check < self.limits.check_every.total_seconds():
            return Outcome.GO
        reading = self.read(conn)
        if reading is None:
            return Outcome.GO
        self.pauses += 1
        self.throttled_by = reading
        started = self._clock()
        max_pause = self.limits.max_pause.total_seconds()
        backoff = self.limits.first_backoff.total_seconds()
        log.warning("purge paused, no transaction open: %s; reading it again in %.1f s, for at "
                    "most %g s", reading, backoff, max_pause)
        try:
            while True:
                until = min(self._clock() + backoff, started + max_pause, deadline)
                while (now := self._clock()) < until:
                    if should_stop():
                        log.warning("stop requested while paused (%s)", reading)
                        return Outcome.STOP_REQUESTED
                    self._sleep(min(STOP_POLL_S, until - now))
                if should_stop():
                    return Outcome.STOP_REQUESTED
                again = self.read(conn, on_error=reading)
                paused = self._clock() - started
                if again is None:
                    log.warning("purge resumed after %.1f s paused: %s cleared", paused,
                                reading.indicator.value)
                    return Outcome.GO
                reading = self.throttled_by = again
                if paused >= max_pause:
                    log.warning("purge stopped after %.1f s paused (more than %g s): %s; the "
                                "backlog waits for the next run", paused, max_pause, reading)
                    return Outcome.UNHEALTHY
                if self._clock() >= deadline:
                    log.warning("purge stopped: the run's time budget ran out after %.1f s "
                                "paused: %s; the backlog waits for the next run", paused,
                                reading)
                    return Outcome.UNHEALTHY
                backoff = min(backoff * 2, self.limits.max_backoff.total_seconds())
        finally:
            self.paused_s += self._clock() - started

    # ---------------------------------------------------------------------------------------
    # reading

    def read(self, conn: sa.Connection, *, on_error: Reading | None = None) -> Reading | None:
        """Read every readable indicator once; return the first over its threshold, or
        ``None`` when all are under. Leaves no transaction open.

        A database error other than a missing privilege while reading is logged and answered
        with ``on_error``: before a batch (``None``) it reads as healthy, and the batch that
        follows meets the same error and handles it as batches do; while paused, the reading
        that paused the purge, so a failed read (a killed session, a timeout) never ends a
        pause by itself.
        """
        self._last_check = self._clock()
        try:
            if self._in_one:
                try:
                    return self._read_in_one(conn)
                except sa.exc.DBAPIError as exc:
                    if describe(exc).kind is not ErrorKind.PERMISSION_DENIED:
                        raise
                    _rollback(conn)
                    self._in_one = False
            if self._stats_privilege is None:
                self._stats_privilege = bool(self._scalar(conn, _STATS_PRIVILEGE))
                if not self._stats_privilege:
                    self._skip("replication_lag of standbys (pg_stat_replication)")
                    if self.limits.watch_vacuum:
                        self._skip("vacuum (pg_stat_progress_vacuum)")
            for read in (self._replication_lag, self._vacuum, self._wal_rate):
                reading = read(conn)
                if reading is not None:
                    return reading
            return None
        except sa.exc.DBAPIError as exc:
            _rollback(conn)
            if on_error is None:
                log.warning("could not read the database's health (the purge goes on): %s",
                            describe(exc))
            else:
                log.warning("could not read the database's health while paused (still paused: "
                            "%s): %s", on_error, describe(exc))
            return on_error

    def _read_in_one(self, conn: sa.Connection) -> Reading | None:
        """:meth:`read` in one statement (:data:`_ALL`)."""
        limits = self.limits
        with conn.begin():
            (privileged, slot, slot_lag, standby, standby_lag, pid, phase, auto,
             wal) = conn.execute(_ALL, {"wal": limits.max_wal_bytes_per_second is not None,
                                        "vacuum": limits.watch_vacuum,
                                        "table": self._table}).one()
        if self._stats_privilege is None:
            self._stats_privilege = bool(privileged)
            if not privileged:
                self._skip("replication_lag of standbys (pg_stat_replication)")
                if limits.watch_vacuum:
                    self._skip("vacuum (pg_stat_progress_vacuum)")
        lags = [(lag, source) for source, lag in ((slot, slot_lag), (standby, standby_lag))
                if lag is not None]
        if lags and max(lags)[0] > limits.max_replication_lag_bytes:
            lag, source = max(lags)
            return Reading(Indicator.REPLICATION_LAG, int(lag), limits.max_replication_lag_bytes,
                           source)
        if pid is not None:
            return Reading(Indicator.VACUUM, int(pid), None,
                           f"{'autovacuum' if auto else 'VACUUM'} pid {pid}, phase {phase}",
                           table=self._table)
        return self._wal_reading(wal)

    def _replication_lag(self, conn: sa.Connection) -> Reading | None:
        limit = self.limits.max_replication_lag_bytes
        statements = [_SLOT_LAG] + ([_STANDBY_LAG] if self._stats_privilege else [])
        worst = None
        for statement in statements:
            row = self._row(conn, statement, "replication_lag")
            if row is not None and row[1] is not None and (worst is None or row[1] > worst[1]):
                worst = row
        if worst is not None and worst[1] > limit:
            return Reading(Indicator.REPLICATION_LAG, int(worst[1]), limit, worst[0])
        return None

    def _vacuum(self, conn: sa.Connection) -> Reading | None:
        if not (self.limits.watch_vacuum and self._stats_privilege):
            return None
        row = self._row(conn, _VACUUM, "vacuum",
                        {"table": self._table})
        if row is None:
            return None
        pid, phase, auto = row
        return Reading(Indicator.VACUUM, int(pid), None,
                       f"{'autovacuum' if auto else 'VACUUM'} pid {pid}, phase {phase}",
                       table=self._table)

    def _wal_rate(self, conn: sa.Connection) -> Reading | None:
        limit = self.limits.max_wal_bytes_per_second
        if limit is None:
            return None
        return self._wal_reading(self._scalar(conn, _WAL_POSITION, "wal_rate"))

    def _wal_reading(self, text: str | None) -> Reading | None:
        """The ``wal_rate`` reading from the WAL position ``text`` (``None``: not read)."""
        limit = self.limits.max_wal_bytes_per_second
        if limit is None or text is None:
            return None
        position, now = _lsn(text), self._clock()
        previous, self._wal = self._wal, (position, now)
        if previous is None or now <= previous[1]:
            return None
        rate = (position - previous[0]) / (now - previous[1])
        if rate > limit:
            return Reading(Indicator.WAL_RATE, int(rate), limit,
                           f"over the last {now - previous[1]:.1f} s")
        return None

    def _row(self, conn: sa.Connection, statement, indicator: str, params=None):
        if indicator in self.unreadable:
            return None
        try:
            with conn.begin():
                return conn.execute(statement, params or {}).first()
        except sa.exc.DBAPIError as exc:
            if describe(exc).kind is not ErrorKind.PERMISSION_DENIED:
                raise
            self._skip(indicator)
            return None

    def _scalar(self, conn: sa.Connection, statement, indicator: str | None = None):
        if indicator is None:
            with conn.begin():
                return conn.execute(statement).scalar()
        row = self._row(conn, statement, indicator)
        return None if row is None else row[0]

    def _skip(self, indicator: str) -> None:
        if indicator not in self.unreadable:
            self.unreadable[indicator] = f"needs {MONITOR_GRANT}"
            log.warning("health indicator %s cannot be read by this role and is skipped; "
                        "it needs %s", indicator, MONITOR_GRANT)


class LockWatch:
    """Whether another session waits on a lock the purge holds, asked inside a batch
    transaction, just before its commit, at a bounded cost.

    A waiter waits as long as the batch holds its locks, so only a batch that has taken a
    while is worth the statement: it is asked when the batch so far took at least
    ``slow_after`` seconds, and otherwise at most every ``every`` seconds, counted from the
    watch's start (a run that ends within a second with fast batches asks nothing).

    Args:
        slow_after: seconds after which a batch is asked about every time.
        every: the least time between two questions to faster batches, in seconds.
        clock: monotonic clock in seconds.
    """

    def __init__(self, slow_after: float, every: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.slow_after = slow_after
        self.every = every
        self._clock = clock
        self._last = clock()
        self.checks = 0

    def due(self, batch_elapsed_s: float) -> bool:
        """Whether to ask the batch that has run ``batch_elapsed_s`` seconds so far."""
        return (batch_elapsed_s >= self.slow_after
                or self._clock() - self._last >= self.every)

    def waiters(self, conn: sa.Connection) -> int:
        """Sessions waiting on a lock held by the open transaction of ``conn``."""
        self._last = self._clock()
        self.checks += 1
        return int(conn.execute(_LOCK_WAITERS).scalar_one())


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _rollback(conn: sa.Connection) -> None:
    try:
        conn.rollback()
    except sa.exc.DBAPIError:
        pass
