"""The size of the next batch: adapted to a target time per batch transaction.

A batch's cost grows with its rows, and so do the time it holds its row locks and the burst of
WAL its commit sends to the standbys. A fixed size is either too small on a quiet database
(per-transaction overhead dominates) or too large on a busy one. :class:`BatchSizeController`
moves the size toward a target wall time per batch, after every batch:

- a batch that took longer than the target shrinks the next one at once, to the size that
  would have taken :data:`AIM` of the target at the batch's own rate (rows per second);
- a batch well under the target (below :data:`GROW_BELOW` of it) grows the next one toward
  that same size, by at most :data:`GROW_FACTOR` per batch, so a single fast batch (a cached
  page run) cannot jump the size to the max;
- in between, the size stays: a band, so the size does not oscillate around the target;
- a batch that grew, took a good part of the target (:data:`JUDGE_FROM`) and deleted at a
  clearly lower rate than the batch before it (below :data:`WORSE_RATE` of it) goes back to
  the size before (or smaller, if it was over the target and the rule above asks for less),
  which becomes a ceiling for the next
  :data:`CEILING_BATCHES` batches: past some size the planner may reach the batch's rows by
  scanning every prunable row instead of by address, and a larger batch, though still under
  the target, then deletes fewer rows a second;
- another session waiting on a lock the purge holds halves the next batch at once (the wait
  lasts as long as the batch does);
- the size always stays between :attr:`~BatchSizeController.floor` and
  :attr:`~BatchSizeController.maximum`.

The first batch is the one no measurement bounds, and the run's time budget is only checked
between batches: its size comes from what is known. Given the time per row of the previous run
(:attr:`~BatchSizeController.row_s`), it aims at :data:`AIM` of the target at that rate; with
nothing known, it is the first size (1,000 rows by default). A backlog counted whole before the
run (a day's rows) that fits within :data:`AIM` of the target at a known time per row is then
within the first size and goes in one batch; with nothing known, the first batch measures the
rate, and the rest of the backlog goes in the next batch when it fits at that rate
(:meth:`~BatchSizeController.fit`), rather than growing toward it batch after batch.

A target of zero turns adaptation off: every batch has the first size. The rule follows the
shape of GitLab's batched background migrations (time efficiency against a target band, growth
capped per step); the numbers are this project's. The module is pure: no database, no clock.
"""

from __future__ import annotations

import datetime as dt
import math

from favorites_maintenance.retention.errors import InvalidArgumentError

#: The size a change aims at, as a share of the target: below it, so that the next batch, a
#: little slower than the last, still fits.
AIM = 0.8
#: A batch faster than this share of the target lets the next one grow.
GROW_BELOW = 0.5
#: The most the size grows from one batch to the next.
GROW_FACTOR = 2.0
#: A grown batch deleting fewer rows a second than this share of the batch before it was a
#: step too far (measured noise between two batches of the same size stays well within it).
WORSE_RATE = 0.75
#: A step too far is only judged on a batch that took at least this share of the target: the
#: rate of a batch of a few milliseconds is mostly noise, and a slow plan shows as a slow batch.
JUDGE_FROM = 0.25
#: Batches the ceiling set by a step too far holds before the size may try growing past it.
CEILING_BATCHES = 50
#: The smallest adaptive size (or the first size, when smaller): below it the per-transaction
#: cost dominates and the purge would crawl without sparing anyone.
FLOOR = 100


