"""A policy with ``max_parallel_partitions`` purges its range-partitioned table one partition
per step (dynamic outputs), on a real PostgreSQL table partitioned by month, through Dagster's
real executors: every prunable row of every partition deleted, every account row and every
recent row kept, each partition a step of its own (retried on its own), the run's figures
counted once, and a run with nothing to purge still materializing the asset.
"""

from __future__ import annotations

import datetime as dt
import os

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.config.policy import Policy, PolicyError
from favorites_maintenance.config.policy_settings import parse_policy_settings
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.pipeline.jobs import CLEANUP_EXECUTOR
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.daemon import step_processes
from favorites_maintenance_tests.helpers.jobs import failure_text, materialization
# The day the schedule would run now, as the partitioned table's rows are laid out around it.
from favorites_maintenance_tests.helpers.clock import YESTERDAY as PARTITION
from favorites_maintenance_tests.helpers.partitioned import (
    ASSET_KEY,
    BATCH,
    JOB,
    NODE,
    OLD_MONTHS,
    POLICY,
    add_rows,
    erasure_log,
    monthly_table,
    partitioned_defs,
    partitioned_job,
    partitioned_policy,
    partitions_of,
    retries,
    snapshot,
    spread,
)
from favorites_maintenance_tests.helpers.sessions import kill_when

UTC = dt.UTC


@pytest.fixture
def monthly(engine, db_url, monkeypatch):
    """The table partitioned by month, and the environment the job reads (see
    :func:`monthly_table`)."""
    return monthly_table(engine, db_url, monkeypatch)


def step_keys(events, event_type: str) -> list[str]:
    return [e.step_key for e in events if e.event_type_value == event_type]


def purge_steps(keys) -> set[str]:
    """The partitions named by ``purge_partition`` step keys."""
    prefix = f"{NODE}.purge_partition["
    return {k[len(prefix):-1] for k in keys if k.startswith(prefix)}


