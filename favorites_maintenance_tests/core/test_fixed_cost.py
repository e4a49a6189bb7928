"""What a run of a day's rows sends the database around its one batch: the fixed cost every
daily run pays, counted in statements (each a round trip, and a plan for the server)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from favorites_maintenance.retention.health import HealthLimits
from favorites_maintenance_tests.helpers.purging import purge_rows

UTC = dt.timezone.utc
OLD = dt.datetime(2020, 1, 1, tzinfo=UTC)
CUTOFF = dt.datetime(2024, 1, 1, tzinfo=UTC)


def statements_of_a_daily_run(engine, rows) -> tuple[list[str], object]:
    """A run at the job's default settings, its previous run's time per row known, on 50
    prunable rows and 20 account rows: the statements it sent, and its report."""
    rows.add_many(50, updated_at=OLD)
    sent: list[str] = []

    def record(conn, cursor, statement, params, context, executemany):
        sent.append(" ".join(statement.split()))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        report = purge_rows(engine, CUTOFF, batch_size=1000, batch_size_max=10_000,
                            target_batch_duration=dt.timedelta(milliseconds=200),
                            max_run_duration=dt.timedelta(minutes=1),
                            # One reading a run however slowly the machine runs (the default
                            # reads again after a second, which a loaded machine can take).
                            health=HealthLimits(check_every=dt.timedelta(minutes=1)),
                            previous_row_s=1e-6)
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    return sent, report


def test_a_run_of_a_days_rows_reads_its_session_and_table_in_few_statements(engine, rows):
    keep = set(rows.add_many(20, updated_at=OLD, user_id=7))
    sent, report = statements_of_a_daily_run(engine, rows)
    assert report.deleted_total == 50 and report.batches == 1 and rows.ids() == keep
    # Before the batch: the session (standby, replication role), the transaction's limits,
    # the table check, the table's facts and shape, the backlog's count, the health reading;
    # the batch: its limits, the count naming its last row, the DELETE, the shape check.
    # A batch that took over half its target (or a second after the run began: a loaded
    # machine) also asks who waits on its locks, once.
    waiters = [s for s in sent if "pg_blocking_pids" in s]
    assert len(waiters) <= 1 and len(sent) - len(waiters) == 10, sent


def test_without_a_publication_that_publishes_deletes_none_is_read(engine, rows):
    sent, report = statements_of_a_daily_run(engine, rows)
    assert report.deleted_total == 50
    assert not [s for s in sent if "pg_publication_rel" in s or "pg_publication_tables" in s]
