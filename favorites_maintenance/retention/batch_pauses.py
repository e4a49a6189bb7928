"""Between the purge's batches: its time budget, and what stops or pauses it with no
transaction open.

Before each batch the loop asks :meth:`BatchPauses.before_batch`: a stop request ends the run;
so does the time budget (:class:`TimeBudget`) once the first batch ran; with ``sleep_ratio``
the purge pauses that multiple of the last batch's time (pt-archiver's ``--sleep-coef``); with
health limits it waits while the database is unhealthy
(:mod:`~favorites_maintenance.retention.health`). No pause holds a lock or a snapshot.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.health import HealthMonitor, Outcome
from favorites_maintenance.retention.report import StopReason
from favorites_maintenance.retention.run_counts import RunCounts

#: How often a pause between batches (``sleep_ratio``) polls the stop request, in seconds.
PACE_POLL_S = 0.2


@dataclass(frozen=True)
class TimeBudget:
    """A run's time budget on the monotonic clock (``time.monotonic()``, seconds).

    Attributes:
        started: when the run started.
        deadline: when its budget runs out.
    """

    started: float
    deadline: float

    @classmethod
    def from_now(cls, budget: dt.timedelta) -> TimeBudget:
        """A budget of ``budget`` starting now."""
        started = time.monotonic()
        return cls(started, started + budget.total_seconds())

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    def spent(self) -> bool:
        """Whether the budget has run out."""
        return time.monotonic() >= self.deadline


@dataclass
class BatchPauses:
    """What ends or pauses a run before its next batch.

    Attributes:
        budget: the run's time budget.
        should_stop: polled before each batch and during pauses; ``True`` ends the run.
        sleep_ratio: after each batch, pause that multiple of its time; 0: none.
        monitor: the database health indicators, or ``None``: not read.
        last_batch_s: the last batch transaction's time, seconds; the loop sets it after each
            batch, a pace resets it to 0.
    """

    budget: TimeBudget
    should_stop: Callable[[], bool]
    sleep_ratio: float = 0.0
    monitor: HealthMonitor | None = None
    last_batch_s: float = 0.0

    def before_batch(self, conn: sa.Connection, counts: RunCounts, *,
                     nothing_prunable: bool) -> StopReason | None:
        """Why the run stops before its next batch (a stop request, the time budget, an
        unhealthy database), else ``None``, after pausing for the pace and while the database
        is unhealthy. Adds the pace's time to ``counts.paced_s``.

        Args:
            conn: the run's connection, no transaction open; the health indicators are read
                on it.
            counts: the run's counters (``batch_no``: batches so far).
            nothing_prunable: the backlog was counted whole and is empty: no batch to hold
                back, so the first batch does not wait for health.
        """
        if self.should_stop():
            return StopReason.STOP_REQUESTED
        # The first batch always runs, so every run makes progress however small its budget.
        if counts.batch_no and self.budget.spent():
            return StopReason.MAX_RUN_DURATION
        if self.sleep_ratio and self.last_batch_s:
            reason = self._pace(counts)
            if reason is not None:
                return reason
        if self.monitor is not None and not (nothing_prunable and not counts.batch_no):
            # No transaction is open here: a pause holds no lock and no snapshot.
            outcome = self.monitor.wait(conn, should_stop=self.should_stop,
                                        deadline=self.budget.deadline)
            if outcome is Outcome.STOP_REQUESTED:
                return StopReason.STOP_REQUESTED
            if outcome is Outcome.UNHEALTHY:
                return StopReason.DB_UNHEALTHY
        return None

    def _pace(self, counts: RunCounts) -> StopReason | None:
        """Pause ``sleep_ratio`` times the last batch's time, no transaction open; why the run
        stops instead (a stop request, the time budget), else ``None``."""
        started = time.monotonic()
        until = min(started + self.sleep_ratio * self.last_batch_s, self.budget.deadline)
        self.last_batch_s = 0.0  # one pause per batch, whatever follows
        try:
            while (now := time.monotonic()) < until:
                time.sleep(min(PACE_POLL_S, until - now))
                if self.should_stop():
                    return StopReason.STOP_REQUESTED
        finally:
            counts.paced_s += time.monotonic() - started
        return StopReason.MAX_RUN_DURATION if self.budget.spent() else None

    def health_report(self) -> dict:
        """The health monitor's fields of the run's report (the ``health`` argument of
        :meth:`~favorites_maintenance.retention.run_counts.RunCounts.report`): time paused
        (s), pauses, the reading that paused last, the indicators skipped; empty without a
        monitor."""
        monitor = self.monitor
        if monitor is None:
            return {}
        return {"paused_s": monitor.paused_s, "pauses": monitor.pauses,
                "throttled_by": str(monitor.throttled_by) if monitor.throttled_by else None,
                "health_unreadable": tuple(f"{name}: {why}"
                                           for name, why in monitor.unreadable.items())}
