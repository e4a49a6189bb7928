"""The size of the purge's next batch, as the loop takes it from batch to batch.

:class:`BatchSizing` holds the size the next batch runs at. Normally it is the adaptive size
(:class:`~favorites_maintenance.retention.batch_size.BatchSizeController`), moved after every
batch that tells a rate, and shrunk when another session waited on a lock the batch held
(counted by :class:`~favorites_maintenance.retention.health.LockWatch`). After a statement
timeout the size stays under a cap: about :data:`TIMEOUT_AIM` of the time the cancelled batch
ran, judged again after every batch and lifted once it reaches the adaptive size. While a
failed batch is split (:mod:`~favorites_maintenance.retention.batch_failures`) the size is
halved down to one row, then doubles back after each piece that goes through.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from favorites_maintenance.retention.batch_size import BatchSizeController
from favorites_maintenance.retention.health import LockWatch
from favorites_maintenance.retention.run_counts import RunCounts

# The purge's log lines keep the purge's logger name, whichever module writes them.
log = logging.getLogger("favorites_maintenance.retention.purge")

#: After a batch ran past ``statement_timeout``, batches aim at this share of the time it ran:
#: enough margin that the next batch, a little slower, still finishes.
TIMEOUT_AIM = 0.5


@dataclass
class BatchSizing:
    """The size of the next batch, rows, and what moves it.

    Attributes:
        controller: the adaptive size.
        size: the next batch's size; below :meth:`full` while a failed batch is split.
        timeout_cap: after a statement timeout, the largest batch expected to finish within
            it, rows; ``None``: no cap.
        timeout_s: how long the cancelled batch ran, seconds.
        counted: the backlog counted whole before the first batch (keyset order), rows, else
            ``None``: the rest of it is taken in one batch once a batch's rate says it fits.
        lock_watch: counts the sessions waiting on a batch's locks when the size adapts, else
            ``None``.
    """

    controller: BatchSizeController
    size: int
    timeout_cap: int | None = None
    timeout_s: float = 0.0
    counted: int | None = None
    lock_watch: LockWatch | None = None

    @classmethod
    def starting(cls, controller: BatchSizeController) -> BatchSizing:
        """The sizing of a run whose first batch has ``controller``'s size."""
        # The lock watch is asked just before a batch's commit: always when the batch is slow,
        # else at a bounded rate.
        watch = LockWatch(slow_after=controller.target_s / 2) if controller.adaptive else None
        return cls(controller, controller.size, lock_watch=watch)

    def full(self) -> int:
        """The size of a batch when no failed batch is being split: the controller's, under
        the cap a statement timeout set."""
        if self.timeout_cap is None:
            return self.controller.size
        return min(self.controller.size, self.timeout_cap)

    def at_full_size(self) -> bool:
        """Whether the next batch has the :meth:`full` size (no failed batch is being split)."""
        return self.size == self.full()

    def after_batch(self, selected: int, limit: int, waiters: int, elapsed: float, *,
                    rated: bool, counts: RunCounts) -> None:
        """Size the next batch after one of ``limit`` rows that selected ``selected`` in
        ``elapsed`` seconds while ``waiters`` sessions waited on its locks; ``rated``: the
        batch tells the adaptive size's rate. Counts isolation transactions and lock waits in
        ``counts``."""
        if self.timeout_cap is not None and selected:
            self._follow_timeout(selected, elapsed)
        if self.size < self.full():
            counts.isolation_batches += 1
            # A piece went through: grow back toward the adaptive size (which does not
            # change while a failed batch is split).
            self.size = min(self.full(), self.size * 2)
        elif rated and not waiters:
            self.controller.after_batch(selected, elapsed)
            if self.counted is not None:
                # What is left of the counted backlog, in one batch if this batch's rate
                # says it fits.
                self.controller.fit(self.counted - counts.selected_total)
            self.size = self.full()
        elif rated:
            # Someone waited on this batch's locks: whatever its time, the next is smaller.
            counts.lock_waits += 1
            self.controller.lock_waiters(waiters)
            self.size = self.full()
            log.info("batch %d held a lock %d other sessions waited on; next batch %d rows",
                     counts.batch_no, waiters, self.size)

    def _follow_timeout(self, selected: int, elapsed: float) -> None:
        """After a statement timeout: the cap for the next batch, from the time this one of
        ``selected`` rows took (aiming at :data:`TIMEOUT_AIM` of the cancelled batch's time,
        growing at most twofold); lifted once it reaches the controller's size."""
        aimed = selected * TIMEOUT_AIM * self.timeout_s / elapsed if elapsed > 0 else selected * 2
        cap = max(1, int(min(aimed, selected * 2)))
        self.timeout_cap = None if cap >= self.controller.size else cap

    def split(self, limit: int) -> int:
        """A batch of ``limit`` rows failed: the next takes the same position with half its
        rows (at least one); returns that size."""
        self.size = max(1, limit // 2)
        return self.size

    def cap_after_timeout(self, limit: int, elapsed: float, batch_no: int) -> None:
        """Batch ``batch_no`` of ``limit`` rows ran ``elapsed`` seconds, past
        ``statement_timeout``: later batches stay below it (see :meth:`_follow_timeout`)."""
        if limit == 1:
            return  # that row's own cost, skipped: no reason to shrink the others
        if self.timeout_cap is None:
            log.warning("batch %d ran past statement_timeout (%.1f s) and was rolled back: its "
                        "rows are taken again in smaller batches, down to one row; a row "
                        "whose delete alone runs past it is skipped", batch_no, elapsed)
        self.timeout_cap = min(self.timeout_cap or limit, max(1, limit // 2))
        self.timeout_s = max(self.timeout_s, elapsed)
