"""The op graph run through Dagster against a real PostgreSQL: rows, metadata, logs."""

from __future__ import annotations

import datetime as dt
import os
import time


import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance_tests.conftest import slow_batches
from favorites_maintenance_tests.helpers.clock import CUTOFF, PARTITION
from favorites_maintenance_tests.helpers.jobs import (
    ASSET_KEY,
    JOB,
    failure_text,
    load_code_location,
    materialization,
    run_partition,
    step_failure,
)

UTC = dt.timezone.utc
SENTINEL_NOTE = "SENTINEL-NOTE-6f1c"
SENTINEL_ANON = "5e171ae1-0000-4000-8000-5e171ae15e17"
MICRO = dt.timedelta(microseconds=1)


@pytest.fixture
def defs(db_url, monkeypatch):
    return load_code_location(db_url, monkeypatch, retention_days=365, batch_size=1000)


def test_a_run_deletes_the_prunable_rows_and_records_what_it_did(defs, rows):
    old_guests = rows.add_many(1500, updated_at=CUTOFF - dt.timedelta(days=40))
    just_older = rows.add(updated_at=CUTOFF - MICRO, note=SENTINEL_NOTE,
                          anonymous_id=SENTINEL_ANON)
    at_cutoff = rows.add(updated_at=CUTOFF, note=SENTINEL_NOTE, anonymous_id=SENTINEL_ANON)
    accounts = set(rows.add_many(200, updated_at=CUTOFF - dt.timedelta(days=900), user_id=9))
    fresh = set(rows.add_many(100, updated_at=CUTOFF + dt.timedelta(days=200)))

    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION)
        assert result.success
        meta = materialization(result)
        logs = "\n".join(str(e.user_message) + repr(e.dagster_event)
                         for e in instance.all_logs(result.run_id))

    assert rows.ids() == accounts | fresh | {at_cutoff}
    assert just_older not in rows.ids() and not set(old_guests) & rows.ids()
    assert meta["deletedTotal"] == 1501
    assert meta["batches"] == 2
    assert meta["backlogRemaining"] == 0
    assert meta["cutoff"] == CUTOFF.isoformat()
    assert meta["retentionDays"] == 365
    assert meta["batchSize"] == 1000
    assert meta["stopReason"] == "exhausted"
    assert isinstance(meta["durationMs"], int) and meta["durationMs"] >= 0
    assert "run started" in logs and "run completed" in logs
    assert SENTINEL_NOTE not in logs and SENTINEL_ANON not in logs


def test_an_old_partition_deletes_a_subset_of_what_a_newer_one_would(defs, rows):
    older_cutoff = dt.datetime(2026, 3, 2, tzinfo=UTC) - dt.timedelta(days=365)
    before_old = rows.add(updated_at=older_cutoff - dt.timedelta(hours=1))
    between = rows.add(updated_at=older_cutoff + dt.timedelta(days=10))

    with dg.instance_for_test() as instance:
        old_run = run_partition(defs, instance, "2026-03-01")
        assert materialization(old_run)["deletedTotal"] == 1
        assert rows.ids() == {between}
        new_run = run_partition(defs, instance, PARTITION)
        assert materialization(new_run)["deletedTotal"] == 1
    assert before_old not in rows.ids() and rows.ids() == set()


def test_an_empty_table_records_a_successful_empty_run(defs):
    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION)
        meta = materialization(result)
        messages = [e.user_message for e in instance.all_logs(result.run_id)
                    if not e.dagster_event]
    assert result.success
    assert (meta["deletedTotal"], meta["batches"], meta["backlogRemaining"]) == (0, 0, 0)
    # The log agrees with `batches` 0: no batch line, one "nothing to delete".
    assert (f"nothing to delete: no guest row older than {CUTOFF.isoformat()} that no other "
            "session holds") in messages
    assert not [m for m in messages if m.startswith("batch ")]


def test_max_run_duration_leaves_a_backlog_and_still_succeeds(db_url, monkeypatch, rows,
                                                              engine):
    # The shortest budget a policy may have (PT1S), and a first batch that outlasts it.
    defs = load_code_location(db_url, monkeypatch, batch_size=10,
                              max_run_duration=dt.timedelta(seconds=1))
    rows.add_many(50, updated_at=CUTOFF - dt.timedelta(days=1))
    with slow_batches(engine, 1.5), dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION)
        meta = materialization(result)
    assert result.success
    assert meta["stopReason"] == "max_run_duration"
    assert meta["backlogRemaining"] == 50 - meta["deletedTotal"] > 0


