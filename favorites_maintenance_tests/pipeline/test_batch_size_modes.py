"""An explicit batch size is the bound of every batch transaction; unset, the size adapts.

Each test runs ``guest_favorites_cleanup_job`` through Dagster against a real PostgreSQL whose
table carries an ``AFTER DELETE`` row trigger recording the deleting transaction's id, so the
rows of every committed transaction are counted by the server itself. The target time per
batch is the longest one (10 s): batches of a few milliseconds are then far under it, so the
adaptive size grows at every batch where it may, and never shrinks for a slow one; the test of
a slow table keeps the default 200 ms against rows that cost 2 ms each.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from dagster.components.testing import create_defs_folder_sandbox

import favorites_maintenance.defs
from favorites_maintenance.config.policy import run_limits_key
from favorites_maintenance.config.policy_settings import parse_policy_settings
from favorites_maintenance.pipeline.run_report import RunReport
from favorites_maintenance_tests.conftest import slow_batches
from favorites_maintenance_tests.helpers.clock import OLD, PARTITION
from favorites_maintenance_tests.helpers.jobs import (
    load_code_location,
    purge_retries,
    run_partition,
    run_report,
)
from favorites_maintenance_tests.helpers.resource_keys import LIMITS_KEY

UTC = dt.timezone.utc
#: Adaptation on, and no batch of this test near the target.
TARGET = dt.timedelta(seconds=10)
BATCH_SIZE_MAX_VAR = "FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX"


@pytest.fixture
def transactions(engine):
    """Rows deleted per transaction, in commit order: read after the run."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE favorites.deleted_by (txid bigint NOT NULL, seq bigserial)"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.record_delete() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO favorites.deleted_by (txid) VALUES (txid_current()); "
            "RETURN OLD; END $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER record_delete AFTER DELETE ON favorites.favorites "
            "FOR EACH ROW EXECUTE FUNCTION favorites.record_delete()"))

    def read() -> list[int]:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(
                "SELECT count(*) FROM favorites.deleted_by GROUP BY txid "
                "ORDER BY min(seq)")).scalars())

    return read


def run(db_url, monkeypatch, instance, launch: dict | None = None, **settings):
    defs = load_code_location(db_url, monkeypatch, retention_days=365, **settings)
    config = purge_retries(0)
    if launch is not None:
        config["resources"] = {LIMITS_KEY: {"config": launch}}
    return run_partition(defs, instance, PARTITION, run_config=config, raise_on_error=False)


@pytest.mark.parametrize("batch_size, rows_to_delete, expected", [
    # What an explicit batch size promises: at most that many rows in any transaction.
    (5, 50, [5] * 10),
    (1, 3, [1, 1, 1]),
    (1000, 2500, [1000, 1000, 500]),
])
def test_an_explicit_batch_size_bounds_every_transaction(
        db_url, monkeypatch, rows, transactions, batch_size, rows_to_delete, expected):
    old = set(rows.add_many(rows_to_delete, updated_at=OLD))
    accounts = set(rows.add_many(20, updated_at=OLD, user_id=7))
    with dg.instance_for_test() as instance:
        result = run(db_url, monkeypatch, instance, batch_size=batch_size,
                     target_batch_duration=TARGET)
        assert result.success
        report = run_report(result)
    assert transactions() == expected
    assert (report.batch_size_mode, report.batch_size, report.batch_size_max) == (
        "fixed", batch_size, batch_size)
    assert (report.deleted_total, report.batches) == (rows_to_delete, len(expected))
    assert rows.ids() == accounts and not old & rows.ids()


def test_batch_size_max_set_adapts_between_the_two(db_url, monkeypatch, rows, transactions):
    rows.add_many(1500, updated_at=OLD)
    with dg.instance_for_test() as instance:
        result = run(db_url, monkeypatch, instance, batch_size=100, batch_size_max=400,
                     target_batch_duration=TARGET)
        assert result.success
        report = run_report(result)
    sizes = transactions()
    # Fast batches grow the size (at most doubling) up to the max, and never past it.
    assert sizes == [100, 200, 400, 400, 400]
    assert (report.batch_size_mode, report.batch_size_first, report.batch_size_max) == (
        "capped", 100, 400)
    assert rows.count() == 0


