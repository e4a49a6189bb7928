"""The purge: delete the rows a retention rule finds prunable, one batch transaction at a time.

:func:`purge` is the public entry; it runs a
:class:`~favorites_maintenance.retention.batch_loop.BatchLoop`. Where each part lives:

- :mod:`~favorites_maintenance.retention.batch_loop`: the loop of batch transactions (the
  optimistic and locking forms, timeouts, adaptive size, health pauses, row-level failures),
  and :class:`~favorites_maintenance.retention.batch_loop.PurgeOptions`, the purge's settings;
- :mod:`~favorites_maintenance.retention.statements`: every SQL statement it runs, and why each
  has its shape;
- :mod:`~favorites_maintenance.retention.diagnosis`: why a run that deletes nothing, or far
  less than it selects, fails;
- :mod:`~favorites_maintenance.retention.report`: what a run reports.

What a run does, step by step, is docs/how-a-run-works.md.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import sqlalchemy as sa

from favorites_maintenance.retention.archive import ArchiveTarget
from favorites_maintenance.retention.batch_loop import BatchLoop, PurgeOptions
from favorites_maintenance.retention.report import BatchResult, PurgeReport
from favorites_maintenance.retention.rule import RetentionRule


def purge(engine: sa.Engine, rule: RetentionRule, cutoff: dt.datetime, options: PurgeOptions,
          *, should_stop: Callable[[], bool] = lambda: False,
          on_batch: Callable[[BatchResult], None] | None = None,
          archive: ArchiveTarget | None = None) -> PurgeReport:
    """Delete every row ``rule`` finds prunable at ``cutoff``, one batch transaction at a
    time, and return the run's :class:`PurgeReport` (docs/how-a-run-works.md, "purge").

    The session and the table are checked before the first batch
    (:func:`~favorites_maintenance.retention.table_check.check_table`). A batch a row-level
    error or ``statement_timeout`` fails is split down to single rows, and a row that still
    fails is skipped (its key logged only when it is a number); a batch a schema change made
    stale is run again on a new connection.

    Args:
        engine: engine on the policy's database (the primary).
        rule: the table and predicate to purge.
        cutoff: timezone-aware UTC instant (:func:`~favorites_maintenance.retention.rule.
            compute_cutoff`).
        options: the purge's settings (:class:`~favorites_maintenance.retention.batch_loop.
            PurgeOptions`).
        should_stop: polled before each batch; ``True`` ends the purge with
            ``stop_reason=stop_requested``. An open batch is never torn.
        on_batch: called after each committed batch (progress, logs, metrics).
        archive: move each batch's rows into this archive in the batch's own statement
            (:mod:`~favorites_maintenance.retention.archive`); ``deleted_total`` then counts
            the rows moved. ``None``: rows are deleted.

    Raises:
        StandbyError, ReplicationRoleError, ConnectError, TableCheckError: the session could
            not be used; nothing was deleted.
        TableShapeError: the table lacks a column the rule needs, has the wrong type, or
            refuses every DELETE; nothing was deleted. Its subclass
            :class:`TableChangedError`: the shape changed so during the run.
        ArchiveError: with ``archive``: it does not match the table or cannot be created, or
            the table's columns changed during the run.
        BatchError: a batch failed; it was rolled back, earlier batches stay committed.
        SkippedRowsError: the table is blocked, or more than ``options.max_skipped_rows``
            rows were skipped.
        NoProgressError: the batches deleted none or far fewer of the rows they selected.
        InvalidArgumentError: a naive ``cutoff``, or ``options.previous_row_s`` not > 0.
    """
    rule.prunable(cutoff)  # refuses a naive cutoff before any connection
    return BatchLoop(engine, rule, cutoff, options, should_stop=should_stop,
                     on_batch=on_batch, archive=archive).run()
