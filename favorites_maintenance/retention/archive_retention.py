"""How long a policy's archived rows stay: :func:`prune_archive` deletes the policy's archived
rows older than its ``archive_retention_days`` (by ``_retention_archived_at``), in batches, after
the main purge, whether the purge succeeded or not; :func:`count_overdue_archive` counts those
still there. The archive itself, and the move of a batch's rows into it, is
:mod:`~favorites_maintenance.retention.archive`.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP

from favorites_maintenance.retention.archive import (
    ARCHIVED_AT_COLUMN,
    POLICY_COLUMN,
    RELKIND,
)
from favorites_maintenance.retention.backlog import holds_as_batches_read
from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    limit_transaction,
)
from favorites_maintenance.retention.errors import (
    ArchiveCountError,
    ArchivePruneError,
    InvalidArgumentError,
    describe,
)
from favorites_maintenance.retention.holds import HoldTable
from favorites_maintenance.retention.rule import split_table_name

log = logging.getLogger("favorites_maintenance.retention.purge")


@dataclass(frozen=True)
class ArchivePruneReport:
    """What deleting archived rows past the archive's retention did.

    Attributes:
        deleted_total: archived rows deleted (metadata ``archiveDeletedTotal``).
        batches: batch transactions that deleted rows.
        rows: the policy's rows left in the archive (metadata ``archiveRows``).
        duration_s: wall time, seconds.
        stopped: whether it stopped on the time budget or a stop request with rows left.
    """

    deleted_total: int
    batches: int
    rows: int
    duration_s: float
    stopped: bool = False


def _not_held(t: sa.Table, hold: HoldTable | None) -> list[sa.ColumnElement[bool]]:
    """``NOT EXISTS`` an active hold of the archived row (on the archive's column of the
    hold column's name, which it copied from the table), or nothing without holds."""
    return [] if hold is None else [~hold.covers(t.c[hold.column])]


def _prune_statement(target_table: str, hold: HoldTable | None = None) -> sa.Select:
    schema, name = split_table_name(target_table, "archive_table")
    t = sa.Table(name, sa.MetaData(schema=schema),
                 sa.Column(POLICY_COLUMN, sa.Text),
                 sa.Column(ARCHIVED_AT_COLUMN, TIMESTAMP(timezone=True)),
                 sa.Column("ctid", sa.types.NullType(), system=True),
                 sa.Column("tableoid", sa.types.NullType(), system=True),
                 *([sa.Column(hold.column, sa.types.NullType())] if hold else []))
    # The database's clock, the one that stamped the rows. A held row stays past the
    # retention; the DELETE repeats the test, as the purge's does.
    old = sa.and_(t.c[POLICY_COLUMN] == sa.bindparam("policy", type_=sa.Text),
                  t.c[ARCHIVED_AT_COLUMN] < sa.func.now() - sa.bindparam("keep",
                                                                          type_=sa.Interval),
                  *_not_held(t, hold))
    # In no order: every row past the retention goes, and an order would sort them all per
    # batch (the archive's index is a BRIN one).
    batch = (sa.select(t.c.tableoid, t.c.ctid).where(old)
             .limit(sa.bindparam("batch_size", type_=sa.Integer, literal_execute=True))
             .cte("archive_batch").prefix_with("MATERIALIZED"))
    # Archived rows are never updated: the address read in this statement names the row, with
    # its partition's (each partition of an archive numbers its addresses from the start).
    deleted = (sa.delete(t).where(t.c.tableoid == batch.c.tableoid, t.c.ctid == batch.c.ctid,
                                  old)
               .returning(sa.literal_column("1")).cte("archive_deleted"))
    return sa.select(
        sa.select(sa.func.count()).select_from(batch).scalar_subquery().label("selected"),
        sa.select(sa.func.count()).select_from(deleted).scalar_subquery().label("deleted"))


def archive_rows_statement(target_table: str) -> sa.Select:
    """``SELECT count(*)`` of one policy's archived rows (``:policy`` bound)."""
    schema, name = split_table_name(target_table, "archive_table")
    t = sa.Table(name, sa.MetaData(schema=schema), sa.Column(POLICY_COLUMN, sa.Text))
    return sa.select(sa.func.count()).select_from(t).where(
        t.c[POLICY_COLUMN] == sa.bindparam("policy", type_=sa.Text))


def prune_archive(engine: sa.Engine, table: str, policy: str, retention_days: int, *,
                  batch_size: int, max_duration: dt.timedelta,
                  should_stop: Callable[[], bool] = lambda: False,
                  lock_timeout: dt.timedelta = DEFAULT_LOCK_TIMEOUT,
                  statement_timeout: dt.timedelta = DEFAULT_STATEMENT_TIMEOUT,
                  hold: HoldTable | None = None) -> ArchivePruneReport:
    """Delete ``policy``'s rows of archive ``table`` archived more than ``retention_days`` ago
    (by the database's clock), at most ``batch_size`` rows a transaction, then
    count the policy's rows left. A missing archive has nothing to delete. With ``hold`` (the
    policy's holds), an archived row an active hold covers is kept, whatever its age; the
    holds are read as the batches read them, in the type of the archive's copy of the column.

    At least one batch runs; after it, the purge stops on ``should_stop`` or once
    ``max_duration`` has passed (the rows left wait for the next run).

    Raises:
        ArchivePruneError: a batch failed (rolled back); earlier batches stay committed.
        InvalidArgumentError: ``batch_size`` or ``retention_days`` not > 0.
    """
    if batch_size <= 0 or retention_days <= 0:
        raise InvalidArgumentError("batch_size and retention_days must be > 0")
    started = time.monotonic()
    params = {"policy": policy, "keep": dt.timedelta(days=retention_days),
              "batch_size": batch_size}
    deleted = batches = 0
    stopped = False
    try:
        with engine.connect() as conn:
            with conn.begin():
                missing = conn.execute(RELKIND, {"t": table}).first() is None
                # The holds read as the batches read them (a hold 042 covers the bigint 42),
                # in the archive's copy of the column's type.
                statement = _prune_statement(table, None if hold is None or missing else
                                             holds_as_batches_read(conn, hold, table))
            while not missing:
                with conn.begin():
                    limit_transaction(conn, lock_timeout=lock_timeout,
                                      statement_timeout=statement_timeout,
                                      synchronous_commit=False)
                    row = conn.execute(statement, params).one()
                deleted += row.deleted
                batches += 1 if row.deleted else 0
                if row.selected < batch_size:
                    break
                if should_stop() or time.monotonic() - started >= max_duration.total_seconds():
                    stopped = True
                    break
            with conn.begin():
                rows = 0 if missing else conn.execute(archive_rows_statement(table),
                                                      {"policy": policy}).scalar_one()
    except sa.exc.DBAPIError as exc:
        error = describe(exc)
        log.warning("deleting archived rows of %s past its retention failed: %s", table, error)
        raise ArchivePruneError(table, deleted, error) from None
    if deleted:
        log.info("deleted %d rows of the archive %s archived more than %d days ago",
                 deleted, table, retention_days)
    return ArchivePruneReport(deleted_total=deleted, batches=batches, rows=rows,
                              duration_s=time.monotonic() - started, stopped=stopped)


@dataclass(frozen=True)
class ArchiveOverdue:
    """A policy's archived rows past the archive's retention, by the database's clock.

    Attributes:
        rows: the policy's rows archived before ``limit``.
        oldest: ``_retention_archived_at`` of the oldest of them, a UTC instant, or ``None``.
        limit: the database's ``now()`` minus the retention, a UTC instant.
    """

    rows: int
    oldest: dt.datetime | None
    limit: dt.datetime


def count_overdue_archive(engine: sa.Engine, table: str, policy: str, retention_days: int, *,
                          lock_timeout: dt.timedelta = DEFAULT_LOCK_TIMEOUT,
                          statement_timeout: dt.timedelta = DEFAULT_STATEMENT_TIMEOUT,
                          hold: HoldTable | None = None) -> ArchiveOverdue:
    """Count ``policy``'s rows of archive ``table`` archived more than ``retention_days`` ago
    (by the database's clock): the rows :func:`prune_archive` deletes, held ones left out
    (with ``hold``). A missing archive holds none. One read, in a transaction bounded like a
    batch's.

    Raises:
        ArchiveCountError: the archive could not be read.
        InvalidArgumentError: ``retention_days`` not > 0.
    """
    if retention_days <= 0:
        raise InvalidArgumentError("retention_days must be > 0")
    schema, name = split_table_name(table, "archive_table")
    t = sa.Table(name, sa.MetaData(schema=schema),
                 sa.Column(POLICY_COLUMN, sa.Text),
                 sa.Column(ARCHIVED_AT_COLUMN, TIMESTAMP(timezone=True)),
                 *([sa.Column(hold.column, sa.types.NullType())] if hold else []))
    limit = sa.func.now() - sa.bindparam("keep", type_=sa.Interval)
    params = {"policy": policy, "keep": dt.timedelta(days=retention_days)}
    try:
        with engine.connect() as conn, conn.begin():
            limit_transaction(conn, lock_timeout=lock_timeout,
                              statement_timeout=statement_timeout)
            if conn.execute(RELKIND, {"t": table}).first() is None:
                rows, oldest, at = 0, None, conn.execute(sa.select(limit), params).scalar_one()
            else:
                # The holds read as prune_archive reads them, so it counts what it deletes.
                typed = holds_as_batches_read(conn, hold, table) if hold is not None else None
                rows, oldest, at = conn.execute(
                    sa.select(sa.func.count(), sa.func.min(t.c[ARCHIVED_AT_COLUMN]), limit)
                    .where(t.c[POLICY_COLUMN] == sa.bindparam("policy", type_=sa.Text),
                           t.c[ARCHIVED_AT_COLUMN] < limit, *_not_held(t, typed)),
                    params).one()
    except sa.exc.DBAPIError as exc:
        raise ArchiveCountError(table, describe(exc)) from None
    return ArchiveOverdue(rows=rows, oldest=oldest.astimezone(dt.UTC) if oldest else None,
                          limit=at.astimezone(dt.UTC))
