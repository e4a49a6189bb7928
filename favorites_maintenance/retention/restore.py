"""Restore: move archived rows back into their table, one batch transaction at a time.

The rows a run archived (by its run id), or those archived between two instants, go back as
they were: every column the archive holds, in batches of one statement each. A batch is a range
of the archive's pages (row addresses, a TID range scan: the archive's index is a BRIN one,
which finds where the selection lies but not in key order), sized to hold about ``batch_size``
of its rows::

    WITH restore_batch AS MATERIALIZED (
        SELECT DISTINCT ON (id) tableoid, ctid, id FROM <archive>
         WHERE _retention_policy = :policy AND _retention_run_id = :run_id   -- or the instants
           AND ctid >= :from_tid AND ctid < :to_tid                          -- the page range
         ORDER BY id, _retention_archived_at DESC),
    restore_moved AS (
        DELETE FROM <archive> USING restore_batch
         WHERE <archive>.tableoid = restore_batch.tableoid
           AND <archive>.ctid = restore_batch.ctid AND <archive>.id = restore_batch.id
           AND _retention_policy = :policy AND _retention_run_id = :run_id   -- the selection
           AND NOT EXISTS (SELECT 1 FROM <table> WHERE <table>.id = <archive>.id)
        RETURNING <every column>),
    restore_inserted AS (INSERT INTO <table> (<every column but generated ones>)
                         SELECT ... FROM restore_moved RETURNING 1)
    SELECT (SELECT count(*) FROM restore_batch), (SELECT count(*) FROM restore_moved),
           (SELECT count(*) FROM restore_inserted)

so a row is either restored or left in the archive, never both and never neither. What leaves
the archive is matched by the selection itself (policy, run or instants, key) and by its address
with its partition's: the partitions of a partitioned archive each number their addresses from
the start, so an address alone names a row in each of them. A restore therefore never moves more
rows than it selected. A row whose key
exists in the table again (the application wrote it anew) is left in the archive and counted,
never written over. A key archived more than once (in a selection by instants) comes back once:
the first version met in the archive's order, the latest when they share a page range.
Generated columns are recomputed by the table; ``GENERATED ALWAYS`` identity keys are written
with ``OVERRIDING SYSTEM VALUE``.

Before the first batch the archive is checked against the table as a purge checks it, and the
selection counted: a selection with no row is refused (an unknown run id), and so are rows the
deployed rule would prune again at once (its guard columns NULL and its age past the cutoff of
now), unless ``allow_prunable``: the usual fix is to correct the policy first. ``pretend``
counts and moves nothing. Counts only: no value of an archived row is ever logged or returned.

A batch that fails on a row-level error (a foreign key whose parent is gone, a check the table
gained) is taken again on half the pages, down to one page, whose rows then go one at a time; a
row that still fails stays in the archive, counted with its cause.

A batch whose insert returns fewer rows than it took out of the archive (a ``BEFORE INSERT``
trigger of the table returned NULL for them, sending them to another table or dropping them)
is rolled back and ends the restore, naming the trigger: the restore could not tell where
those rows went, and counts only rows the table took.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP, distinct_on
from sqlalchemy.sql.dml import Insert

from favorites_maintenance.retention.archive import (
    ARCHIVED_AT_COLUMN,
    POLICY_COLUMN,
    RUN_ID_COLUMN,
    Archive,
    ArchiveTarget,
    InsertOverridingSystemValue,
    archive_table,
    check_archive,
    insert_interceptor,
    table_columns,
)
from favorites_maintenance.retention.backlog import compared_as_batches
from favorites_maintenance.retention.catalog_type import CatalogType
from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    limit_transaction,
)
from favorites_maintenance.retention.errors import (
    ArchiveError,
    ErrorDescription,
    ErrorKind,
    InvalidArgumentError,
    RestoreBatchError,
    RestoreError,
    describe,
)
from favorites_maintenance.retention.rule import RetentionRule, compute_cutoff
from favorites_maintenance.retention.statements import assert_primary
from favorites_maintenance.retention.table_check import check_table

log = logging.getLogger("favorites_maintenance.retention.restore")

_UTC = dt.timezone.utc
#: Runs of one batch after a key came back between the check and the insert.
_UNIQUE_RETRIES = 3


@dataclass(frozen=True)
class Selection:
    """Which archived rows a restore takes: those one run archived, or those archived in
    ``[since, until)``.

    Attributes:
        run_id: the id of the run that archived them, or ``None``.
        since, until: timezone-aware instants, or ``None``.

    Raises:
        InvalidArgumentError: neither or both ways given, a naive instant, or ``until`` not
            after ``since``.
    """

    run_id: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    def __post_init__(self):
        if (self.run_id is None) == (self.since is None and self.until is None):
            raise InvalidArgumentError("give a run id, or since and/or until instants, not "
                                       "both and not neither")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and (value.tzinfo is None or value.utcoffset() is None):
                raise InvalidArgumentError(f"{name} must be a timezone-aware instant")
        if self.since and self.until and self.until <= self.since:
            raise InvalidArgumentError("until must be after since")

    def __str__(self) -> str:
        if self.run_id is not None:
            return f"run {self.run_id}"
        since = self.since.astimezone(_UTC).isoformat() if self.since else "the first"
        until = self.until.astimezone(_UTC).isoformat() if self.until else "now"
        return f"archived from {since} until {until}"


@dataclass(frozen=True)
class RestoreReport:
    """What a restore did, or would do (``pretend``).

    Attributes:
        selected_rows: archived rows of the selection before the restore.
        restored_rows: rows moved back into the table (0 with ``pretend``).
        restorable_rows: rows the restore could move back (their key absent from the table,
            one version per key).
        left_in_archive: rows of the selection still in the archive afterwards: their key
            exists in the table again (or a newer version of it was restored), or they failed.
        key_exists_rows: rows of the selection whose key exists in the table at the start.
        prunable_rows: rows of the selection the deployed rule would prune again at once.
        failed_rows: rows left in the archive because inserting them failed.
        failed_causes: the causes of those failures (kind, SQLSTATE, schema objects).
        batches: batch transactions that restored rows.
        duration_s: wall time, seconds.
        pretend: nothing was moved.
        stopped: a stop request ended it before the selection was done.
    """

    selected_rows: int
    restored_rows: int
    restorable_rows: int
    left_in_archive: int
    key_exists_rows: int
    prunable_rows: int
    failed_rows: int = 0
    failed_causes: tuple[str, ...] = ()
    batches: int = 0
    duration_s: float = 0.0
    pretend: bool = False
    stopped: bool = False


class _Swallowed(Exception):
    """A batch took ``moved`` rows out of the archive, but the table's insert returned only
    ``restored``; raised inside the batch's transaction, which it rolls back."""

    def __init__(self, moved: int, restored: int):
        super().__init__(f"{moved} rows moved, {restored} inserted")
        self.moved, self.restored = moved, restored