class BatchSizeController:
    """Chooses each batch's size.

    Args:
        first: the first batch's size when no time per row is known, rows (> 0).
        maximum: the largest size it may reach, rows; raised to ``first`` when smaller.
        target: wall time a batch transaction aims at; zero (or negative) turns adaptation off.
        floor: the smallest size it may shrink to, rows; at most ``first``
            (default :data:`FLOOR`).
        row_s: the time a row took in the previous run's batch transactions, seconds (> 0);
            when the size adapts, the first batch aims at :data:`AIM` of the target at that
            rate, between the floor and the max. ``None``: not known, the first batch has
            ``first`` rows.

    Raises:
        InvalidArgumentError: ``first`` or ``floor`` not positive, ``row_s`` not a positive
            finite number.

    Attributes:
        size: the next batch's size, rows.
        row_s: the latest known time per row, seconds: ``row_s`` as given, then that of the
            last batch taken by :meth:`after_batch`; ``None`` when not known (and always when
            the size does not adapt).
        shrinks: how many times the size shrank (a slow batch, a step too far, a lock waiter).
        ceiling: the size growth may not pass for now, after a step too far (``None``: none).
    """

    def __init__(self, first: int, maximum: int, target: dt.timedelta, *, floor: int = FLOOR,
                 row_s: float | None = None):
        if first <= 0:
            raise InvalidArgumentError(f"first must be > 0, got {first!r}")
        if floor <= 0:
            raise InvalidArgumentError(f"floor must be > 0, got {floor!r}")
        if row_s is not None and not 0 < row_s < math.inf:
            raise InvalidArgumentError(f"row_s must be a number of seconds > 0, got {row_s!r}")
        self.maximum = max(maximum, first)
        self.floor = min(floor, first)
        self.target_s = max(target.total_seconds(), 0.0)
        self.row_s = row_s if self.adaptive else None
        self.size = first
        if self.row_s is not None:
            self._set(AIM * self.target_s / self.row_s)
        self.shrinks = 0
        self.ceiling: int | None = None
        self._ceiling_left = 0
        self._before_growth: tuple[int, float] | None = None  # (size, rows/s) before a step

    @property
    def adaptive(self) -> bool:
        """Whether the size adapts (a target above zero)."""
        return self.target_s > 0

    def after_batch(self, rows: int, duration_s: float) -> int:
        """Take a full batch of ``rows`` rows that took ``duration_s`` seconds (BEGIN to COMMIT)
        and return the next batch's size. Call it for batches of the current size whose rows
        tell the rate: full ones in keyset order (the last, partial batch and the pieces of a
        split batch do not), in page order those that found at least a quarter of their size
        (a range of pages aims at more rows than the size, so most come back full)."""
        if not self.adaptive or rows <= 0:
            return self.size
        self.row_s = max(duration_s, 0.0) / rows
        rate = rows / duration_s if duration_s > 0 else math.inf
        before, self._before_growth = self._before_growth, None
        if self._ceiling_left:
            self._ceiling_left -= 1
            if not self._ceiling_left:
                self.ceiling = None
        ratio = duration_s / self.target_s
        if before is not None and ratio >= JUDGE_FROM and rate < before[1] * WORSE_RATE:
            # The step up made every row dearer (over the target or not): back to the size
            # before, which was under it, and stay there a while.
            self.ceiling, self._ceiling_left = before[0], CEILING_BATCHES
            # Over the target, no larger than the time rule allows either.
            self._set(min(before[0], rows * AIM / ratio) if ratio > 1.0 else before[0])
            self.shrinks += 1
        elif ratio > 1.0:
            aimed = rows * AIM / ratio
            self._set(min(aimed, self.size - 1))
            self.shrinks += 1
        elif ratio < GROW_BELOW:
            aimed = rows * AIM / ratio if ratio > 0 else math.inf
            previous = self.size
            self._set(min(aimed, self.size * GROW_FACTOR, self.ceiling or math.inf))
            if self.size > previous:
                self._before_growth = (previous, rate)
        return self.size

    def fit(self, rows: int) -> int:
        """Take a backlog known to hold ``rows`` more prunable rows (counted before the first
        batch, less what the batches since took): when the size adapts, the next batch takes
        all of them at once (``rows + 1``, so that it comes back less than full and ends the
        run), rather than growing toward them batch after batch, if that is within
        :attr:`maximum` (and a ceiling a step too far set) and the known time per row
        (:attr:`row_s`) says they take at most :data:`AIM` of the target. With no time per row
        known the size stays: a batch of unknown cost is no larger than the first size. (At
        the previous run's time per row, rows that fit are already within the first size.)
        Returns the next batch's size."""
        largest = min(self.maximum, self.ceiling or self.maximum)
        if (self.adaptive and self.row_s is not None and self.size <= rows < largest
                and rows * self.row_s <= AIM * self.target_s):
            self.size = rows + 1
        return self.size

    def widen(self, maximum: int) -> int:
        """Let the size grow up to ``maximum`` rows from now on (never lowers the largest
        size): a run in keyset order, whose batches stay far under the target at the page
        order's largest size. The next batch's size does not change; growth takes it there.
        Returns the largest size."""
        self.maximum = max(self.maximum, maximum)
        return self.maximum

    def lock_waiters(self, count: int) -> int:
        """Take the number of sessions found waiting on a lock the purge held during the last
        batch; any halves the next size. Returns the next batch's size."""
        if self.adaptive and count > 0:
            self._before_growth = None
            self._set(self.size // 2)
            self.shrinks += 1
        return self.size

    def _set(self, size: float) -> None:
        self.size = int(min(self.maximum, max(self.floor, math.floor(size))))
