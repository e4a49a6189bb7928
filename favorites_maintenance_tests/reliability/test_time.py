"""Time: the cutoff is one UTC instant whatever the process and session time zones, across
daylight saving changes and leap years, and never later than now minus the retention, now
being the database server's clock whatever this host's says."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import random
import subprocess
import sys
import textwrap
import time

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from favorites_maintenance_tests.helpers.dagster_internals import freeze_time

from favorites_maintenance.cli import main
from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.errors import InvalidArgumentError
from favorites_maintenance.retention.rule import compute_cutoff
from favorites_maintenance.testing import prunable_keys, prunable_rows
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.jobs import (
    TEST_PARTITIONS_START,
    guest_variable,
    load_code_location,
    run_partition,
)
from favorites_maintenance_tests.reliability.conftest import materialization, run_job

UTC = dt.timezone.utc
MICRO = dt.timedelta(microseconds=1)
# Process zone (TZ) and session zone (PGTZ) pairs: far east/west, half-hour offsets, DST.
ZONES = [("Pacific/Kiritimati", "Pacific/Pago_Pago"),
         ("America/St_Johns", "Asia/Kathmandu"), ("Europe/Berlin", "America/Los_Angeles")]
# The EU spring-forward day, an ordinary day and the EU fall-back day of 2026, in this order:
# each run also deletes what the previous partitions' runs had to keep.
PARTITIONS = ["2026-03-29", "2026-06-15", "2026-10-25"]

RUN_ONE = textwrap.dedent("""
    import json, sys, time
    import dagster as dg
    from favorites_maintenance.components.policy_tree import code_location
    job = code_location().resolve_job_def("guest_favorites_cleanup_job")
    out = {}
    with dg.instance_for_test() as instance:
        for partition in sys.argv[1:]:
            result = job.execute_in_process(partition_key=partition, instance=instance)
            [mat] = result.get_asset_materialization_events()
            meta = mat.materialization.metadata
            out[partition] = [meta["cutoff"].value, meta["deletedTotal"].value]
    print(json.dumps({"tzname": time.tzname, "runs": out}))