@dataclass
class _Progress:
    restored: int = 0
    batches: int = 0
    failed: int = 0
    causes: dict = field(default_factory=dict)
    #: The batch in progress, 1-based (a batch retried after a unique violation keeps it).
    batch_no: int = 0


def _selected(t: sa.Table, policy: str, selection: Selection) -> list[sa.ColumnElement[bool]]:
    where = [t.c[POLICY_COLUMN] == sa.bindparam("policy", policy, type_=sa.Text)]
    if selection.run_id is not None:
        where.append(t.c[RUN_ID_COLUMN] == sa.bindparam("run_id", selection.run_id,
                                                        type_=sa.Text))
    if selection.since is not None:
        where.append(t.c[ARCHIVED_AT_COLUMN] >= sa.bindparam(
            "since", selection.since, type_=TIMESTAMP(timezone=True)))
    if selection.until is not None:
        where.append(t.c[ARCHIVED_AT_COLUMN] < sa.bindparam(
            "until", selection.until, type_=TIMESTAMP(timezone=True)))
    return where


#: A row address, for the page ranges of a restore's batches.
_TID = CatalogType("tid")


def _address(name: str) -> sa.ColumnElement:
    # A row address bound as its text, '(page,item)'.
    return sa.cast(sa.bindparam(name, type_=sa.Text), _TID)