def test_neither_set_adapts_from_the_default_first_size(db_url, monkeypatch, rows, transactions):
    # More rows than the largest batch: a smaller backlog, counted first, goes in one batch.
    rows.add_many(40_000, updated_at=OLD)
    accounts = set(rows.add_many(20, updated_at=OLD, user_id=7))
    with dg.instance_for_test() as instance:
        result = run(db_url, monkeypatch, instance, target_batch_duration=TARGET)
        assert result.success
        report = run_report(result)
        started = next(e.user_message for e in instance.all_logs(result.run_id)
                       if "run started" in (e.user_message or ""))
    # The run's first line announces the largest batch the run may reach, keyset order's.
    assert "adaptive: from 1000 up to 10000 rows (100000 in keyset order)" in started
    # Fast batches double from 1,000 rows; in keyset order past 10,000 (page order's max),
    # the target bounding them; the last one, of at most 32,000, takes what is left.
    assert transactions() == [1000, 2000, 4000, 8000, 16_000, 9000]
    assert (report.batch_size_mode, report.batch_size, report.batch_size_max) == (
        "adaptive", 1000, 32_000)
    assert report.scan_mode == "keyset"
    assert rows.ids() == accounts


def test_a_backlog_within_the_largest_batch_goes_in_one_batch_once_rows_are_known_cheap(
        db_url, monkeypatch, rows, transactions):
    rows.add_many(7000, updated_at=OLD)
    with dg.instance_for_test() as instance:
        first = run(db_url, monkeypatch, instance, target_batch_duration=TARGET)
        rows.add_many(7000, updated_at=OLD)  # the next day's backlog
        second = run(db_url, monkeypatch, instance, target_batch_duration=TARGET)
        assert first.success and second.success
    # Nothing known of the table: 1,000 rows first; at the rate they showed, the rest of the
    # backlog counted before the run fits in one more. The next run starts from the first's
    # time per row: the day's backlog is one transaction.
    assert transactions() == [1000, 6000, 7000]
    # The second run's first batch may take the largest batch: at the first run's time per
    # row, 10,000 rows are far within the target.
    assert run_report(first).ms_per_row > 0
    assert run_report(second).batch_size_first == 10_000
    assert rows.count() == 0


def test_a_slow_tables_first_batch_stays_within_the_budget_and_the_next_run_starts_small(
        db_url, engine, monkeypatch, rows, transactions):
    # 5,924 rows at 2 ms or more each: 12 s of deletes or more, four times the run's budget.
    rows.add_many(5924, updated_at=OLD)
    settings = dict(max_run_duration=dt.timedelta(seconds=3),
                    target_batch_duration=dt.timedelta(milliseconds=200))
    with slow_batches(engine, 0.002, per_row=True), dg.instance_for_test() as instance:
        first = run(db_url, monkeypatch, instance, **settings)
        second = run(db_url, monkeypatch, instance, **settings)
        assert first.success and second.success
        one, two = run_report(first), run_report(second)
    sizes = transactions()
    assert len(sizes) == one.batches + two.batches
    # Nothing known: 1,000 rows, not the whole backlog; after that, batches of the floor,
    # 100 rows (at 2 ms a row, 0.8 of 200 ms is 80 rows).
    assert sizes[0] == one.batch_size_first == 1000
    assert max(sizes[1:one.batches], default=0) <= 100
    assert one.ms_per_row >= 2.0
    # The next run sizes its first batch from that: 100 rows, as every later one.
    assert two.batch_size_first == 100 and max(sizes[one.batches:]) <= 100
    # Each run stops on its budget. Every row takes 2 ms or more: a run that deleted more than
    # 1,600 rows would have passed its 3 s by more than one 200 ms batch.
    assert one.stop_reason == two.stop_reason == "max_run_duration"
    assert one.deleted_total <= 1600 and two.deleted_total <= 1600
    assert one.deleted_total + two.deleted_total + two.backlog_remaining == 5924
    assert sum(sizes) == one.deleted_total + two.deleted_total


def test_a_zero_target_keeps_every_batch_at_batch_size_whatever_the_max(
        db_url, monkeypatch, rows, transactions):
    rows.add_many(700, updated_at=OLD)
    with dg.instance_for_test() as instance:
        result = run(db_url, monkeypatch, instance, batch_size=200, batch_size_max=1000,
                     target_batch_duration=dt.timedelta(0))
        assert result.success
        report = run_report(result)
    assert transactions() == [200, 200, 200, 100]
    assert report.batch_size_mode == "fixed"


