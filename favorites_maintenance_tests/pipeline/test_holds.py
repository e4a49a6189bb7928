"""Holds in real runs of the job: the run's metadata counts the held rows (``heldRows``), never
their values, and the ``held_rows`` check says how many prunable rows are held and for how
long the oldest hold has stood."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.retention.holds import (
    HoldTable,
    create_hold_table,
    place_hold,
    release_hold,
)
from favorites_maintenance_tests.helpers.jobs import (
    JOB,
    load_code_location,
    materialization,
)

UTC = dt.timezone.utc
HOLDS = "favorites.retention_holds"
HELD = "held_rows"


def long_ago(days: float) -> dt.datetime:
    return dt.datetime.now(UTC) - dt.timedelta(days=days)


def run(db_url, monkeypatch, instance, **settings):
    job = load_code_location(db_url, monkeypatch, target_batch_duration=dt.timedelta(0),
                             **settings).resolve_job_def(JOB)
    yesterday = (dt.datetime.now(UTC) - dt.timedelta(days=1)).date().isoformat()
    result = job.execute_in_process(partition_key=yesterday, instance=instance)
    return result, {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_a_run_records_held_rows_apart_and_the_check_reports_the_oldest_hold(
        db_url, monkeypatch, engine, rows):
    create_hold_table(engine, HOLDS)
    # Holds on the visitor (anonymous_id), whose values must appear in no metadata or log.
    holds = HoldTable.define(HOLDS, "anonymous_id", "guest_favorites")
    visitors = ["7d0c3a51-1111-4abc-8def-0123456789ab", "7d0c3a51-2222-4abc-8def-0123456789ab"]
    rows.add_many(28, updated_at=long_ago(500))
    held = [rows.add(updated_at=long_ago(400), anonymous_id=v) for v in visitors]
    fresh = rows.add(updated_at=long_ago(10), anonymous_id=visitors[0])
    first = place_hold(engine, holds, visitors[0], reason="dispute", placed_by="support")
    place_hold(engine, holds, visitors[1], reason="regulator", placed_by="legal")
    place_hold(engine, holds, "7d0c3a51-3333-4abc-8def-0123456789ab", reason="no row",
               placed_by="support")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE favorites.retention_holds SET placed_at = now() - "
                             "interval '3 days' WHERE hold_id = :id"), {"id": first})
    settings = {"hold_table": HOLDS, "hold_column": "anonymous_id", "batch_size": 7}

    with dg.instance_for_test() as instance:
        result, checks = run(db_url, monkeypatch, instance, **settings)
        assert result.success
        metadata = materialization(result)
        assert (metadata["deletedTotal"], metadata["heldRows"], metadata["backlogRemaining"]) \
            == (28, 2, 0)
        check = checks[HELD]
        assert check.passed and check.severity == dg.AssetCheckSeverity.WARN
        figures = {k: v.value for k, v in check.metadata.items()}
        assert (figures["heldRows"], figures["activeHolds"]) == (2, 3)
        # The hold on a visitor without rows (a typo, or a row to come), counted, not named.
        assert figures["holdsMatchingNoRow"] == 1
        assert 3 * 86400 <= figures["oldestActiveHoldAgeSeconds"] < 3 * 86400 + 600
        logged = repr(metadata) + repr(figures) + "".join(
            repr(e) for e in instance.all_logs(result.run_id))
        assert "7d0c3a51" not in logged

        release_hold(engine, holds, first, released_by="support")
        again, checks = run(db_url, monkeypatch, instance, **settings)
        assert (materialization(again)["deletedTotal"], materialization(again)["heldRows"]) \
            == (1, 1)
        assert {k: v.value for k, v in checks[HELD].metadata.items()}["activeHolds"] == 2
    assert rows.ids() == {held[1], fresh}


def test_the_held_rows_check_counts_a_hold_written_otherwise_as_the_run_keeps_its_row(
        db_url, monkeypatch, engine, rows):
    """A hold an application wrote ``00<id>`` keeps the bigint ``<id>``'s row in the run: the
    ``held_rows`` check counts that row held, as the run's ``heldRows`` does."""
    create_hold_table(engine, HOLDS)
    rows.add_many(3, updated_at=long_ago(500))
    held = rows.add(updated_at=long_ago(400))
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {HOLDS} (policy, held_value, placed_by, reason) "
                             "VALUES ('guest_favorites', :v, 'app', 'case')"), {"v": f"00{held}"})
    with dg.instance_for_test() as instance:
        result, checks = run(db_url, monkeypatch, instance, hold_table=HOLDS)
        assert result.success
        assert (materialization(result)["deletedTotal"], materialization(result)["heldRows"]) \
            == (3, 1)
        assert {k: v.value for k, v in checks[HELD].metadata.items()}["heldRows"] == 1
    assert rows.ids() == {held}


def test_a_policy_without_a_hold_table_has_no_held_rows_check_nor_figure(
        db_url, monkeypatch, rows):
    rows.add_many(3, updated_at=long_ago(500))
    with dg.instance_for_test() as instance:
        result, checks = run(db_url, monkeypatch, instance)
    assert HELD not in checks and "heldRows" not in materialization(result)


def test_a_hold_the_hold_column_s_domain_refuses_fails_no_run_and_is_never_shown(
        db_url, monkeypatch, engine, rows):
    """``0`` is a bigint but not a ``case_no`` (its domain's CHECK wants more than 0): it
    covers no row, and the run and its checks go on, comparing the holds as text."""
    create_hold_table(engine, HOLDS)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE DOMAIN favorites.case_no AS bigint CHECK (VALUE > 0)"))
        conn.execute(sa.text("ALTER TABLE favorites.favorites ADD COLUMN case_no "
                             "favorites.case_no"))
    rows.add_many(5, updated_at=long_ago(500))
    held = rows.add(updated_at=long_ago(400))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE favorites.favorites SET case_no = 918273 WHERE id = :id"),
                     {"id": held})
        conn.execute(sa.text(f"INSERT INTO {HOLDS} (policy, held_value, placed_by, reason) "
                             "VALUES ('guest_favorites', '-918273', 'app', 'case')"))
    place_hold(engine, HoldTable.define(HOLDS, "case_no", "guest_favorites"), "918273",
               reason="dispute", placed_by="support")

    with dg.instance_for_test() as instance:
        result, checks = run(db_url, monkeypatch, instance, hold_table=HOLDS,
                             hold_column="case_no", batch_size=2)
        assert result.success
        metadata = materialization(result)
        assert (metadata["deletedTotal"], metadata["heldRows"]) == (5, 1)
        figures = {k: v.value for k, v in checks[HELD].metadata.items()}
        assert figures["activeHolds"] == 2 and "holdsMatchingNoRow" not in figures
        logged = repr(metadata) + repr(figures) + "".join(
            repr(e) for e in instance.all_logs(result.run_id))
        assert "is not a value of favorites.favorites.case_no" in logged
        assert "918273" not in logged
    assert rows.ids() == {held}
