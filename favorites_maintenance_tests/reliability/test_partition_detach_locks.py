"""The drop phase under locks, killed backends, concurrent runs, failures and stop requests:
a detach waits for the application's locks within ``lock_timeout`` and tries again, a detach
left pending is finished by the next run, a row that becomes one the rule keeps stays in the
table, and the rows detached are counted once whatever is retried. Runs of a policy's job
through ``execute_in_process``, and the drop phase itself, on a real server.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.retention import partition_phase, partitioned, table_partitions
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.local.guest_favorites import (
    create_partitioned_dev_schema,
    drop_dev_schema,
    month_starts,
)
from favorites_maintenance_tests.helpers.drop_phase import (
    APR,
    ASSET_KEY,
    FEB,
    JAN,
    JOB,
    MAR,
    MAY,
    NODE,
    UTC,
    defs,
    fill,
    log_lines,
    month,
    partitions_of,
    run,
)
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
    purge_retries,
    run_partition,
)
from favorites_maintenance_tests.helpers.partitioned import detached_from, detached_tables
from favorites_maintenance_tests.helpers.sessions import kill_when, run_concurrently
from favorites_maintenance_tests.reliability.conftest import CUTOFF, PARTITION


def test_a_lock_held_on_the_table_makes_the_detach_wait_and_try_again(table, rows, monkeypatch):
    monkeypatch.setattr(partition_phase, "LOCK_BACKOFF_S", 0.2)
    jan = rows.add_many(6, updated_at=month(1))
    account = rows.add(updated_at=month(2), user_id=3)
    released = threading.Event()
    waits: set[tuple] = set()

    def hold_until_the_second_attempt() -> None:
        # SHARE conflicts with the SHARE UPDATE EXCLUSIVE lock DETACH ... CONCURRENTLY takes.
        with table.connect() as holder:
            holder.execute(sa.text("LOCK TABLE ONLY favorites.favorites IN SHARE MODE"))
            with table.connect() as watcher:
                deadline = time.monotonic() + 60
                while len(waits) < 2 and time.monotonic() < deadline:
                    waits.update(watcher.execute(sa.text(
                        "SELECT pid, query_start FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND query LIKE 'ALTER TABLE%DETACH%'")
                    ).all())
                    watcher.rollback()
                    time.sleep(0.05)
            holder.rollback()
            released.set()

    thread = threading.Thread(target=hold_until_the_second_attempt, daemon=True)
    thread.start()
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
    thread.join(10)
    assert released.is_set() and len(waits) >= 2
    assert f"DETACH ... CONCURRENTLY of {JAN}: lock_timeout" in lines
    assert "attempt 1/5; again in 0.2 s" in lines
    assert f"partition {JAN} detached (6 rows)" in lines
    assert meta["partitionsDetached"] >= 1 and meta["deletedTotal"] == 6
    assert rows.ids() == {account} and set(jan).isdisjoint(rows.ids())


def january_alone_before_the_cutoff(db_url, engine, rows, monkeypatch) -> tuple[list[int], int]:
    """The table partitioned as January 2025, then one partition to 2027 (January alone lies
    before the cutoff), the job pointed at it: January's 8 guest rows' ids and the id of an
    account row in the next partition."""
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, [month(1, 1), month(2, 1),
                                           dt.datetime(2027, 1, 1, tzinfo=UTC)])
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    jan = rows.add_many(8, updated_at=month(1))
    return jan, rows.add(updated_at=month(1, 20) + dt.timedelta(days=30), user_id=5)


def test_a_detach_whose_backend_is_killed_is_finished_by_the_next_run(db_url, engine, rows,
                                                                      monkeypatch):
    jan, account = january_alone_before_the_cutoff(db_url, engine, rows, monkeypatch)
    # A reader whose snapshot predates the detach: DETACH ... CONCURRENTLY waits for it after
    # its first transaction committed, and is killed there.
    holder = create_engine(db_url).connect()
    holder.execute(sa.text("BEGIN ISOLATION LEVEL REPEATABLE READ"))
    holder.execute(sa.text("SELECT count(*) FROM favorites.favorites")).scalar_one()
    try:
        with dg.instance_for_test() as instance:
            with kill_when(engine, "SELECT pid FROM pg_stat_activity "
                           "WHERE wait_event_type = 'Lock' AND datname = current_database() "
                           "AND query LIKE 'ALTER TABLE%DETACH%CONCURRENTLY'") as killed:
                first = run(instance)
            assert first.success, failure_text(first)
            assert killed
            with engine.connect() as conn:
                [pending] = [p for p in table_partitions.leaf_partitions(
                    conn, "favorites", "favorites") if p.qualified_name == JAN]
            assert pending.detach_pending
            assert materialization(first, asset_key=ASSET_KEY)["partitionsDetached"] == 0
            holder.rollback()
            holder.close()
            second = run(instance)
            assert second.success, failure_text(second)
            meta = materialization(second, asset_key=ASSET_KEY)
            lines = log_lines(instance, second)
    finally:
        holder.close()
    assert meta["partitionsDetached"] == 1 and meta["deletedTotal"] == 8
    assert f"partition {JAN} detached (8 rows)" in lines and "FINALIZE" in lines
    assert JAN not in partitions_of(engine) and JAN in detached_from(engine)
    assert rows.ids() == {account} and set(jan).isdisjoint(rows.ids())


JUNE = "favorites.favorites_20250601"


def lock_until_a_wait_times_out(engine, table: str, pattern: str, timed_out: threading.Event,
                                *, hold_s: float = 30) -> None:
    """Hold ACCESS EXCLUSIVE on ``table``, as an application's migration would, until a
    session of the job waiting for it on a query like ``pattern`` stops waiting (its
    lock_timeout), or ``hold_s`` seconds."""
    with engine.connect() as holder, engine.connect() as watcher:
        holder.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        waited = False
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:
            waiting = watcher.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE :q"), {"q": pattern}).scalar_one() > 0
            watcher.rollback()
            if waited and not waiting:
                timed_out.set()
                break
            waited = waited or waiting
            time.sleep(0.02)
        holder.rollback()


def test_the_partition_read_gives_up_on_a_locked_partition_within_lock_timeout(table, rows):
    # Reading a partition's bounds (pg_get_expr) locks it: behind an application's ACCESS
    # EXCLUSIVE lock on one partition, the drop phase's read must give up within lock_timeout
    # and the step be retried, not wait for as long as the lock is held.
    made = fill(rows)
    timed_out = threading.Event()
    thread = threading.Thread(target=lock_until_a_wait_times_out, daemon=True,
                              args=(table, JUNE, "%pg_get_expr(c.relpartbound%", timed_out))
    thread.start()
    time.sleep(0.2)
    with dg.instance_for_test() as instance:
        result = run_partition(defs(), instance, PARTITION, job=JOB,
                               run_config=purge_retries(1, asset_key=ASSET_KEY),
                               raise_on_error=False)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
        retried = [e.step_key for e in result.all_events
                   if e.event_type_value == "STEP_UP_FOR_RETRY"]
    thread.join(10)
    assert timed_out.is_set() and retried == [f"{NODE}.purge"]
    assert "transient database error (lock_not_available)" in lines
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (4, 60)
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_a_plan_retried_after_its_drop_phase_still_counts_the_detached_rows(table, rows,
                                                                           monkeypatch):
    # The plan detaches January to May, then its look for partitions with prunable rows finds
    # June locked by the application past lock_timeout: the plan is retried, and the retry has
    # nothing left to detach. The first attempt's detached rows are still the run's.
    from favorites_maintenance.pipeline import partition_steps
    from favorites_maintenance_tests.helpers.partitioned import retries

    made = fill(rows)
    real = partition_steps.prunable_partitions
    calls = []

    def behind_a_lock_the_first_time(engine, rule, cutoff):
        calls.append(1)
        if len(calls) > 1:
            return real(engine, rule, cutoff)
        with table.connect() as holder:
            holder.execute(sa.text(f"LOCK TABLE {JUNE} IN ACCESS EXCLUSIVE MODE"))
            try:
                return real(engine, rule, cutoff)
            finally:
                holder.rollback()

    monkeypatch.setattr(partition_steps, "prunable_partitions", behind_a_lock_the_first_time)
    with dg.instance_for_test() as instance:
        result = run_partition(defs(max_parallel_partitions=2), instance, PARTITION, job=JOB,
                               run_config=retries(1), raise_on_error=False)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        retried = [e.step_key for e in result.all_events
                   if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(calls) == 2 and retried == [f"{NODE}.plan_partitions"]
    assert {JAN, MAR, APR, MAY}.isdisjoint(partitions_of(table))
    assert (meta["partitionsDetached"], meta["partitionsDropped"]) == (4, 0)
    assert meta["deletedTotal"] == 30 + 5 + 20 + 5
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_an_account_row_that_reaches_the_partition_after_the_check_stays_in_the_table(
        table, rows, monkeypatch):
    # Between the check and the DETACH, a guest signs up and their January favorites become
    # an account's: the partition must not leave the table with that row.
    made = fill(rows)
    claimed = made["jan"][0]
    real = partition_phase.DropPhase.alter

    def claim_then_alter(phase, statement):
        if JAN.split(".")[1] in statement and "FINALIZE" not in statement:
            with table.begin() as conn:
                conn.execute(sa.text("UPDATE favorites.favorites SET user_id = 9 "
                                     "WHERE id = :id"), {"id": claimed})
        return real(phase, statement)

    monkeypatch.setattr(partition_phase.DropPhase, "alter", claim_then_alter)
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
    assert JAN in partitions_of(table)
    assert (f"partition {JAN} was detached from favorites.favorites, but a row the rule keeps "
            "reached it after the check: attached again") in lines
    assert rows.ids() == {claimed, *made["feb_account"], *made["jun_fresh"], *made["fresh"]}
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (3, 59)


def test_two_drop_phases_at_once_detach_each_partition_once_and_count_its_rows_once(
        db_url, engine, rows):
    # Two runs of the policy at once (a run launched by hand beside the schedule's, outside
    # the run queue's pools) over 29 expired monthly partitions.
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, month_starts(dt.datetime(2023, 1, 1, tzinfo=UTC), 42))
    old = [rows.add_many(3, updated_at=dt.datetime(2023 + m // 12, m % 12 + 1, 5, tzinfo=UTC))
           for m in range(29)]
    accounts = [rows.add(updated_at=dt.datetime(2023, 1 + m, 20, tzinfo=UTC), user_id=m + 1)
                for m in (2, 7)]
    fresh = rows.add_many(4, updated_at=dt.datetime(2026, 3, 1, tzinfo=UTC))
    engines = [create_engine(db_url) for _ in range(2)]
    try:
        results = run_concurrently(2, lambda n: partitioned.drop_expired_partitions(
            engines[n], GUEST_FAVORITES, CUTOFF))
    finally:
        for e in engines:
            e.dispose()
    detached = [p for r in results for p in r.detached]
    assert len(detached) == len(set(detached)) == 27  # March and August hold an account row
    assert sum(r.rows_removed for r in results) == 27 * 3
    marks = {m.get("partition"): m["favorites_maintenance"]
             for m in detached_tables(engine).values()}
    # Each table either run detached is marked detached, so that a later run drops it.
    assert marks == dict.fromkeys(detached, "detached")
    kept = {*accounts, *fresh, *old[2], *old[7]}
    assert rows.ids() == kept


def test_a_detach_blocked_past_its_last_attempt_leaves_the_rows_to_the_batches(
        db_url, engine, rows, monkeypatch):
    # An application's maintenance (a VACUUM, a CREATE INDEX CONCURRENTLY) holds SHARE UPDATE
    # EXCLUSIVE on the table longer than every attempt of the detach (and of the mark before
    # it: a lock on the table blocks one on its partition); it does not block the batches'
    # DELETE.
    monkeypatch.setattr(partition_phase, "LOCK_BACKOFF_S", 0.1)
    jan, account = january_alone_before_the_cutoff(db_url, engine, rows, monkeypatch)
    with engine.connect() as holder:
        holder.execute(sa.text("LOCK TABLE favorites.favorites IN SHARE UPDATE EXCLUSIVE MODE"))
        with dg.instance_for_test() as instance:
            result = run(instance)
            assert result.success, failure_text(result)
            meta = materialization(result, asset_key=ASSET_KEY)
            lines = log_lines(instance, result)
        holder.rollback()
    assert "attempt 4/5" in lines and f"DETACH ... CONCURRENTLY of {JAN} failed" in lines
    assert JAN in partitions_of(engine)
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (0, 8)
    assert rows.ids() == {account} and set(jan).isdisjoint(rows.ids())
    # No mark is left saying the job is detaching it: a detach someone else begins later and
    # leaves pending must not pass for the job's own (which the job would drop).
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT obj_description(CAST(:p AS regclass), "
                                    "'pg_class')"), {"p": JAN}).scalar() is None


def test_a_drop_phase_that_fails_after_its_detaches_still_counts_them(table, rows,
                                                                      monkeypatch):
    # After January to May are detached, the read of the detached tables fails on a lock
    # timeout (a real one: a table the application holds). A retry of the step would find
    # nothing left to detach: the phase ends with what it did, and the batches go on.
    made = fill(rows)
    real = partitioned.drop_due
    calls = []

    def behind_a_lock_the_first_time(phase, privilege):
        calls.append(1)
        if len(calls) == 1:
            with table.connect() as holder, phase.engine.connect() as conn:
                holder.execute(sa.text(f"LOCK TABLE {JUNE} IN ACCESS EXCLUSIVE MODE"))
                conn.execute(sa.text("SET lock_timeout = '100ms'"))
                conn.execute(sa.text(f"SELECT 1 FROM {JUNE} LIMIT 1"))
        return real(phase, privilege)

    monkeypatch.setattr(partitioned, "drop_due", behind_a_lock_the_first_time)
    with dg.instance_for_test() as instance:
        result = run_partition(defs(), instance, PARTITION, job=JOB,
                               run_config=purge_retries(1, asset_key=ASSET_KEY),
                               raise_on_error=False)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
    assert {JAN, MAR, APR, MAY}.isdisjoint(partitions_of(table))
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (4, 60)
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_a_stop_request_ends_the_drop_phase_between_lock_attempts(db_url, engine, rows,
                                                                   monkeypatch, caplog):
    # A detach waiting on an application's lock retries with pauses of up to seconds: a stop
    # requested meanwhile ends the phase at once, the partition attached and unmarked.
    monkeypatch.setattr(partition_phase, "LOCK_BACKOFF_S", 30)
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, [month(1, 1), month(2, 1), month(3, 1),
                                           dt.datetime(2027, 1, 1, tzinfo=UTC)])
    jan = rows.add_many(5, updated_at=month(1))
    feb = rows.add_many(5, updated_at=month(2))
    def stop_once_a_wait_timed_out() -> bool:
        return any("lock_timeout" in r.getMessage() for r in caplog.records)

    caplog.set_level("INFO", logger="favorites_maintenance.retention.partitioned")
    with engine.connect() as holder:
        holder.execute(sa.text("LOCK TABLE favorites.favorites IN SHARE UPDATE EXCLUSIVE MODE"))
        result = partitioned.drop_expired_partitions(
            engine, GUEST_FAVORITES, CUTOFF, lock_timeout=dt.timedelta(milliseconds=200),
            should_stop=stop_once_a_wait_timed_out)
        holder.rollback()
    messages = [r.getMessage() for r in caplog.records]
    # One wait timed out, and no second attempt followed its 30 s pause.
    assert any("attempt 1/5; again in 30 s" in m for m in messages)
    assert not any("attempt 2/5" in m for m in messages)
    assert any("stopped on request" in m for m in messages)
    assert (result.detached, result.rows_removed) == ((), 0)
    assert {JAN, FEB} <= partitions_of(engine)
    assert set(jan) | set(feb) <= rows.ids()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT obj_description(CAST(:p AS regclass), "
                                    "'pg_class')"), {"p": JAN}).scalar() is None


def _raise_on_server(engine: sa.Engine, sqlstate: str) -> None:
    """Have the server raise SQLSTATE ``sqlstate`` in a transaction of ``engine``."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '{sqlstate}'; END $$")