def test_the_partition_steps_run_on_the_multiprocess_executor_and_delete_only_prunable_rows(
        monthly):
    engine, _ = monthly
    # Three partitions to purge: one more than may run at once, each step a Python process of
    # its own (seconds each).
    before = spread(engine, old_months=3)
    holding = {name.removeprefix("favorites.") for name in partitions_of(engine,
                                                                         before["prunable"])}
    assert len(holding) == 3

    with dg.instance_for_test() as instance:
        with dg.execute_job(dg.reconstructable(partitioned_job), instance=instance,
                            tags={"dagster/partition": PARTITION}) as result:
            assert result.success
            run_id = result.run_id
            events = result.all_events
            [mat] = [e for e in events if e.event_type_value == "ASSET_MATERIALIZATION"]
            metadata = {k: v.value for k, v in
                        mat.event_specific_data.materialization.metadata.items()}
        processes = step_processes(instance, run_id)
        records = instance.all_logs(run_id, of_type={dg.DagsterEventType.STEP_START,
                                                     dg.DagsterEventType.STEP_SUCCESS})

    after = snapshot(engine)
    assert after["prunable"] == set()
    assert after["recent"] == before["recent"]
    assert after["accounts"] == before["accounts"]
    # One step per partition holding prunable rows, named by it; every step in its own process.
    assert purge_steps(step_keys(events, "STEP_SUCCESS")) == holding
    assert len(processes) == len(step_keys(events, "STEP_START"))
    assert os.getpid() not in processes
    # The run's figures, each row and batch counted once.
    assert metadata["deletedTotal"] == len(before["prunable"])
    assert metadata["batches"] == sum(-(-n // BATCH) for _, n in OLD_MONTHS[:3])
    assert metadata["backlogRemaining"] == 0
    assert metadata["stopReason"] == "exhausted"
    # Never more than max_parallel_partitions purge steps at once.
    assert max_overlap(records, f"{NODE}.purge_partition[") <= 2


def max_overlap(records, prefix: str) -> int:
    """The most steps whose key starts with ``prefix`` that had started and not yet succeeded
    at any event of ``records``."""
    running, most = 0, 0
    for record in sorted(records, key=lambda r: r.timestamp):
        if not (record.step_key or "").startswith(prefix):
            continue
        running += 1 if record.dagster_event.event_type == dg.DagsterEventType.STEP_START else -1
        most = max(most, running)
    return most


def logged_erasures(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT coalesce(sum(deleted), 0) FROM favorites.erasure_log")).scalar_one()


@pytest.mark.parametrize("parallel", ["2", None], ids=["partition_steps", "one_purge"])
def test_a_statement_trigger_on_the_table_sees_every_row_the_run_deletes(monthly, parallel):
    engine, _ = monthly
    before = spread(engine)
    erasure_log(engine)
    defs = partitioned_defs(max_parallel_partitions=parallel)

    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(JOB).execute_in_process(partition_key=PARTITION,
                                                              instance=instance)

    assert result.success
    assert snapshot(engine)["prunable"] == set()
    deleted = materialization(result, asset_key=ASSET_KEY)["deletedTotal"]
    assert deleted == len(before["prunable"])
    # The steps delete through the table, as the application's own DELETEs do: its statement
    # triggers see each of them.
    assert logged_erasures(engine) == deleted


def test_a_failing_partition_step_is_retried_alone_and_its_rows_counted_once(monthly):
    engine, _ = monthly
    before = spread(engine)
    failing = min(partitions_of(engine, before["prunable"]))  # the oldest month's
    # The second batch on that partition (its first row) fails once with a deadlock
    # (transient): its first batch stays committed, the step is retried and goes on from there.
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SEQUENCE favorites.deletes"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF nextval('favorites.deletes') = {BATCH + 1} THEN RAISE EXCEPTION "
            "'conflict' USING ERRCODE = '40P01'; END IF; RETURN OLD; END $$"))
        conn.execute(sa.text(f"CREATE TRIGGER fail_once BEFORE DELETE ON {failing} "
                             "FOR EACH ROW EXECUTE FUNCTION favorites.fail_once()"))
    key = failing.removeprefix("favorites.")

    with dg.instance_for_test() as instance:
        result = partitioned_defs().resolve_job_def(JOB).execute_in_process(
            partition_key=PARTITION, instance=instance, run_config=retries(2),
            raise_on_error=False)

    assert result.success
    events = result.all_events
    assert step_keys(events, "STEP_UP_FOR_RETRY") == [f"{NODE}.purge_partition[{key}]"]
    restarted = step_keys(events, "STEP_RESTARTED")
    assert restarted == [f"{NODE}.purge_partition[{key}]"]
    # Every other step ran once.
    starts = step_keys(events, "STEP_START")
    assert len(starts) == len(set(starts))
    after = snapshot(engine)
    assert after["prunable"] == set()
    assert after["accounts"] == before["accounts"]
    assert after["recent"] == before["recent"]
    metadata = materialization(result, asset_key=ASSET_KEY)
    assert metadata["deletedTotal"] == len(before["prunable"])


@pytest.mark.parametrize("op", ["plan_partitions", "purge_partition"])
def test_retries_an_op_refuses_fail_it_before_it_plans_or_deletes(monthly, op):
    """A negative ``max_retries``, which Dagster's schema of the run config lets through, fails
    the op that reads it at its start, not once a transient error asks it."""
    engine, _ = monthly
    before = spread(engine, old_months=1)
    with dg.instance_for_test() as instance:
        result = partitioned_defs().resolve_job_def(JOB).execute_in_process(
            partition_key=PARTITION, instance=instance,
            run_config={"ops": {NODE: {"ops": {op: {"config": {"max_retries": -1}}}}}},
            raise_on_error=False)

    assert not result.success
    [failed] = step_keys(result.all_events, "STEP_FAILURE")
    assert failed.startswith(f"{NODE}.{op}")
    assert "greater than or equal to 0" in failure_text(result)
    assert snapshot(engine) == before


def test_a_run_with_nothing_to_purge_still_materializes_the_asset(monthly):
    engine, _ = monthly
    add_rows(engine, months_ago=20, guests=0, accounts=10)
    add_rows(engine, months_ago=1, guests=10, accounts=10)
    before = snapshot(engine)

    with dg.instance_for_test() as instance:
        result = partitioned_defs().resolve_job_def(JOB).execute_in_process(
            partition_key=PARTITION, instance=instance)

    assert purge_steps(step_keys(result.all_events, "STEP_START")) == set()
    metadata = materialization(result, asset_key=ASSET_KEY)
    assert metadata["deletedTotal"] == 0
    assert metadata["batches"] == 0
    assert metadata["backlogRemaining"] == 0
    assert snapshot(engine) == before


def test_a_range_run_purges_every_partition_to_the_last_days_cutoff(monthly):
    engine, _ = monthly
    before = spread(engine)
    days = [(dt.datetime.now(UTC) - dt.timedelta(days=n)).date().isoformat()
            for n in (3, 2, 1)]

    with dg.instance_for_test() as instance:
        result = partitioned_defs().resolve_job_def(JOB).execute_in_process(
            instance=instance, tags={"dagster/asset_partition_range_start": days[0],
                                     "dagster/asset_partition_range_end": days[-1]})
        mats = {day: instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=ASSET_KEY, asset_partitions=[day]),
            limit=5).records for day in days}

    assert result.success
    assert snapshot(engine)["prunable"] == set()
    assert snapshot(engine)["accounts"] == before["accounts"]
    totals = [r.asset_materialization.metadata["deletedTotal"].value
              for records in mats.values() for r in records]
    assert len(totals) == len(days)
    assert sum(totals) == len(before["prunable"])  # on the last day, once


