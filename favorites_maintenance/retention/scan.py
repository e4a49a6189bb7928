"""The order a purge walks its backlog in: oldest first over the rule's index, or page order.

*Keyset order* (``keyset``) takes each batch from the partial index ``(<age>, <key>) WHERE
<guard>``, oldest rows first, past the previous batch's last ``(<age>, <key>)``. It reads only
prunable rows, so it suits a backlog that is a small part of the table (the day's worth of a
daily run), and it deletes the oldest rows first, which is what matters when a run cannot clear
its backlog within its time budget.

*Page order* (``page_order``) takes each batch from a range of heap pages, in the order the rows
lie on disk (a TID range scan, :func:`~favorites_maintenance.retention.page_statements.
page_batch_statement`). Each page is read once and the DELETE reaches its rows page after page:
on a backlog spread over the table a row costs less than in keyset order (about 0.55 us against
0.7 us, and keyset order's grows over a long run, to 1.6 us at 10 M rows), but every page of the
table is read, whether it holds a prunable row or not (``docs/benchmark.md`` has the figures).

:func:`choose_scan` picks one per run, before the first batch, from :class:`ScanEstimate` (read
by :func:`read_scan_estimate`): page order only when

- the table and the role allow it: not a partitioned table (row addresses repeat across
  partitions), a role that may read ``ctid``, no row-level security on the table (rows the role
  cannot read are found by keyset), PostgreSQL 14 or later (TID range scans);
- the table has at least :data:`PAGE_ORDER_MIN_PAGES` pages (below that a run takes
  milliseconds either way, and oldest first is kept);
- the backlog is large and spread: more rows than the run's largest batch (counted through
  the index), at least :data:`PAGE_ORDER_ROWS_PER_PAGE` prunable rows a page in a sample of the
  table's pages, and at least :data:`PAGE_ORDER_MIN_ROWS` rows by that sample (keyset order's
  batches slow down as a long run goes on; page order's do not);
- the run is expected to clear the whole backlog within its time budget, at the pessimistic
  costs :data:`PAGE_COST_S` and :data:`ROW_COST_S`: page order is not age order, and a run that
  stops early must have deleted the oldest rows.

While a run goes in page order, the loop checks again after each batch (from
:data:`PROJECT_AFTER_S` into the run) that the pages left will be read within the budget at the
pace so far, and goes on oldest first (keyset order) if not.

:class:`KeysetScan` and :class:`PageScan` hold a run's position in each order and give the
statement and parameters of its next batch; :class:`PageSpan` sizes page-order ranges.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.sql.util import ClauseAdapter

from favorites_maintenance.retention.page_statements import PageStatements
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.statements import BatchStatements, TableFacts, count_of


class ScanMode(enum.StrEnum):
    """The order a run walks its backlog in (metadata ``scanMode``)."""

    KEYSET = "keyset"
    """Oldest first, over the rule's partial index."""
    PAGE_ORDER = "page_order"
    """Ranges of heap pages, in the order the rows lie on disk."""


#: Prunable rows per heap page (sampled) from which page order is taken, for a large backlog
#: (:data:`PAGE_ORDER_MIN_ROWS`). Reading a page costs about 7 us whether it holds a prunable row
#: or not; deleting a row costs about 0.55 us in page order, and in keyset order 0.55 us at the
#: start of a run, growing as it goes on (to 0.93-1.1 us after 2 M rows). The bench
#: (``docs/benchmark.md``): at 22.7 rows a page on 10 M rows the two orders took the same time
#: (1.43-1.60 s keyset, 1.49-1.54 s page order), keyset order's time per row growing 1.7-fold
#: from the first tenth of the rows to the last where page order's stayed flat; the pages cost
#: page order about 0.5 us a row more at 15 a page, where keyset order would be quicker.
PAGE_ORDER_ROWS_PER_PAGE = 15