def restore_statement(archive: Archive, rule: RetentionRule,
                      selection: Selection) -> sa.Select:
    """The statement of one restore batch (see the module docstring): the selection's rows at
    addresses from ``:from_tid`` up to, not including, ``:to_tid`` (row addresses as text,
    ``'(page,item)'``, bound at execution). It returns one row: ``selected`` (rows of the
    selection in the range, one per key), ``moved`` (rows taken out of the archive) and
    ``restored`` (rows the table's insert returned)."""
    a, s = archive.table, archive.source_rule.table
    key = rule.key.name
    where = [*_selected(a, archive.target.policy, selection),
             a.c.ctid >= _address("from_tid"), a.c.ctid < _address("to_tid")]
    batch = (sa.select(a.c.tableoid, a.c.ctid, a.c[key].label("key")).where(*where)
             .ext(distinct_on(a.c[key])).order_by(a.c[key], a.c[ARCHIVED_AT_COLUMN].desc())
             .cte("restore_batch").prefix_with("MATERIALIZED"))
    back = sa.select(sa.literal(1)).where(s.c[key] == a.c[key]).exists()
    names = [c.name for c in archive.columns if not c.generated]
    # The row the batch chose, and only a row of the selection: an address is unique only
    # with its partition's.
    moved = (sa.delete(a).where(a.c.tableoid == batch.c.tableoid, a.c.ctid == batch.c.ctid,
                                a.c[key] == batch.c.key,
                                *_selected(a, archive.target.policy, selection), ~back)
             .returning(*(a.c[n] for n in names)).cte("restore_moved"))
    insert_cls = (InsertOverridingSystemValue
                  if any(c.identity_always for c in archive.columns) else Insert)
    inserted = (insert_cls(s).from_select(names, sa.select(*(moved.c[n] for n in names)))
                .returning(sa.literal_column("1")).cte("restore_inserted"))
    return sa.select(
        sa.select(sa.func.count()).select_from(batch).scalar_subquery().label("selected"),
        sa.select(sa.func.count()).select_from(moved).scalar_subquery().label("moved"),
        sa.select(sa.func.count()).select_from(inserted).scalar_subquery().label("restored"))


def _bounds(conn: sa.Connection, archive: Archive, selection: Selection) -> tuple[int, int]:
    """The first and last page of the archive holding a row of the selection (``(0, -1)``
    when none does)."""
    a = archive.table
    low, high = conn.execute(sa.select(
        sa.cast(sa.func.min(a.c.ctid), sa.Text), sa.cast(sa.func.max(a.c.ctid), sa.Text))
        .where(*_selected(a, archive.target.policy, selection))).one()
    if low is None:
        return 0, -1
    return _page(low), _page(high)


def _page(address: str) -> int:
    return int(address.strip("()").split(",")[0])


def _rows_per_page(conn: sa.Connection, archive: Archive) -> float:
    """The archive's rows per page as the planner's statistics have them (50 when unknown)."""
    a = archive.table
    tuples, pages = conn.execute(sa.text(
        "SELECT reltuples, relpages FROM pg_class WHERE oid = to_regclass(:t)"),
        {"t": f"{a.schema}.{a.name}"}).one()
    return tuples / pages if tuples and tuples > 0 and pages else 50.0


def _counts(conn: sa.Connection, archive: Archive, rule: RetentionRule, selection: Selection,
            cutoff: dt.datetime) -> dict[str, int]:
    """The selection's rows, those whose key is in the table, those restorable and those the
    rule would prune at ``cutoff`` (evaluated on the archive's own columns, the holds read as
    a run's batches read them)."""
    a, s = archive.table, archive.source_rule.table
    key = rule.key.name
    where = _selected(a, archive.target.policy, selection)
    back = sa.select(sa.literal(1)).where(s.c[key] == a.c[key]).exists()
    # The rule's own predicate, on the archive's columns of the same names: a held row would
    # not be deleted again (its holds read as the batches read them, 042 for the bigint 42).
    on_archive = RetentionRule(table=a, key=a.c[key], age=a.c[rule.age.name],
                               guards=tuple(a.c[c.name] for c in rule.guards),
                               cutoff_inclusive=rule.cutoff_inclusive).with_hold(
        compared_as_batches(conn, rule).hold)
    row = conn.execute(sa.select(
        sa.func.count().label("selected"),
        sa.func.count().filter(back).label("key_exists"),
        sa.func.count(sa.distinct(a.c[key])).filter(~back).label("restorable"),
        sa.func.count().filter(on_archive.prunable(cutoff)).label("prunable"),
    ).where(*where)).one()
    return row._asdict()