""")


def expected_cutoff(partition: str, days: int = 365) -> dt.datetime:
    end = dt.datetime.fromisoformat(partition).replace(tzinfo=UTC) + dt.timedelta(days=1)
    return end - dt.timedelta(days=days)


def seed_boundaries(url) -> dict[str, tuple[int, int, int]]:
    """For each partition: rows just older than, exactly at and just newer than its cutoff."""
    engine = create_engine(url)
    try:
        create_dev_schema(engine)
        rows = Rows(engine)
        return {p: (rows.add(updated_at=expected_cutoff(p) - MICRO),
                    rows.add(updated_at=expected_cutoff(p)),
                    rows.add(updated_at=expected_cutoff(p) + MICRO)) for p in PARTITIONS}
    finally:
        engine.dispose()


def test_the_cutoff_and_the_deleted_rows_are_the_same_in_every_process_and_session_zone(
        pg_server):
    procs, seeded = [], []
    for n, (process_zone, session_zone) in enumerate(ZONES):
        name = f"tz_{os.getpid()}_{n}"
        pg_server.drop_database(name)
        url = pg_server.ensure_database(name)
        seeded.append((name, url, seed_boundaries(url)))
        env = {**os.environ, "TZ": process_zone, "PGTZ": session_zone,
               DATABASE_URL_VAR: url.render_as_string(hide_password=False),
               # The policy's days start in January, before the first of PARTITIONS.
               guest_variable("partitions_start"): TEST_PARTITIONS_START.isoformat()}
        procs.append(subprocess.Popen([sys.executable, "-c", RUN_ONE, *PARTITIONS], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    try:
        outputs = []
        for proc, zones in zip(procs, ZONES):
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, (zones, err[-2000:])
            outputs.append(json.loads(out.strip().splitlines()[-1]))
        for (process_zone, _), output in zip(ZONES, outputs):
            if process_zone != "UTC":
                assert output["tzname"][0] != "UTC"  # the zone really applied
            for partition, expected_deleted in zip(PARTITIONS, (1, 3, 3)):
                cutoff, deleted = output["runs"][partition]
                assert dt.datetime.fromisoformat(cutoff) == expected_cutoff(partition)
                assert deleted == expected_deleted, (process_zone, partition)
        for name, url, boundaries in seeded:
            engine = create_engine(url)
            try:
                with engine.connect() as conn:
                    left = set(conn.exec_driver_sql("SELECT id FROM favorites.favorites")
                               .scalars())
            finally:
                engine.dispose()
            # Just older: deleted; exactly at and just newer: kept. In every zone.
            older, at, newer = boundaries[PARTITIONS[-1]]
            assert left == {at, newer}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for name, _, _ in seeded:
            pg_server.drop_database(name)


def test_the_cutoff_of_a_run_is_anchored_in_utc_when_the_zone_changes_in_process(
        db_url, monkeypatch):
    # Half-hour daylight saving, changed after Dagster and the package were imported.
    monkeypatch.setenv("TZ", "Australia/Lord_Howe")
    time.tzset()
    try:
        with dg.instance_for_test() as instance:
            for partition in PARTITIONS:
                result = run_job(db_url, instance, partition=partition, monkeypatch=monkeypatch)
                assert materialization(result)["cutoff"] == expected_cutoff(partition).isoformat()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.mark.parametrize("now, days, expected", [
    # Days are 24-hour periods on the UTC line: over a leap day, and on it.
    (dt.datetime(2028, 3, 1, tzinfo=UTC), 1, dt.datetime(2028, 2, 29, tzinfo=UTC)),
    (dt.datetime(2028, 3, 1, tzinfo=UTC), 365, dt.datetime(2027, 3, 2, tzinfo=UTC)),
    (dt.datetime(2029, 3, 1, tzinfo=UTC), 366, dt.datetime(2028, 2, 29, tzinfo=UTC)),
    (dt.datetime(2028, 2, 29, 12, tzinfo=UTC), 365, dt.datetime(2027, 3, 1, 12, tzinfo=UTC)),
    # Across US and EU daylight saving changes, given in local wall-clock time.
    (dt.datetime(2026, 3, 8, 3, 30, tzinfo=dt.timezone(dt.timedelta(hours=-4))), 1,
     dt.datetime(2026, 3, 7, 7, 30, tzinfo=UTC)),
    (dt.datetime(2026, 10, 25, 2, 30, tzinfo=dt.timezone(dt.timedelta(hours=1))), 1,
     dt.datetime(2026, 10, 24, 1, 30, tzinfo=UTC)),
])
def test_days_are_exact_on_the_utc_line(now, days, expected):
    assert compute_cutoff(now, days) == expected


def test_a_cutoff_later_than_now_minus_the_retention_is_impossible():
    rng = random.Random(20261130)
    base = dt.datetime(2026, 11, 30, tzinfo=UTC)
    for _ in range(5000):
        now = base + dt.timedelta(seconds=rng.uniform(-4e8, 4e8))
        days = rng.choice([1, 7, 30, 365, 366, 1000])
        end = now + dt.timedelta(seconds=rng.uniform(-4e8, 4e8))
        zone = dt.timezone(dt.timedelta(minutes=rng.randrange(-12 * 60, 14 * 60, 15)))
        cutoff = compute_cutoff(now.astimezone(zone), days, end.astimezone(zone))
        assert cutoff <= now - dt.timedelta(days=days)
        assert cutoff.utcoffset() == dt.timedelta(0)


def test_a_run_of_the_latest_partition_never_cuts_later_than_now_minus_the_retention(
        db_url, monkeypatch):
    partition = dg.DailyPartitionsDefinition(start_date="2026-01-01").get_last_partition_key()
    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, partition=partition, monkeypatch=monkeypatch,
                         retention_days=30)
        after = dt.datetime.now(UTC)
    cutoff = dt.datetime.fromisoformat(materialization(result)["cutoff"])
    assert cutoff <= after - dt.timedelta(days=30)
    assert cutoff == expected_cutoff(partition, 30)


def database_now(engine) -> dt.datetime:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one().astimezone(UTC)


def test_a_host_clock_30_days_ahead_deletes_no_row_younger_than_the_retention(
        db_url, engine, rows, monkeypatch):
    """A VM cloned from a template, a host not yet synchronised: the job's process is 30 days
    ahead of the database, whose clock wrote the rows' ages. The schedule runs the day before
    the host's "today"; the run still keeps every row younger than 365 days by the database's
    clock, its checks, dry-run and the testing helper agree, and the run's log and dry-run say
    that the clocks differ."""
    before = database_now(engine)
    host_now = before + dt.timedelta(days=30)
    young = set(rows.add_many(10, updated_at=before - dt.timedelta(days=350)))  # 380 by the host
    old = set(rows.add_many(5, updated_at=before - dt.timedelta(days=366)))
    accounts = set(rows.add_many(3, updated_at=before - dt.timedelta(days=900), user_id=7))
    defs = load_code_location(db_url, monkeypatch)
    partition = (host_now - dt.timedelta(days=1)).date().isoformat()

    with dg.instance_for_test() as instance, freeze_time(host_now):
        # A policy's test that gives no now gets the job's: the database's.
        keys_before = prunable_keys("guest_favorites", engine)
        with pytest.raises(InvalidArgumentError, match="give now, or the database"):
            prunable_rows("guest_favorites")
        result = run_partition(defs, instance, partition, raise_on_error=False)
        warnings = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.level == logging.WARNING and "clock" in e.user_message]
        dry = CliRunner().invoke(main, ["dry-run"], env={
            DATABASE_URL_VAR: sa.make_url(db_url).render_as_string(hide_password=False)})
    after = database_now(engine)

    assert sorted(keys_before) == sorted(old)
    assert result.success
    assert rows.ids() == young | accounts and not old & rows.ids()
    meta = materialization(result)
    cutoff = dt.datetime.fromisoformat(meta["cutoff"])
    assert before - dt.timedelta(days=365) <= cutoff <= after - dt.timedelta(days=365)
    assert meta["deletedTotal"] == 5
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["no_guest_row_older_than_retention_plus_one_day"].passed
    # compute_cutoff and the SLO check each read the clock, and each says so.
    assert warnings and all("is 30 days 0 h ahead of the database server's" in w
                            for w in warnings)
    assert dry.exit_code == 0, dry.output
    assert "prunable   0 rows" in dry.stdout
    assert "warning: this host's clock" in dry.stderr and "30 days 0 h ahead" in dry.stderr