def test_a_table_that_is_not_partitioned_fails_the_run_before_any_delete(engine, db_url,
                                                                          monkeypatch, rows):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    old = rows.add(updated_at=dt.datetime.now(UTC) - dt.timedelta(days=500))

    with dg.instance_for_test() as instance:
        result = partitioned_defs().resolve_job_def(JOB).execute_in_process(
            partition_key=PARTITION, instance=instance, raise_on_error=False)

    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key == f"{NODE}.plan_partitions"
    assert ("favorites.favorites is not a partitioned table, but max_parallel_partitions is "
            "set") in failure_text(result)
    assert old in rows.ids()


def test_the_unpartitioned_graph_is_unchanged_and_the_partitioned_one_fans_out():
    defs = partitioned_defs()
    plain = defs.resolve_job_def("guest_favorites_cleanup_job")
    fanned = defs.resolve_job_def(JOB)
    assert {n.name for n in
            plain.graph.node_named("favorites__guest_favorites_cleanup").definition.nodes} == {
        "compute_cutoff", "purge", "measure_backlog"}
    assert {n.name for n in fanned.graph.node_named(NODE).definition.nodes} == {
        "compute_cutoff", "plan_partitions", "purge_partition", "collect_partitions",
        "measure_backlog"}
    assert plain.executor_def is CLEANUP_EXECUTOR
    assert fanned.executor_def.name == f"{POLICY}_partition_executor"


def test_the_setting_is_refused_with_an_archive_and_out_of_bounds():
    with pytest.raises(PolicyError, match="max_parallel_partitions and archive_table"):
        Policy(POLICY, GUEST_FAVORITES, parse_policy_settings(
            {"max_parallel_partitions": "2"}, {}), archive_table="favorites.archive")
    for bad in ("0", "65", "two"):
        with pytest.raises(ValueError, match="max_parallel_partitions"):
            parse_policy_settings({"max_parallel_partitions": bad}, {})
    assert not Policy(POLICY, GUEST_FAVORITES).purges_partitions


def test_a_run_of_the_partitioned_policy_holds_its_pools_once_whatever_its_steps(
        monthly, dagster_storage_url):
    """With the pools' run granularity, a run counts one slot of each pool its steps name: the
    partition steps do not queue behind each other, and a second run of the policy waits for
    the first (the policy's pool and the database's, limit 1 each)."""
    from favorites_maintenance_tests.helpers.daemon import pg_instance

    engine, _ = monthly
    spread(engine)
    policy = partitioned_policy()
    with pg_instance(dagster_storage_url, run_in_process=True) as instance:
        result = partitioned_defs().resolve_job_def(JOB).execute_in_process(
            partition_key=PARTITION, instance=instance)
        run = instance.get_run_by_id(result.run_id)
    assert set(run.run_op_concurrency.all_pools) == set(policy.pools)



def test_a_policy_file_declares_the_partitioned_shape_and_loads_without_a_database(
        monkeypatch):
    from favorites_maintenance_tests.helpers.policies import favorites_policy, policy_sandbox

    monkeypatch.delenv(DATABASE_URL_VAR, raising=False)
    with policy_sandbox(favorites_policy("monthly_yaml", max_parallel_partitions=3)) as sandbox:
        defs = sandbox.code_location()
    job = defs.resolve_job_def("monthly_yaml_cleanup_job")
    assert job.executor_def.name == "monthly_yaml_partition_executor"
    assert "purge_partition" in {
        n.name for n in job.graph.node_named("favorites__monthly_yaml_cleanup").definition.nodes}
    # The guest-favorites policy beside it keeps its graph and the location's executor.
    assert defs.resolve_job_def("guest_favorites_cleanup_job").executor_def is (
        CLEANUP_EXECUTOR)


#: The advisory lock the test holds while the run's third DELETE waits for it.


