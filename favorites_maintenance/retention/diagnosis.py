"""Why a purge made no progress: rows the rule matches that it could not lock, or whose
deletes something swallowed.

A purge that locks no row at all asks :func:`check_zero_progress` whether every candidate is
held by another session (a backlog for the next run, fine) or the rule matches rows this role
cannot lock (row-level security without an UPDATE policy: a failure). A purge whose batches
delete far fewer rows than they selected fails with :func:`no_progress`'s error, which names the
mechanisms found on the table that can swallow deletes (row-level security, ``BEFORE DELETE``
triggers, DELETE rules): schema objects, never row values.
"""

from __future__ import annotations

import datetime as dt
import logging

import sqlalchemy as sa

from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.errors import ErrorKind, NoProgressError, describe
from favorites_maintenance.retention.report import PurgeReport
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.statements import (
    BEFORE_DELETE_TRIGGERS,
    DELETE_RULES,
    DELETE_TRIGGERS,
    REFERENCING_KEYS,
    REPEATABLE_READ,
    ROW_SECURITY,
    candidate_keys,
    count_of,
)

# The purge's log lines keep the purge's logger name, whichever module writes them.
log = logging.getLogger("favorites_maintenance.retention.purge")

#: Rows selected before a shortfall of deletes is judged mid-run (at least one full batch);
#: a run that ends sooner is judged at its end. A few rows swallowed at the head of the table
#: must not fail every run however small the batches.
NO_PROGRESS_SAMPLE = 1000

#: Why rows a batch selected were not deleted (a cause in ``PurgeReport.skipped_causes``).
SWALLOWED = ("deleted no row although it was locked (a BEFORE DELETE trigger returning NULL, or "
             "a row-level security DELETE policy narrower than the SELECT and UPDATE ones)")

#: A probe's lock met a row another session holds, or one changed since its snapshot.
_HELD_KINDS = frozenset({ErrorKind.LOCK_NOT_AVAILABLE, ErrorKind.SERIALIZATION_FAILURE})


def check_zero_progress(conn: sa.Connection, rule: RetentionRule, cutoff: dt.datetime,
                        report: PurgeReport, sample: int, batch_no: int = 0) -> None:
    """The purge locked no row: tell "every candidate is held by another session" (a backlog
    for the next run) from "the rule matches rows this role cannot lock" (a failure).

    One rolled-back ``REPEATABLE READ`` transaction, so both statements see one snapshot:
    count candidates without locking, then try to lock them ``NOWAIT``. A row held by another
    session makes the lock fail at once (55P03), one changed since the snapshot fails it with a
    serialization failure: fine, either way. No row visible: fine. Rows visible, none locked and
    no conflict: something filters them from ``FOR UPDATE`` (row-level security without an
    UPDATE policy): fail.

    Args:
        conn: the purge's connection, no transaction open.
        rule, cutoff: the purge's rule and cutoff (a timezone-aware UTC instant).
        report: the report of the run, carried by the error.
        sample: how many candidates to look at, rows (the run's first batch size).
        batch_no: the run's last batch, carried by the error.

    Raises:
        NoProgressError: candidates are visible and none is held by another session, yet none
            could be locked. A failure of the probe itself is logged, not raised.
    """
    ids = candidate_keys(rule, cutoff, sample)
    try:
        tx = conn.begin()
        try:
            conn.exec_driver_sql(REPEATABLE_READ)
            limit_transaction(conn)
            visible = conn.execute(count_of(ids)).scalar_one()
            if not visible:
                return
            try:
                locked = len(conn.execute(ids.with_for_update(nowait=True)).all())
            except sa.exc.DBAPIError as exc:
                if describe(exc).kind in _HELD_KINDS:
                    return  # held or changed by others: the backlog waits for the next run
                raise
        finally:
            tx.rollback()  # the probe's locks are released at once
    except sa.exc.DBAPIError as exc:
        log.warning("could not check why the purge locked no row: %s", describe(exc))
        return
    if locked:
        return  # released since the batch ran: the next run takes them
    raise no_progress(conn, rule, report, visible, locked_none=True,
                      at_least=visible >= sample, batch_no=batch_no)