#: Prunable rows (sampled density times the table's pages) from which page order is taken: below
#: them keyset order's batches are done before they slow down. On 2 M rows, 415,760 prunable,
#: keyset order took 0.28-0.30 s and page order 0.33-0.35 s; on 10 M rows, 2,078,235 prunable,
#: 1.57-2.01 s against 1.65-2.03 s, keyset order's time per row growing from 0.56-0.79 us in
#: the first tenth of the rows to 1.08-1.57 us in the last, page order's flat in between.
PAGE_ORDER_MIN_ROWS = 1_000_000

#: How many heap pages the density of prunable rows is sampled from (``TABLESAMPLE SYSTEM``):
#: a few milliseconds, whatever the table's size.
SAMPLE_PAGES = 256

#: The smallest table, in heap pages (8 MiB of 8 KiB pages), walked in page order.
PAGE_ORDER_MIN_PAGES = 1024

#: Pessimistic costs of page order for the time-budget estimate: about three times those
#: measured on the bench's two-core machine (a page read and checked, a row deleted).
PAGE_COST_S = 25e-6
ROW_COST_S = 3e-6

#: From how far into a page-order run the pace so far is taken for a projection, seconds.
PROJECT_AFTER_S = 1.0

#: The most pages one page-order batch reads (64 MiB of 8 KiB pages): a range of pages holding
#: no prunable row is read in about 60 ms.
MAX_SPAN = 8192

#: The range of pages aims at holding this many times the batch's row limit: the limit ends
#: the scan where it is reached, so a range too large costs nothing, one too small a batch.
SPAN_AIM = 2.0

#: The most a range grows from one batch to the next (crossing pages with no prunable row).
SPAN_GROWTH = 4.0


@dataclass(frozen=True)
class ScanEstimate:
    """What :func:`choose_scan` decides from, read before the first batch.

    Attributes:
        blocks: the table's heap pages (its size over the block size); 0 when not read.
        backlog: prunable rows counted through the rule's index, up to ``cap`` (exact when
            below it).
        cap: where the count stopped (the run's largest batch); ``backlog >= cap`` means at
            least that many.
        density: prunable rows per page in a sample of the table's pages (``None`` when not
            sampled: page order refused, a small table, or a backlog counted whole).
        sampled: the pages the sample was drawn from, on average.
        refused: why page order is out for this table and role (``None``: allowed).
        lock_first: whether the run's first batch must lock its rows before deleting them, to
            prove at once that the role may lock what the rule matches (the form every batch
            falls back to): when the table has row-level security (``FOR UPDATE`` also needs
            an UPDATE policy) or the role holds no UPDATE privilege on any of its columns
            (``FOR UPDATE`` needs one). Otherwise nothing can refuse the lock that does not
            refuse the DELETE, and the first batch may be optimistic.
    """

    blocks: int
    backlog: int
    cap: int
    density: float | None = None
    sampled: float = 0.0
    refused: str | None = None
    lock_first: bool = True

    @property
    def counted_all(self) -> bool:
        """Whether :attr:`backlog` is the whole backlog."""
        return self.backlog < self.cap


def choose_scan(estimate: ScanEstimate, budget_s: float) -> tuple[ScanMode, str]:
    """The order of a run with ``estimate`` and ``budget_s`` seconds of time budget, and why
    (one sentence for the run's log and its ``scanReason``); see the module docstring."""
    if estimate.refused is not None:
        return ScanMode.KEYSET, f"keyset order: {estimate.refused}"
    blocks, backlog = estimate.blocks, estimate.backlog
    if blocks < PAGE_ORDER_MIN_PAGES:
        return ScanMode.KEYSET, (f"keyset order: the table has {blocks:,} pages, page order "
                                 f"from {PAGE_ORDER_MIN_PAGES:,}")
    if estimate.counted_all or estimate.density is None:
        return ScanMode.KEYSET, (f"keyset order: {backlog:,} prunable rows over {blocks:,} "
                                 f"pages")
    density = estimate.density
    sample = f"(a sample of {estimate.sampled:,.0f} of {blocks:,} pages)"
    if density < PAGE_ORDER_ROWS_PER_PAGE:
        return ScanMode.KEYSET, (
            f"keyset order: about {density:.2g} prunable rows a page {sample}, page order "
            f"from {PAGE_ORDER_ROWS_PER_PAGE}")
    rows = max(backlog, density * blocks)
    if rows < PAGE_ORDER_MIN_ROWS:
        return ScanMode.KEYSET, (
            f"keyset order: about {rows:,.0f} prunable rows ({density:.1f} a page {sample}), "
            f"page order from {PAGE_ORDER_MIN_ROWS:,}")
    needed = blocks * PAGE_COST_S + rows * ROW_COST_S
    if needed > budget_s:
        return ScanMode.KEYSET, (
            f"keyset order, oldest first: about {density:.1f} prunable rows a page {sample} "
            f"would take up to {needed:,.0f} s in page order, more than the run's "
            f"{budget_s:g} s")
    return ScanMode.PAGE_ORDER, (
        f"page order: about {density:.1f} prunable rows a page {sample}, up to "
        f"{needed:,.1f} s of the run's {budget_s:g} s")


