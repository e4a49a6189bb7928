"""What the purge's loop carries from one batch to the next, besides its counters and the next
batch's size, form and pauses.

:class:`LoopState` is the one place a run's changing state is declared: the rule and statements
the batches run (replaced when the holds must be compared as text), the connection (replaced
after a stale statement), the position (:mod:`~favorites_maintenance.retention.scan`), what
the catalogs said before the first batch, and the few marks a failed batch leaves for the next
one. The loop (:class:`~favorites_maintenance.retention.batch_loop.BatchLoop`) holds it as
``state``; its preparation steps (:mod:`~favorites_maintenance.retention.loop_preparation`)
fill it before the first batch, its failure steps (:mod:`~favorites_maintenance.retention.
batch_failures`) change it after a failed batch. The rest of a run's state has classes of its
own: the counters (:class:`~favorites_maintenance.retention.run_counts.RunCounts`), the next
batch's size (:class:`~favorites_maintenance.retention.batch_sizing.BatchSizing`) and form
(:class:`~favorites_maintenance.retention.batch_form.BatchForm`), and what stops or pauses it
(:class:`~favorites_maintenance.retention.batch_pauses.BatchPauses`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from favorites_maintenance.retention.archive import Archive
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.scan import KeysetScan, PageScan
from favorites_maintenance.retention.spans import BatchSpans
from favorites_maintenance.retention.statements import BatchStatements


@dataclass
class LoopState:
    """The state one purge carries between its batches. ``rule`` to ``spans`` are set before
    batch 1 (``rule`` given, ``conn`` opened by the loop's ``run``, the rest by its preparation
    steps); ``again`` to ``delete_work`` are what one batch transaction leaves for the next.

    Attributes:
        rule: the rule the batches run; its holds typed before batch 1, compared as text once
            a hold no longer reads as the hold column's type (failure steps).
        conn: the run's connection, opened by ``run``; a new one after a stale statement.
        archive: the archive the batches move rows into, checked before batch 1; its hold test
            follows ``rule``'s. ``None``: rows are deleted.
        statements: the keyset order's statements, rebuilt whenever ``rule`` is replaced.
        scan: the position, keyset or page order, advanced by every batch; page order turns
            to keyset order when its pages would outlast the time budget.
        shape: the table's columns as last checked (``table_shape``); checked again inside a
            batch when they changed.
        by_ctid: the batches match their rows by address (``ctid``).
        keyset_index: the table has the rule's partial index (batches turn incremental sort
            off).
        nothing_prunable: the backlog was counted whole before batch 1 and is empty: no health
            pause.
        spans: starts each batch transaction's span.
        again: the next batch takes the same batch again, keeping its number (a conflict, a
            moved row); cleared as a batch starts.
        row_key: a one-row batch's candidate (``key`` and ``age``, or ``tid``), named before
            its delete or located after it failed; ``None``: not named. Cleared as a batch
            starts.
        stale_retries: runs of the current batch after a stale statement (it keeps its
            number); 0 after a transaction that ended without error, and after most other
            errors (the failure steps).
        moved_retries: runs of the current batch after a row moved across partitions under
            it; 0 after a transaction that ended without error.
        delete_work: what deleting one row fires (foreign keys, triggers: schema objects),
            read when the first row is skipped for a statement timeout; ``None``: not read.
    """

    rule: RetentionRule
    conn: sa.Connection | None = None
    archive: Archive | None = None
    statements: BatchStatements | None = None
    scan: KeysetScan | PageScan | None = None
    shape: tuple | None = None
    by_ctid: bool = False
    keyset_index: bool = False
    nothing_prunable: bool = False
    spans: BatchSpans | None = None
    again: bool = False
    row_key: Any = None
    stale_retries: int = 0
    moved_retries: int = 0
    delete_work: str | None = None

    def start_batch(self) -> bool:
        """A batch transaction starts: clear what the last one left for it (``again``,
        ``row_key``); whether it is a new batch (``False``: the same one taken again, or run
        again after a stale statement, keeps its number)."""
        new = not (self.stale_retries or self.again)
        self.again, self.row_key = False, None
        return new

    def transaction_ended(self) -> None:
        """A batch transaction ended without error (committed or rolled back by choice): the
        next batch starts its retries afresh."""
        self.stale_retries = self.moved_retries = 0
