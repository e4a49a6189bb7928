"""Whether the purge's next batch is optimistic or locks its rows first.

An optimistic batch deletes its counted candidates with a plain DELETE under a short
``lock_timeout``; the locking form takes them ``FOR UPDATE SKIP LOCKED`` first (the statements:
:mod:`~favorites_maintenance.retention.statements`). A run turns optimistic once the role is
known to be able to lock what the rule matches (``proven``), and goes back to the locking form
for :data:`LOCKING_AFTER_CONFLICT` batches after an optimistic batch met a row another session
held or moved. A batch being split after a failure, and a one-row batch, always lock.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

#: Batches run in the locking form after an optimistic batch met a held or moved row.
LOCKING_AFTER_CONFLICT = 16


@dataclass
class BatchForm:
    """The form of the next batch.

    Attributes:
        allowed: batches may be optimistic at all (the purge's ``optimistic`` option).
        fast_lock_timeout: ``lock_timeout`` of an optimistic batch.
        proven: a batch transaction has committed, or the table and role need no proof that
            the role may lock: batches may be optimistic from then on.
        locking_left: batches still to run in the locking form after a conflict.
    """

    allowed: bool
    fast_lock_timeout: dt.timedelta
    proven: bool = False
    locking_left: int = 0

    def optimistic(self, limit: int, *, at_full_size: bool) -> bool:
        """Whether the next batch (``limit`` rows; ``at_full_size``: no failed batch is being
        split) runs in the optimistic form."""
        # The first batch locks first where the table or role may refuse the lock (see
        # ScanEstimate.lock_first): it proves the role may lock what the rule matches (the
        # form every later batch falls back to), so row-level security without an UPDATE
        # policy fails the run at once rather than under contention.
        return (self.allowed and self.proven and limit > 1 and at_full_size
                and not self.locking_left)

    def lock_timeout(self, fast: bool, lock_timeout: dt.timedelta) -> dt.timedelta:
        """The ``lock_timeout`` of a batch: the optimistic one when ``fast``, else the
        purge's ``lock_timeout``."""
        return self.fast_lock_timeout if fast else lock_timeout

    def lock_from_now(self) -> None:
        """An optimistic batch met a held or moved row: lock the next batches."""
        self.locking_left = LOCKING_AFTER_CONFLICT

    def committed(self, *, at_full_size: bool) -> None:
        """A batch of full size (``at_full_size``) committed in the locking form after a
        conflict: one fewer to go."""
        if self.locking_left and at_full_size:
            self.locking_left -= 1