def read_scan_estimate(conn: sa.Connection, rule: RetentionRule, cutoff: dt.datetime,
                       count_up_to: int, facts: TableFacts) -> ScanEstimate:
    """Read :class:`ScanEstimate` in the open transaction of ``conn``, from the table's
    ``facts`` (:func:`~favorites_maintenance.retention.statements.table_facts`): the backlog
    counted through the rule's index up to ``count_up_to`` rows (the run's largest batch in
    page order: a millisecond or so); and, when page order is allowed and the backlog is
    larger, the density of prunable rows in :data:`SAMPLE_PAGES` of the table's pages
    (``TABLESAMPLE SYSTEM``: a few milliseconds). The planner's estimate is not used: after a
    backlog is cleared the table's statistics still expect a year's backlog.

    Raises:
        sqlalchemy.exc.DBAPIError: as the statements do (the caller describes it).
    """
    if facts.shape is None:
        return ScanEstimate(blocks=0, backlog=0, cap=0, refused="no such table")
    blocks, row_security = facts.blocks, facts.row_security
    lock_first = row_security or not facts.may_lock
    refused = ("the table is partitioned (row addresses repeat across partitions)"
               if facts.partitioned
               else "the role may not read ctid" if not facts.ctid_readable
               else "the table has row-level security" if row_security
               else "PostgreSQL before 14 has no TID range scan" if facts.version < 140000
               else None)
    if row_security:
        # Rows this role may not read can make a read of them raise: the batches meet them
        # one by one and skip them (the count is only an estimate).
        return ScanEstimate(blocks=blocks, backlog=0, cap=0, refused=refused,
                            lock_first=lock_first)
    prunable = sa.select(sa.literal(1)).where(rule.prunable(cutoff))
    backlog = conn.execute(count_of(prunable.limit(count_up_to))).scalar_one()
    estimate = ScanEstimate(blocks=blocks, backlog=backlog, cap=count_up_to, refused=refused,
                            lock_first=lock_first)
    if refused is not None or blocks < PAGE_ORDER_MIN_PAGES or estimate.counted_all:
        return estimate
    percent = min(100.0, 100.0 * SAMPLE_PAGES / blocks)
    sample = sa.tablesample(rule.table, sa.func.system(sa.bindparam("pct", type_=sa.Float)),
                            name="retention_sample")
    # The rule's own predicate, on the sample's alias.
    found = conn.execute(sa.select(sa.func.count()).select_from(sample).where(
        ClauseAdapter(sample).traverse(rule.prunable(cutoff))), {"pct": percent}).scalar_one()
    sampled = blocks * percent / 100
    return dataclasses.replace(estimate, density=found / sampled, sampled=sampled)


def parse_tid(text: str) -> tuple[int, int]:
    """``'(block,offset)'`` -> ``(block, offset)``."""
    block, offset = text.strip("()").split(",")
    return int(block), int(offset)