@pytest.mark.xdist_group("stop")
def test_terminating_a_run_of_the_partition_steps_ends_it_canceled(monthly):
    import signal
    import threading

    engine, _ = monthly
    before = spread(engine)
    # The first two DELETEs go through; every later one waits until the test opens the gate:
    # the steps are mid-purge when the run is stopped, however slowly the machine runs. The
    # wait is a sleep, not a lock: a lock wait would end at the batch's lock_timeout (2 s),
    # which a loaded machine can take to pass the interrupt on (the batch then failed on its
    # own, up for retry, and no step was left to stop); a sleep ends at the statement_timeout.
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SEQUENCE favorites.deletes"))
        conn.execute(sa.text("CREATE TABLE favorites.gate_open (opened boolean)"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.gate() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF nextval('favorites.deletes') > 2 THEN "
            "WHILE NOT EXISTS (SELECT FROM favorites.gate_open) LOOP "
            "PERFORM pg_sleep(0.05); END LOOP; END IF; RETURN NULL; END $$"))
        conn.execute(sa.text("CREATE TRIGGER gate BEFORE DELETE ON favorites.favorites "
                             "FOR EACH STATEMENT EXECUTE FUNCTION favorites.gate()"))
    gate = engine.connect()
    waiting_delete = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event = 'PgSleep'")
    finished, problems = threading.Event(), []

    with dg.instance_for_test() as instance:
        def wait_for(what: str, done) -> bool:
            # A generous bound, only so that a broken run fails the test instead of hanging.
            for _ in range(60_000):
                if done():
                    return True
                if finished.wait(0.01):
                    break
            problems.append(f"the run ended or timed out before {what}")
            return False

        def delete_waiting() -> bool:
            # A transaction reads pg_stat_activity once: each look is a transaction of its own.
            waiting = gate.execute(waiting_delete).scalar_one()
            gate.commit()
            return waiting > 0

        def stop_at_the_gate() -> None:
            try:
                if not wait_for("a third DELETE waited at the gate", delete_waiting):
                    return
                [run] = instance.get_runs(limit=1)
                instance.report_run_canceling(run)
                os.kill(os.getpid(), signal.SIGINT)
                # Once the executor has passed the interrupt on, it starts no further step.
                wait_for("the executor forwarded the interrupt", lambda: any(
                    "steps_interrupted" in r.dagster_event.engine_event_data.metadata
                    for r in instance.all_logs(run.run_id,
                                               of_type=dg.DagsterEventType.ENGINE_EVENT)))
            finally:
                gate.execute(sa.text("INSERT INTO favorites.gate_open VALUES (true)"))
                gate.commit()

        thread = threading.Thread(target=stop_at_the_gate, daemon=True)
        thread.start()
        try:
            with dg.execute_job(dg.reconstructable(partitioned_job), instance=instance,
                                tags={"dagster/partition": PARTITION}) as result:
                run_id = result.run_id
        finally:
            finished.set()
            thread.join()
            gate.close()
        status = instance.get_run_by_id(run_id).status
        events = [r.dagster_event for r in instance.all_logs(run_id) if r.dagster_event]

    assert not problems
    assert status == dg.DagsterRunStatus.CANCELED
    assert not [e for e in events if e.event_type_value == "ASSET_MATERIALIZATION"]
    assert f"{NODE}.collect_partitions" not in step_keys(events, "STEP_SUCCESS")
    after = snapshot(engine)
    assert 0 < len(after["prunable"]) < len(before["prunable"])
    assert after["accounts"] == before["accounts"] and after["recent"] == before["recent"]
    # Each stopped step recorded what it deleted, and each step that finished its partition
    # before the request its output: together, the rows gone.
    stopped = [e.event_specific_data.asset_observation.metadata for e in events
               if e.event_type_value == "ASSET_OBSERVATION"]
    finished = [e.event_specific_data.metadata for e in events
                if e.event_type_value == "STEP_OUTPUT"
                and e.step_key.startswith(f"{NODE}.purge_partition[")]
    assert stopped and all(m["stopReason"].value == "stop_requested" for m in stopped)
    assert all(m["stopReason"].value == "exhausted" for m in finished)
    assert sum(m["deletedTotal"].value for m in stopped + finished) == (
        len(before["prunable"]) - len(after["prunable"]))


def test_a_partition_step_whose_backend_is_killed_is_retried_and_counted_once(monthly):
    engine, _ = monthly
    before = spread(engine)
    failing = min(partitions_of(engine, before["prunable"]))
    # The second batch on that partition sleeps at its first row; its backend is then killed.
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SEQUENCE favorites.deletes"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.sleep_once() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF nextval('favorites.deletes') = {BATCH + 1} THEN PERFORM pg_sleep(60); "
            "END IF; RETURN OLD; END $$"))
        conn.execute(sa.text(f"CREATE TRIGGER sleep_once BEFORE DELETE ON {failing} "
                             "FOR EACH ROW EXECUTE FUNCTION favorites.sleep_once()"))
    with kill_when(engine) as killed, dg.instance_for_test() as instance:
        result = partitioned_defs().resolve_job_def(JOB).execute_in_process(
            partition_key=PARTITION, instance=instance, run_config=retries(2),
            raise_on_error=False)
    assert killed and result.success
    key = failing.removeprefix("favorites.")
    assert step_keys(result.all_events, "STEP_UP_FOR_RETRY") == [
        f"{NODE}.purge_partition[{key}]"]
    after = snapshot(engine)
    assert after["prunable"] == set() and after["accounts"] == before["accounts"]
    assert materialization(result, asset_key=ASSET_KEY)["deletedTotal"] == len(
        before["prunable"])