def test_a_statement_of_the_drop_phase_a_deadlock_rolled_back_runs_again(
        engine, monkeypatch, caplog):
    """Two runs at once detaching and marking the same partitions can meet in a deadlock;
    PostgreSQL rolls one transaction back, and that statement runs again, as after a lock
    timeout. Any other error is not retried."""
    monkeypatch.setattr(partition_phase, "LOCK_BACKOFF_S", 0.05)
    caplog.set_level("INFO", logger="favorites_maintenance.retention.partitioned")
    phase = partition_phase.DropPhase(engine, GUEST_FAVORITES, CUTOFF, None,
                                      dt.timedelta(seconds=2), dt.timedelta(seconds=30))
    partition = table_partitions.TablePartition("favorites", "favorites_20230101",
                                                month(1), month(2))
    calls = []

    def deadlocked_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            _raise_on_server(engine, "40P01")  # deadlock_detected

    assert phase.with_lock_retries("the count and mark", partition, deadlocked_once) is None
    assert len(calls) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert ("the count and mark of favorites.favorites_20230101: deadlock_detected on attempt "
            "1/5; again in 0.05 s") in messages

    calls.clear()
    error = phase.with_lock_retries("the count and mark", partition,
                                    lambda: calls.append(1) or _raise_on_server(engine, "42P01"))
    assert len(calls) == 1 and error.kind == "undefined_table"


def test_a_pending_partition_another_run_detached_meanwhile_is_left_to_it(engine):
    """A run lists a partition whose detach another run has begun (pending), and that run
    finishes it and renames the table before this one decides: this run leaves it, with the
    reason, instead of failing on a table that is gone."""
    from favorites_maintenance.retention.partition_detach import decide

    phase = partition_phase.DropPhase(engine, GUEST_FAVORITES, CUTOFF, None,
                                      dt.timedelta(seconds=2), dt.timedelta(seconds=30))
    renamed = table_partitions.TablePartition("favorites", "favorites_20230101", month(1),
                                              month(2), detach_pending=True)
    decide(phase, renamed, "owner", has_default=False)
    [decision] = phase.decisions
    assert (decision.partition, decision.action.value) == ("favorites.favorites_20230101",
                                                           "kept")
    assert decision.checks[-1] == "detached by another session meanwhile; left to it"