class KeysetScan:
    """A run's position in keyset order: the last ``(<age>, <key>)`` deleted, or ``None``."""

    mode = ScanMode.KEYSET
    #: Whether a batch must read the table by row address only.
    tid_scans_only = False

    def __init__(self, statements: BatchStatements):
        self.statements = statements
        self.after: dict | None = None

    def batch(self, fast: bool, limit: int) -> tuple[sa.Select, dict]:
        """The next batch's statement (optimistic when ``fast``) and parameters."""
        return (self.statements.batch(keyset=self.after is not None, fast=fast),
                {**(self.after or {}), "batch_size": limit})

    def execute(self, conn: sa.Connection, statement: sa.Executable,
                params: dict) -> sa.Row | KeysetBatch:
        """Run the batch in the open transaction: the locking statement, or the optimistic
        pair (the bound, then the DELETE when there is a candidate). Returns ``selected``,
        ``deleted``, ``last_age``, ``last_key``."""
        if self.statements.locks(statement):
            return conn.execute(statement, params).one()
        keyset = self.after is not None
        bound = conn.execute(self.statements.bound(keyset=keyset), params).one()
        if not bound.selected:
            return KeysetBatch(0, 0, None, None)
        deleted = _deleted(conn.execute(statement, {
            **(self.after or {}), "last_age": bound.last_age, "last_key": bound.last_key}))
        return KeysetBatch(bound.selected, deleted, bound.last_age, bound.last_key)

    def next_key(self) -> tuple[sa.Select, dict]:
        """The next-key statement and parameters of a one-row batch."""
        return self.statements.next_key(keyset=self.after is not None), dict(self.after or {})

    def advance(self, row: sa.Row, limit: int, elapsed: float) -> bool:
        """Take a committed batch of ``limit`` rows; whether the backlog is walked to its end
        (the batch came back less than full)."""
        if row.selected < limit:
            return True
        self.after = {"after_age": row.last_age, "after_key": row.last_key}
        return False

    def skip(self, candidate) -> None:
        """Go on past the one-row batch's ``candidate`` (its ``key`` and ``age``)."""
        self.after = {"after_age": candidate.age, "after_key": candidate.key}

    def rates_batch(self, selected: int, limit: int) -> bool:
        """Whether a batch of ``limit`` rows that selected ``selected`` tells the batch size's
        rate: only a full one."""
        return selected >= limit


class PageSpan:
    """How many heap pages the next page-order batch reads.

    The range aims at :data:`SPAN_AIM` times the batch's row limit at the density of prunable
    rows the last batch met (rows per page), growing at most :data:`SPAN_GROWTH`-fold a batch,
    and, when batches aim at a target time, shrinking after a batch that took longer than it
    (a range with few prunable rows is read to its end).
    It stays between 1 and :data:`MAX_SPAN` pages. Pure: no database, no clock.

    Args:
        density: prunable rows per page expected at first.
        target_s: the time a batch aims at, seconds (0: no time rule).
    """

    def __init__(self, density: float, target_s: float = 0.0):
        self.density = max(density, 0.0)
        self.target_s = target_s
        self.last: int | None = None  # the last range's pages
        self.cap: float = MAX_SPAN  # the most the next range may have, after the last batch

    def pages(self, limit: int) -> int:
        """The pages of the next range for a batch of at most ``limit`` rows."""
        aimed = SPAN_AIM * limit / self.density if self.density > 0 else MAX_SPAN
        if self.last is not None:
            aimed = min(aimed, self.last * SPAN_GROWTH)
        self.last = int(min(MAX_SPAN, self.cap, max(1.0, math.floor(aimed))))
        return self.last

    def after_batch(self, selected: int, pages: int, elapsed: float) -> None:
        """Take a batch that found ``selected`` rows in ``pages`` pages in ``elapsed``
        seconds."""
        self.density = selected / max(pages, 1)
        self.cap = MAX_SPAN
        if self.target_s > 0 and elapsed > self.target_s:
            self.cap = max(1.0, pages * SPAN_AIM * self.target_s / elapsed)


def _deleted(result: sa.CursorResult) -> int:
    """What an optimistic batch's second statement removed: the row count of the plain DELETE
    or of the move into an archive."""
    return result.rowcount


