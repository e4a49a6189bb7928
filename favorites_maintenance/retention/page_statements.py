"""The purge's statements in *page order*: the other way to walk a backlog spread over the whole
table (keyset order and what every form shares are :mod:`~favorites_maintenance.retention.
statements`). Each batch takes the prunable rows of a range of heap pages
(:func:`page_batch_statement`), read by a TID range scan in the order they lie on disk rather
than through the index in age order. Locking first::

    WITH retention_batch AS MATERIALIZED (
        SELECT array_agg(tid) AS tids, count(*) AS selected,
               min(tid) AS first_tid, max(tid) AS last_tid
          FROM (SELECT ctid AS tid FROM favorites.favorites
                 WHERE ctid > :after_tid AND ctid < :end_tid             -- '(block, offset)'
                   AND user_id IS NULL AND updated_at < :cutoff
                 LIMIT :batch_size                              -- in address order
                   FOR UPDATE SKIP LOCKED) AS retention_candidates),
    retention_deleted AS (
        DELETE FROM favorites.favorites
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND ctid = ANY (CAST((SELECT tids FROM retention_batch) AS tid[]))
        RETURNING 1)
    SELECT selected, (SELECT count(*) FROM retention_deleted), first_tid::text, last_tid::text
      FROM retention_batch

An optimistic batch is two statements in one transaction (:func:`page_bound_statement`, then
:func:`page_delete_statement`): the first counts the range's candidates up to the limit and
names the last one; the second deletes the prunable rows up to that address in place, which
are the rows counted unless another session changed the range in between (then the counts
differ and the loop takes the batch again, locking first).

- Each page is read once, in order, and the rows are deleted page after page: on the bench's
  backlog spread over the table a row costs about 0.55 us in page order against 0.7-1.6 us in
  keyset order, but every page is read, whether it holds a prunable row or not
  (``docs/benchmark.md``).
- ``LIMIT`` bounds the batch as in the keyset form, and ends the scan of the range there; the
  batch's last address is where the next one starts.
- The locking form's DELETE matches rows by address and the rule alone, not by key: the
  addresses are locked by this transaction and used within one statement. The guard and the
  cutoff are checked again on each row as it is deleted, on its newest version.
- The optimistic form behaves as the keyset one does: a row held by another session makes the
  DELETE wait at most the optimistic ``lock_timeout``, a row updated or deleted since it was
  counted is left, and the loop takes the batch again locking first.
- Rows that move while the run walks the table (an update writes the new version elsewhere,
  often behind the run's position) are left for the next run; the backlog measured after the
  run counts them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.statements import counted, removed_rows

if TYPE_CHECKING:
    from favorites_maintenance.retention.archive import Archive


class _Tid(sa.types.UserDefinedType):
    """PostgreSQL's ``tid``, a row address ``(block, offset)``: bound and read as its text."""

    cache_ok = True

    def get_col_spec(self, **kw) -> str:
        return "tid"


TID = _Tid()


def _page_range(rule: RetentionRule) -> list[sa.ColumnElement[bool]]:
    ctid = rule.table.c.ctid
    return [ctid > sa.cast(sa.bindparam("after_tid", type_=sa.String), TID),
            ctid < sa.cast(sa.bindparam("end_tid", type_=sa.String), TID)]


def _page_candidates(rule: RetentionRule, cutoff: dt.datetime) -> sa.Select:
    """The prunable rows' addresses in the range, at most ``:batch_size``: the first ones in
    address order, the order a TID range scan returns them in when it runs serially (the loop
    leaves the planner no other scan, and no parallel workers, for a page-order batch). No
    ``ORDER BY``: the scan then stops at the limit, while a sort would read the whole range
    (and, over a large range, make the planner choose a parallel scan of the whole table)."""
    return (sa.select(rule.table.c.ctid.label("tid"))
            .where(*_page_range(rule), rule.prunable(cutoff))
            .limit(sa.bindparam("batch_size", type_=sa.Integer, literal_execute=True)))