def test_a_launch_batch_size_bounds_its_run(db_url, monkeypatch, rows, transactions):
    rows.add_many(1000, updated_at=OLD)
    with dg.instance_for_test() as instance:
        # The policy adapts (nothing set); the launch's batch size is explicit for its run.
        result = run(db_url, monkeypatch, instance, launch={"batch_size": 300},
                     target_batch_duration=TARGET)
        assert result.success
        report = run_report(result)
    assert transactions() == [300, 300, 300, 100]
    assert (report.batch_size_mode, report.batch_size, report.batch_size_max) == (
        "fixed", 300, 300)


def test_a_launch_may_lower_an_explicit_max_never_raise_it(
        db_url, monkeypatch, rows, transactions):
    old = set(rows.add_many(600, updated_at=OLD))
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            run(db_url, monkeypatch, instance, launch={"batch_size": 500}, batch_size=100,
                batch_size_max=400, target_batch_duration=TARGET)
        assert instance.get_runs() == []
        assert "batch_size=500 refused: it is above " \
               f"{BATCH_SIZE_MAX_VAR} (400 rows)" in str(refused.value)
        assert rows.ids() == old

        lowered = run(db_url, monkeypatch, instance, launch={"batch_size": 250},
                      batch_size=100, batch_size_max=400, target_batch_duration=TARGET)
        assert lowered.success
        assert run_report(lowered).batch_size_mode == "fixed"
    assert transactions() == [250, 250, 100]


def test_above_the_cap_of_one_policy_only_that_policys_launch_is_refused(
        db_url, monkeypatch, rows, transactions):
    # A second policy on the same table, capped at 400 rows; guest favorites has no cap.
    defs_folder = Path(favorites_maintenance.defs.__file__).parent
    old = set(rows.add_many(600, updated_at=OLD))
    with create_defs_folder_sandbox() as sandbox:
        (sandbox.defs_folder_path / "guest_favorites").mkdir()
        shutil.copy(defs_folder / "guest_favorites" / "defs.yaml",
                    sandbox.defs_folder_path / "guest_favorites")
        (sandbox.defs_folder_path / "capped_favorites").mkdir()
        (sandbox.defs_folder_path / "capped_favorites" / "defs.yaml").write_text(yaml.safe_dump(
            {"type": "favorites_maintenance.RetentionPolicy", "attributes": {
                "name": "capped_favorites", "table": "favorites.favorites", "key_column": "id",
                "age_column": "updated_at", "null_columns": ["user_id"],
                "batch_size": 100, "batch_size_max": 400, "partitions_start": "2026-01-01"}}))
        with sandbox.build_component_tree() as tree:
            defs = load_code_location(db_url, monkeypatch, tree=tree,
                                      target_batch_duration=TARGET)
    # Each policy has run limits of its own: the capped one's launch is refused before a run.
    limits = {"config": {"batch_size": 500}}
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            run_partition(defs, instance, PARTITION, job="capped_favorites_cleanup_job",
                          run_config={"resources": {run_limits_key("capped_favorites"): limits}})
        assert ("batch_size=500 refused: it is above policy capped_favorites, batch_size_max "
                "(400 rows)") in str(refused.value)
        assert instance.get_runs() == []
        assert rows.ids() == old

        guest = run_partition(defs, instance, PARTITION,
                              run_config={"resources": {LIMITS_KEY: limits},
                                          **purge_retries(0)})
        assert guest.success and run_report(guest).batch_size_mode == "fixed"
    assert transactions() == [500, 100]


def test_the_time_per_row_is_recorded_when_known_and_summed_by_rows():
    settings = parse_policy_settings({}, {})
    steps = [RunReport(deleted_total=100, batches=1, ms_per_row=2.0),
             RunReport(deleted_total=300, batches=1, ms_per_row=1.0),
             RunReport(deleted_total=0, batches=0)]
    combined = RunReport.combined(steps, cutoff="", settings=settings, duration_ms=0)
    # 100 rows at 2 ms and 300 at 1 ms: 1.25 ms a row.
    assert combined.as_metadata()["msPerRow"] == 1.25
    assert steps[1].after(steps[0]).ms_per_row == 1.25
    # No row deleted, or a reference to another day's record: no figure, no key.
    assert "msPerRow" not in steps[2].as_metadata()
    assert "msPerRow" not in combined.as_reference().as_metadata()
    assert RunReport.from_metadata(combined.as_metadata()) == combined