@dataclass(frozen=True)
class KeysetBatch:
    """What an optimistic keyset batch did: rows counted and deleted, the last position
    counted (``None`` when none)."""

    selected: int
    deleted: int
    last_age: dt.datetime | None
    last_key: object


@dataclass(frozen=True)
class PageBatch:
    """What an optimistic page-order batch did: rows counted and deleted, the first and last
    address counted (text, ``None`` when none)."""

    selected: int
    deleted: int
    first_tid: str | None
    last_tid: str | None


class PageScan:
    """A run's position in page order: the address after which the next range starts.

    Args:
        statements: the run's page-order statements.
        blocks: the table's heap pages when the run began; the run ends past the last
            (pages added during the run hold rows written since, none of them prunable).
        span: sizes the ranges.
    """

    mode = ScanMode.PAGE_ORDER
    #: Whether a batch must read the table by row address only: its TID range scans then
    #: return the rows in address order, which the positions and the bound rely on.
    tid_scans_only = True

    def __init__(self, statements: PageStatements, blocks: int, span: PageSpan):
        self.statements = statements
        self.blocks = blocks
        self.span = span
        self.after = (0, 0)  # no row has offset 0: "after (b,0)" is "from block b"
        self.end = 0  # the block the open range ends before
        self.params: dict = {}  # the open batch's parameters

    @property
    def pages_done(self) -> int:
        """Pages walked so far."""
        return min(self.after[0], self.blocks)

    def _params(self, limit: int) -> dict:
        self.end = min(self.after[0] + self.span.pages(limit), self.blocks)
        if self.end <= self.after[0]:
            self.end = self.after[0] + 1
        return {"after_tid": f"({self.after[0]},{self.after[1]})",
                "end_tid": f"({self.end},0)", "batch_size": limit}

    def batch(self, fast: bool, limit: int) -> tuple[sa.Select | sa.Delete, dict]:
        """The next batch's statement (optimistic when ``fast``: its DELETE, which
        :meth:`execute` runs after its bound) and parameters."""
        self.params = self._params(limit)
        return (self.statements.delete if fast else self.statements.locking), self.params

    def next_key(self) -> tuple[sa.Select, dict]:
        """The next-key statement and parameters of the one-row batch :meth:`batch` prepared
        (the same range)."""
        return self.statements.next_key, {k: v for k, v in self.params.items()
                                          if k != "batch_size"}

    def execute(self, conn: sa.Connection, statement: sa.Executable,
                params: dict) -> sa.Row | PageBatch:
        """Run the batch in the open transaction: the locking statement, or the optimistic
        pair (the bound, then the DELETE when the range holds a prunable row). Returns
        ``selected``, ``deleted``, ``first_tid``, ``last_tid``."""
        if statement is self.statements.locking:
            return conn.execute(statement, params).one()
        bound = conn.execute(self.statements.bound, params).one()
        deleted = 0
        if bound.selected:
            deleted = _deleted(conn.execute(statement, {"after_tid": params["after_tid"],
                                                        "last_tid": bound.last_tid}))
        return PageBatch(bound.selected, deleted, bound.first_tid, bound.last_tid)

    def advance(self, row: sa.Row | PageBatch, limit: int, elapsed: float) -> bool:
        """Take a committed batch of ``limit`` rows; whether the last page is walked."""
        start = self.after[0]
        density_pages = self.end - start
        if row.selected >= limit:
            # The range held more than the limit: the next batch starts after its last row,
            # and the rows' own stretch of pages tells their density.
            self.after = last = parse_tid(row.last_tid)
            density_pages = last[0] - parse_tid(row.first_tid)[0] + 1
        else:
            self.after = (self.end, 0)
        self.span.after_batch(row.selected, density_pages, elapsed)
        return row.selected < limit and self.end >= self.blocks

    def skip(self, candidate) -> None:
        """Go on past the one-row batch's ``candidate`` (its ``tid``)."""
        self.after = parse_tid(candidate.tid)

    def rates_batch(self, selected: int, limit: int) -> bool:
        """Whether a batch tells the batch size's rate: ranges aim below the limit, so one that
        found at least a quarter of it does."""
        return selected * 4 >= limit