def no_progress(conn: sa.Connection, rule: RetentionRule, report: PurgeReport, matched: int,
                *, locked_none: bool = False, at_least: bool = False,
                batch_no: int = 0) -> NoProgressError:
    """The :class:`NoProgressError` (logged at WARNING: the caller logs the run's failure;
    returned for the caller to raise) of a run that selected ``matched`` rows but deleted at
    most half of them by batch ``batch_no``, or, with ``locked_none``, whose rule matches
    ``matched`` unheld rows (``at_least``: that many or more) it could not lock. Names what on
    the table can swallow deletes (:func:`swallowing_mechanisms`)."""
    table = rule.qualified_name
    causes = swallowing_mechanisms(conn, table)
    if locked_none:
        what = (f"the rule matches {'at least ' if at_least else ''}{matched} rows of {table} "
                f"that no other session holds, yet the purge could lock none of them")
    else:
        what = (f"the batches selected {matched} rows of {table} but deleted only "
                f"{report.deleted_total}")
    found = f" Found on {table}: {'; '.join(causes)}." if causes else ""
    message = (f"{what}: something swallows the deletes, so the run is not a success.{found} "
               f"Likely causes: row-level security (SELECT ... FOR UPDATE also needs an UPDATE "
               f"policy for the job's role, and DELETE a DELETE policy: see "
               f"docs/production-databases.md); a BEFORE DELETE trigger that returns NULL; a rule "
               f"that does not fit the table.")
    log.warning("%s", message)
    return NoProgressError(message, report, tuple(causes), batch_no)


def swallowing_mechanisms(conn: sa.Connection, table: str) -> list[str]:
    """Row-level security, BEFORE DELETE row triggers and DELETE rules on ``table``
    (``schema.table``), named."""
    try:
        with conn.begin():
            rls = conn.execute(ROW_SECURITY, {"t": table}).first()
            triggers = conn.execute(BEFORE_DELETE_TRIGGERS, {"t": table}).scalars().all()
            rules = conn.execute(DELETE_RULES, {"t": table}).scalars().all()
    except sa.exc.DBAPIError as exc:
        log.warning("could not read the table's policies and triggers: %s", describe(exc))
        return []
    found = []
    if rls is not None and rls[0]:
        found.append(f"row-level security is enabled ({rls[2]} policies"
                     f"{', forced for the owner' if rls[1] else ''})")
    found += [f"BEFORE DELETE trigger {name}" for name in triggers]
    found += [f"DELETE rule {name}" for name in rules]
    return found


_ON_DELETE = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL",
              "d": "SET DEFAULT"}


def delete_work(conn: sa.Connection, table: str) -> str:
    """What deleting one row of ``table`` (``schema.table``) makes PostgreSQL do besides: the
    foreign keys referencing it, with their ``ON DELETE`` action, and its DELETE triggers,
    named (schema objects, never values); ``""`` when there is none or they cannot be read.
    Why a delete runs past ``statement_timeout`` is usually there (a cascade over many
    children, a child table without an index on its key, a slow trigger)."""
    try:
        with conn.begin():
            keys = conn.execute(REFERENCING_KEYS, {"t": table}).all()
            triggers = conn.execute(DELETE_TRIGGERS, {"t": table}).all()
    except sa.exc.DBAPIError as exc:
        log.warning("could not read what a delete from %s fires: %s", table, describe(exc))
        return ""
    parts = []
    if keys:
        parts.append("foreign keys " + ", ".join(
            f"{name} on {child} (ON DELETE {_ON_DELETE.get(action, action)})"
            for name, child, action in keys))
    if triggers:
        parts.append("DELETE triggers " + ", ".join(
            f"{name} ({function})" for name, function in triggers))
    return "; ".join(parts)