def restore(engine: sa.Engine, rule: RetentionRule, target_table: str, policy: str,
            selection: Selection, *, retention_days: int, batch_size: int = 1000,
            pretend: bool = False, allow_prunable: bool = False,
            should_stop: Callable[[], bool] = lambda: False,
            lock_timeout: dt.timedelta = DEFAULT_LOCK_TIMEOUT,
            statement_timeout: dt.timedelta = DEFAULT_STATEMENT_TIMEOUT) -> RestoreReport:
    """Move ``selection``'s rows of ``policy`` from archive ``target_table`` back into
    ``rule``'s table (see the module docstring).

    Args:
        engine: engine on the policy's database (the primary).
        rule: the policy's rule (its table, key, guard and age columns).
        target_table: the archive, ``schema.table``.
        policy: the policy's name, as the archive's ``_retention_policy`` holds it.
        selection: the rows to restore.
        retention_days: the deployed retention: restored rows older than ``now -
            retention_days`` (the database's now) with their guard columns NULL are
            *prunable*.
        batch_size: rows per batch transaction, > 0.
        pretend: count only; move nothing.
        allow_prunable: restore prunable rows too (the next run deletes them again).
        should_stop: polled before each batch; ``True`` ends the restore (``stopped``).
        lock_timeout, statement_timeout: server-side limits of each transaction.

    Returns:
        The :class:`RestoreReport` (for ``pretend``, what a restore would do now).

    Raises:
        RestoreError: nothing selected (an unknown run id), prunable rows without
            ``allow_prunable``, the archive missing or not matching the table; nothing moved.
        RestoreBatchError: a batch failed on an error that is not about one row (rolled
            back, its rows left in the archive; earlier batches stay restored).
        RestoreError: also when the table's insert returned fewer rows than a batch took out
            of the archive (a ``BEFORE INSERT`` trigger returning NULL, named): that batch
            rolled back, earlier batches stay restored.
        TableShapeError: the table is not one the policy's rule can use.
        StandbyError, InvalidArgumentError: a standby; a ``batch_size`` not > 0.
    """
    if batch_size <= 0:
        raise InvalidArgumentError(f"batch_size must be > 0, got {batch_size!r}")
    started = time.monotonic()
    target = ArchiveTarget(target_table, policy, selection.run_id or "restore")
    try:
        with engine.connect() as conn:
            assert_primary(conn)
            conn.rollback()
            with conn.begin():
                limit_transaction(conn, lock_timeout=lock_timeout,
                                  statement_timeout=statement_timeout)
                archive = _checked_archive(conn, rule, target)
                now = conn.execute(sa.select(sa.func.now())).scalar_one()
                counts = _counts(conn, archive, rule, selection,
                                 compute_cutoff(now, retention_days))
            report = RestoreReport(
                selected_rows=counts["selected"], restored_rows=0,
                restorable_rows=counts["restorable"], left_in_archive=counts["selected"],
                key_exists_rows=counts["key_exists"], prunable_rows=counts["prunable"],
                pretend=pretend, duration_s=time.monotonic() - started)
            _check_selected(report, rule, target_table, policy, selection, retention_days,
                            allow_prunable)
            if pretend:
                return report
            progress = _Progress()
            stopped = _move_back(conn, archive, rule, selection, report, progress, started,
                                 batch_size, should_stop, lock_timeout, statement_timeout)
            final = _report(report, progress, started, stopped)
    except _Swallowed as swallowed:
        # That batch rolled back; the batches before it stay restored.
        raise _swallowed_error(engine, rule, target_table, progress.batch_no, swallowed,
                               _report(report, progress, started, False)) from None
    except sa.exc.DBAPIError as exc:
        # Outside a batch (the checks, the counts, the archive's page bounds): nothing of it
        # was moved; the batches before it stay restored.
        error = describe(exc)
        log.warning("restore of policy %s could not read %s or %s: %s", policy, target_table,
                    rule.qualified_name, error)
        raise RestoreError(f"restore could not read {target_table} or "
                           f"{rule.qualified_name}: {error}") from None
    log.info("restore of policy %s, %s: %d rows moved back into %s in %d batches, %d left in "
             "the archive", policy, selection, final.restored_rows, rule.qualified_name,
             final.batches, final.left_in_archive)
    return final