def test_a_run_with_nothing_to_delete_records_no_pause_for_a_running_vacuum(
        db_url, monkeypatch, rows, engine, slow_vacuum):
    defs = load_code_location(db_url, monkeypatch, retention_days=365,
                              max_pause=dt.timedelta(seconds=1))
    rows.add_many(20, updated_at=CUTOFF + dt.timedelta(days=1))  # guest rows, none expired
    start_vacuum, end_vacuum = slow_vacuum
    start_vacuum()
    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION)
        meta = materialization(result)
    end_vacuum()
    assert result.success
    assert (meta["deletedTotal"], meta["batches"], meta["stopReason"]) == (0, 0, "exhausted")
    # The VACUUM held no batch back: there was none to hold.
    assert (meta["pausedMs"], meta["throttledBy"]) == (0, "none")
    assert rows.count() == 20 + 5000


def test_a_missing_table_fails_the_run_naming_the_table(db_url, monkeypatch, engine):
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE favorites.favorites"))
    defs = load_code_location(db_url, monkeypatch)
    with dg.instance_for_test() as instance:
        result = run_partition_raising(defs, instance)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key.endswith("purge")
    # Checked before the first batch, and named.
    assert "TableShapeError" in str(failure.event_specific_data.error)
    assert "table favorites.favorites does not exist" in str(failure.event_specific_data.error)


def run_partition_raising(defs, instance):
    job = defs.resolve_job_def(JOB)
    return job.execute_in_process(partition_key=PARTITION, instance=instance,
                                  raise_on_error=False)


def test_a_run_without_a_partition_is_refused_before_any_delete(defs, rows):
    """A run launched without a day (``execute_in_process`` with no partition key, as ``demo``
    did for a policy whose partitions start today) could record neither its materialization
    nor its checks: it fails before reading the database, and nothing is deleted."""
    old = set(rows.add_many(40, updated_at=CUTOFF - dt.timedelta(days=40)))
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(JOB).execute_in_process(instance=instance,
                                                              raise_on_error=False)
    assert not result.success
    step, _ = step_failure(result)
    assert step.endswith("compute_cutoff")
    message = failure_text(result)
    assert f"run {result.run_id} has no partition: " in message, message
    assert "guest_favorites's partitions (2026-01-01 to " in message, message
    assert "nothing was deleted" in message
    assert rows.ids() == old
    assert result.get_asset_materialization_events() == []


def test_a_launch_of_a_day_outside_the_partitions_is_refused_before_any_delete(
        db_url, rows, dagster_storage_url, monkeypatch):
    """The asset page's API launched with partition tags Dagster does not check (the implicit
    asset job, ``dagster/partition``): today (not a partition until it has ended), a
    single-run backfill's range ending today, a day before the first. Each run fails before
    reading the database, naming the day and the days there are; nothing is deleted or
    materialized."""
    from favorites_maintenance_tests.helpers.daemon import (
        code_location,
        launch_run,
        pg_instance,
        step_processes,
    )

    old = set(rows.add_many(40, updated_at=CUTOFF - dt.timedelta(days=40)))
    load_code_location(db_url, monkeypatch)  # the code server inherits these variables
    today = dt.datetime.now(UTC).date()
    yesterday = (today - dt.timedelta(days=1)).isoformat()
    today = today.isoformat()
    launches = [
        ({"dagster/partition": today}, f"partition {today} refused: {today} is not one"),
        ({"dagster/asset_partition_range_start": "2026-06-14",
          "dagster/asset_partition_range_end": today},
         f"partitions 2026-06-14...{today} refused: {today} is not one"),
        ({"dagster/partition": "2025-12-31"}, "partition 2025-12-31 refused"),
    ]
    # The first launch runs on the location's default executor, a process for the step, as
    # the asset page's; the others in the run's own process: the refusal is the op's, not the
    # executor's, and each step process costs an import of the whole code location.
    in_process = {"execution": {"config": {"in_process": {}}}}
    with pg_instance(dagster_storage_url, run_in_process=True) as instance, \
            code_location(instance) as workspace:
        for n, (tags, refused) in enumerate(launches):
            run_id = launch_run(workspace, "__ASSET_JOB", tags=tags, asset=list(ASSET_KEY.path),
                                run_config=in_process if n else None)
            assert len(step_processes(instance, run_id) - {os.getpid()}) == (0 if n else 1)
            assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
            [failure] = [e.dagster_event for e in instance.all_logs(run_id)
                         if e.dagster_event and e.dagster_event.event_type_value == "STEP_FAILURE"]
            assert failure.step_key.endswith("compute_cutoff")
            message = failure.event_specific_data.error.message
            assert refused in message, message
            assert f"guest_favorites's partitions (2026-01-01 to {yesterday}, each UTC day" \
                in message, message
            assert rows.ids() == old
        assert instance.fetch_materializations(ASSET_KEY, limit=1).records == []