def page_batch_statement(rule: RetentionRule, cutoff: dt.datetime, lock_first: bool = True,
                         archive: Archive | None = None) -> sa.Select:
    """The counting batch statement in page order (see the module docstring): the prunable rows
    whose address lies after ``:after_tid`` and before ``:end_tid`` (``tid`` text, ``'(block,
    offset)'``), the first ``:batch_size`` (rendered inline) in address order.

    It returns one row: ``selected``, ``deleted``, ``first_tid`` and ``last_tid`` (the batch's
    first and last addresses as text, ``None`` when empty). ``lock_first=False`` gives its
    optimistic form. With ``archive``, the rows move into it (:func:`removed_rows`).

    Raises:
        InvalidArgumentError: ``cutoff`` is naive.
    """
    t = rule.table
    candidates = _page_candidates(rule, cutoff)
    if lock_first:
        candidates = candidates.with_for_update(skip_locked=True)
    inner = candidates.subquery("retention_candidates")
    batch = (
        sa.select(sa.func.array_agg(inner.c.tid).label("tids"),
                  sa.func.count().label("selected"),
                  sa.func.min(inner.c.tid).label("first_tid"),
                  sa.func.max(inner.c.tid).label("last_tid"))
        .cte("retention_batch").prefix_with("MATERIALIZED")
    )
    # One TID scan of the batch's sorted addresses; the cast keeps ANY() from reading the
    # subquery as a set of rows.
    addresses = sa.cast(sa.select(batch.c.tids).scalar_subquery(), ARRAY(TID))
    deleted = removed_rows(rule.delete_prunable(cutoff, t.c.ctid == sa.any_(addresses)), archive)
    return sa.select(
        batch.c.selected,
        sa.select(sa.func.count()).select_from(deleted).scalar_subquery().label("deleted"),
        sa.cast(batch.c.first_tid, sa.Text).label("first_tid"),
        sa.cast(batch.c.last_tid, sa.Text).label("last_tid"),
    ).select_from(batch)


def page_bound_statement(rule: RetentionRule, cutoff: dt.datetime) -> sa.Select:
    """The first statement of an optimistic batch in page order: how many prunable rows the
    range holds, up to ``:batch_size`` (the first ones in address order), and the first and
    last of their addresses. One row: ``selected``, ``first_tid``, ``last_tid`` (text, ``None``
    when none)."""
    inner = _page_candidates(rule, cutoff).subquery("retention_candidates")
    return sa.select(sa.func.count().label("selected"),
                     sa.cast(sa.func.min(inner.c.tid), sa.Text).label("first_tid"),
                     sa.cast(sa.func.max(inner.c.tid), sa.Text).label("last_tid"))


def page_delete_statement(rule: RetentionRule, cutoff: dt.datetime,
                          archive: Archive | None = None) -> sa.Delete | sa.Insert:
    """The second statement of an optimistic batch in page order: ``DELETE`` the prunable rows
    whose address lies after ``:after_tid`` and up to ``:last_tid``::

        DELETE FROM favorites.favorites
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND ctid > :after_tid AND ctid <= :last_tid

    Run in the same transaction as :func:`page_bound_statement`, just after it, it deletes the
    rows that statement counted, in place as a TID range scan reaches them, without collecting
    addresses or ``RETURNING`` anything (a third less time per row than
    :func:`page_batch_statement`); its row count is what it deleted. It re-checks the guard and
    the cutoff on each row's newest version, so a row another session claimed in between is
    left. When the counts differ (a row claimed, deleted or moved in between; one made prunable
    in between, which could take the batch past its limit), the loop rolls the batch back and
    takes it again locking first: no transaction commits more rows than the limit. With
    ``archive`` it moves those rows into the archive instead (:func:`counted`).
    """
    ctid = rule.table.c.ctid
    return counted(rule.delete_prunable(
        cutoff, ctid > sa.cast(sa.bindparam("after_tid", type_=sa.String), TID),
        ctid <= sa.cast(sa.bindparam("last_tid", type_=sa.String), TID)), archive)


def page_next_key_statement(rule: RetentionRule, cutoff: dt.datetime) -> sa.Select:
    """Lock and return the next candidate in page order (columns ``key``, ``age``, ``tid``; no
    row when the range holds none): a one-row batch in page order names its row first, as
    :func:`~favorites_maintenance.retention.statements.next_key_statement` does in keyset
    order. ``:after_tid`` and ``:end_tid`` are bound."""
    t = rule.table
    return (sa.select(rule.key.label("key"), rule.age.label("age"),
                      sa.cast(t.c.ctid, sa.Text).label("tid"))
            .where(*_page_range(rule), rule.prunable(cutoff))
            .order_by(t.c.ctid).limit(1)
            .with_for_update(skip_locked=True))


@dataclass(frozen=True)
class PageStatements:
    """The page-order statements of one run, built once before its first batch.

    Attributes:
        locking: the batch statement locking first (one statement).
        bound, delete: the two statements of an optimistic batch.
        next_key: the page-order next-key statement.
    """

    locking: sa.Select
    bound: sa.Select
    delete: sa.Delete | sa.Insert
    next_key: sa.Select

    @classmethod
    def build(cls, rule: RetentionRule, cutoff: dt.datetime,
              archive: Archive | None = None) -> PageStatements:
        """Build them for ``rule`` and ``cutoff`` (a timezone-aware UTC instant); ``archive``:
        where the batches move their rows (``None``: they are deleted)."""
        if archive is not None:
            rule = archive.source_rule
        return cls(locking=page_batch_statement(rule, cutoff, archive=archive),
                   bound=page_bound_statement(rule, cutoff),
                   delete=page_delete_statement(rule, cutoff, archive),
                   next_key=page_next_key_statement(rule, cutoff))