def _move_back(conn: sa.Connection, archive: sa.Table, rule: RetentionRule,
               selection: Selection, report: RestoreReport, progress: _Progress, started: float,
               batch_size: int, should_stop: Callable[[], bool], lock_timeout: dt.timedelta,
               statement_timeout: dt.timedelta) -> bool:
    """The batches of :func:`restore`: ranges of the archive's pages, each moved back in one
    transaction, sized toward ``batch_size`` rows; ``progress`` counts what they moved.
    Returns whether ``should_stop`` ended them.

    Raises:
        RestoreBatchError: as :func:`restore` says.
        _Swallowed: the table's insert returned fewer rows than the batch took out.
    """
    statement = restore_statement(archive, rule, selection)
    with conn.begin():
        page, last = _bounds(conn, archive, selection)
        per_page = _rows_per_page(conn, archive)
    pages = max(1, int(batch_size / per_page))
    again = 0
    while page <= last:
        if should_stop():
            return True
        progress.batch_no += 0 if again else 1
        end = page + pages
        try:
            row = _run_batch(conn, statement, f"({page},0)", f"({end},0)", lock_timeout,
                             statement_timeout)
        except sa.exc.DBAPIError as exc:
            error = describe(exc)
            if error.kind is ErrorKind.UNIQUE_VIOLATION and again < _UNIQUE_RETRIES:
                again += 1  # a key came back since the check: the batch sees it now
                continue
            again = 0
            if error.row_level and pages > 1:
                pages = max(1, pages // 2)  # the same place, half the pages
                continue
            if error.row_level:
                # One page: its rows one at a time, a row that cannot go back left.
                error = _one_by_one(conn, statement, archive, selection, page, progress,
                                    lock_timeout, statement_timeout)
                if error is None:
                    page = end
                    continue
            partial = _report(report, progress, started, False)
            log.warning("restore batch %d failed and was rolled back: %s",
                        progress.batch_no, error)
            raise RestoreBatchError(progress.batch_no, partial, error) from None
        again = 0
        progress.restored += row.restored
        progress.batches += 1 if row.restored else 0
        if row.selected:
            log.debug("restore batch %d moved %d of %d rows back", progress.batch_no,
                      row.restored, row.selected)
        page = end
        # The next range sized toward batch_size rows, growing at most twofold.
        pages = max(1, min(pages * 2, int(pages * batch_size / row.selected))
                    if row.selected else pages * 2)
    return False


def _check_selected(report: RestoreReport, rule: RetentionRule, target_table: str, policy: str,
                    selection: Selection, retention_days: int, allow_prunable: bool) -> None:
    """Refuse a restore that selects nothing, or prunable rows without ``allow_prunable``
    (:class:`RestoreError`, nothing moved); otherwise log what the restore will move."""
    pretend = report.pretend
    if not report.selected_rows:
        raise RestoreError(
            f"{target_table} holds no row of policy {policy} {selection}: "
            + ("an unknown run id, or a run that archived nothing (or whose rows were "
               "restored or are past the archive's retention)" if selection.run_id
               else "nothing was archived then") + "; nothing was moved", report)
    if report.prunable_rows and not allow_prunable and not pretend:
        raise RestoreError(
            f"{report.prunable_rows} of the {report.selected_rows} rows to restore are "
            f"prunable under the deployed rule ({rule.predicate_sql}, retention "
            f"{retention_days} days): the next run would delete them again. Correct the "
            f"policy first, or restore them anyway with --allow-prunable "
            f"(allow_prunable: true); nothing was moved", report)
    log.info("restore of policy %s, %s: %d archived rows, %d restorable, %d whose key "
             "exists in %s again, %d prunable%s", policy, selection, report.selected_rows,
             report.restorable_rows, report.key_exists_rows, rule.qualified_name,
             report.prunable_rows, " (pretend: nothing moved)" if pretend else "")


def _swallowed_error(engine: sa.Engine, rule: RetentionRule, target_table: str, batch_no: int,
                     swallowed: _Swallowed, partial: RestoreReport) -> RestoreError:
    """The error ending a restore whose batch ``batch_no`` the table's insert did not return
    whole (rolled back), naming the trigger or rule that took the rows away when there is
    one."""
    table, lost = rule.qualified_name, swallowed.moved - swallowed.restored
    try:
        with engine.connect() as conn:
            interceptor = insert_interceptor(conn, table)
    except sa.exc.DBAPIError:
        interceptor = None  # the message says what is known without it
    if interceptor is None:
        what = (f"something on {table} took {lost} of the {swallowed.moved} rows away from the "
                "insert")
        fix = "find what takes inserted rows away from it"
    elif interceptor.kind == "trigger":
        what = (f"its BEFORE INSERT trigger {interceptor.name!r} (function "
                f"{interceptor.function}) on {interceptor.relation} returned NULL for {lost} of "
                f"the {swallowed.moved} rows (sending them to another table, or dropping them)")
        fix = (f"ALTER TABLE {interceptor.relation} DISABLE TRIGGER {interceptor.quoted} for the "
               f"time of the restore (the rows then go back into {interceptor.relation} "
               "itself), then ENABLE it again")
    else:
        what = (f"its rule {interceptor.name!r} ON INSERT on {interceptor.relation} put other "
                f"statements in the place of the insert of {lost} of the {swallowed.moved} rows")
        fix = (f"ALTER TABLE {interceptor.relation} DISABLE RULE {interceptor.quoted} for the "
               "time of the restore, then ENABLE it again")
    message = (f"restore batch {batch_no} took {swallowed.moved} rows out of {target_table}, but "
               f"the insert into {table} returned only {swallowed.restored}: {what}, so the "
               f"restore cannot tell where they went. The batch was rolled back and its rows are "
               f"still in the archive ({partial.restored_rows} rows restored before stay "
               f"restored). Fix: {fix}, and run the restore again")
    log.warning("%s", message)
    return RestoreError(message, partial)


def _run_batch(conn: sa.Connection, statement: sa.Select, from_tid: str, to_tid: str,
               lock_timeout: dt.timedelta, statement_timeout: dt.timedelta) -> sa.Row:
    with conn.begin():
        limit_transaction(conn, lock_timeout=lock_timeout, statement_timeout=statement_timeout,
                          synchronous_commit=False)
        row = conn.execute(statement, {"from_tid": from_tid, "to_tid": to_tid}).one()
        if row.moved != row.restored:
            raise _Swallowed(row.moved, row.restored)  # rolls the batch back
        return row


def _one_by_one(conn: sa.Connection, statement: sa.Select, archive: Archive,
                selection: Selection, page: int, progress: _Progress,
                lock_timeout: dt.timedelta,
                statement_timeout: dt.timedelta) -> ErrorDescription | None:
    """The selection's rows of one archive ``page``, one address at a time, each in its own
    transaction; a row that fails on a row-level error stays in the archive, counted with its
    cause. Another error ends it: its description is returned (that row's transaction rolled
    back). In a partitioned archive one address holds a row in each partition: they go, or
    fail, together."""
    a = archive.table
    with conn.begin():
        items = conn.execute(
            sa.select(sa.cast(a.c.ctid, sa.Text),
                      sa.func.count(sa.distinct(a.c[archive.source_rule.key.name])))
            .where(*_selected(a, archive.target.policy, selection),
                   a.c.ctid >= _address("from_tid"), a.c.ctid < _address("to_tid"))
            .group_by(a.c.ctid).order_by(a.c.ctid),
            {"from_tid": f"({page},0)", "to_tid": f"({page + 1},0)"}).all()
    for address, rows in items:
        item = int(address.strip("()").split(",")[1])
        try:
            row = _run_batch(conn, statement, address, f"({page},{item + 1})", lock_timeout,
                             statement_timeout)
        except sa.exc.DBAPIError as exc:
            error = describe(exc)
            if not error.row_level:
                return error
            progress.failed += rows
            progress.causes[error.cause] = progress.causes.get(error.cause, 0) + rows
            continue
        progress.restored += row.restored
        progress.batches += 1 if row.restored else 0
    return None


def _report(start: RestoreReport, progress: _Progress, started: float,
            stopped: bool) -> RestoreReport:
    # Only restored rows leave the archive (the policy's pool keeps its runs away meanwhile).
    return RestoreReport(
        selected_rows=start.selected_rows, restored_rows=progress.restored,
        restorable_rows=start.restorable_rows,
        left_in_archive=start.selected_rows - progress.restored,
        key_exists_rows=start.key_exists_rows, prunable_rows=start.prunable_rows,
        failed_rows=progress.failed, failed_causes=tuple(progress.causes),
        batches=progress.batches, duration_s=time.monotonic() - started, stopped=stopped)


def _checked_archive(conn: sa.Connection, rule: RetentionRule,
                     target: ArchiveTarget) -> Archive:
    """The archive of ``target`` checked against ``rule``'s table, as a purge checks it.

    Raises:
        RestoreError: the archive does not exist or does not match the table.
        TableShapeError: the table is not one the rule can use.
    """
    check_table(conn, rule)
    source = table_columns(conn, rule.qualified_name) or ()
    existing = table_columns(conn, target.table)
    if existing is None:
        raise RestoreError(f"archive {target.table} does not exist: nothing to restore")
    archive = Archive(target, archive_table(target, source),
                      rule.with_columns([c.name for c in source]), source)
    try:
        check_archive(conn, archive, rule, existing)
    except ArchiveError as exc:
        raise RestoreError(f"cannot restore: {exc}") from None
    return archive


__all__ = ["RestoreReport", "Selection", "restore", "restore_statement"]