def test_the_asset_is_daily_partitioned_and_run_by_the_job(defs):
    assets_def = defs.resolve_assets_def(ASSET_KEY)
    assert isinstance(assets_def.partitions_def, dg.DailyPartitionsDefinition)
    assert assets_def.partitions_def.timezone == "UTC"
    job = defs.resolve_job_def(JOB)
    assert "favorites__guest_favorites_cleanup" in [n.name for n in job.graph.node_defs]
    assert set(assets_def.node_def.node_dict) == {"compute_cutoff", "purge", "measure_backlog"}


def test_the_launchpad_shows_the_retry_settings_with_their_defaults_and_meaning(defs):
    """The run config schema the launchpad's editor offers for the ops that reach the
    database: both retry settings, their defaults, and what each one does."""
    ops = (defs.resolve_job_def(JOB).run_config_schema.config_type.fields["ops"].config_type
           .fields["favorites__guest_favorites_cleanup"].config_type.fields["ops"].config_type)
    for op in ("compute_cutoff", "purge"):
        fields = ops.fields[op].config_type.fields["config"].config_type.fields
        assert {name: field.default_value for name, field in fields.items()} == {
            "max_retries": 3, "retry_delay_seconds": 5.0}
        assert "transient database error" in fields["max_retries"].description
        assert "doubled at each retry" in fields["retry_delay_seconds"].description


def table_writes(engine) -> dict[str, tuple[int, int, int]]:
    """Rows inserted, updated and deleted per user table, as the statistics system saw them."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        return {f"{r.schemaname}.{r.relname}": (r.n_tup_ins, r.n_tup_upd, r.n_tup_del)
                for r in conn.execute(sa.text(
                    "SELECT schemaname, relname, n_tup_ins, n_tup_upd, n_tup_del "
                    "FROM pg_stat_user_tables"))}


def wait_for(engine, settled, seconds: float = 10) -> dict:
    deadline = time.monotonic() + seconds
    writes = table_writes(engine)
    while not settled(writes) and time.monotonic() < deadline:
        time.sleep(0.2)
        writes = table_writes(engine)
    return writes


def test_a_run_publishes_nothing_and_writes_no_other_table(defs, rows, engine):
    with engine.begin() as conn:  # an outbox a careless job might write to
        conn.execute(sa.text("CREATE TABLE favorites.outbox (id serial PRIMARY KEY, body text)"))
    rows.add_many(120, updated_at=CUTOFF - dt.timedelta(days=3))
    rows.add_many(30, updated_at=CUTOFF - dt.timedelta(days=3), user_id=5)
    engine.dispose()  # ended sessions flush their statistics
    before = wait_for(engine, lambda w: w["favorites.favorites"][0] == 150)
    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION)
        asset_events = [e.dagster_event for e in instance.all_logs(result.run_id)
                        if e.dagster_event and e.dagster_event.asset_key is not None]
    # The purge's sessions have ended with the run: their statistics are flushed.
    after = wait_for(engine, lambda w: w["favorites.favorites"][2] >= 120)
    changed = {t for t in after if after[t] != before.get(t)}
    assert changed == {"favorites.favorites"}
    ins, upd, dels = (a - b for a, b in zip(after["favorites.favorites"],
                                             before["favorites.favorites"]))
    assert (ins, upd, dels) == (0, 0, 120)
    assert {e.asset_key for e in asset_events} == {ASSET_KEY}


def test_the_batch_size_adapts_and_the_metadata_says_how_far_and_how_long_it_paused(
        db_url, rows, monkeypatch):
    # A generous target: every batch is well under it, so each doubles the next.
    defs = load_code_location(db_url, monkeypatch, retention_days=365, batch_size=100,
                              batch_size_max=400, target_batch_duration=dt.timedelta(seconds=5))
    rows.add_many(1000, updated_at=CUTOFF - dt.timedelta(days=3))
    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION)
        assert result.success
        meta = materialization(result)
    assert rows.count() == 0
    # 100 + 200 + 400, then 300 of a 400-row batch.
    assert (meta["deletedTotal"], meta["batches"]) == (1000, 4)
    assert (meta["batchSize"], meta["batchSizeFirst"], meta["batchSizeMax"]) == (100, 100, 400)
    assert meta["stopReason"] == "exhausted"
    assert (meta["pausedMs"], meta["throttledBy"], meta["healthUnreadable"]) == (0, "none", "none")
