"""A policy with an archive: each batch moves its rows into ``archive_table`` in the same
transaction, every column as it was, stamped with the run and the policy; the archive is
created when missing and refused, before any delete, when it does not match; its rows past
``archive_retention_days`` are deleted by the policy's runs. Runs of the real code location
(the guest-favorites policy and ``shop_items`` of :mod:`~favorites_maintenance_tests.helpers.
archive`) through ``execute_in_process`` on a real server.
"""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.components.load_errors import PolicyLoadError
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers import archive as shop
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
    run_partition,
)
from favorites_maintenance_tests.helpers.policies import location

ARCHIVE_CHECK = "archive_within_retention"


@pytest.fixture
def env(db_url, engine, monkeypatch):
    """The test database holding ``shop.items``; the code location's variables."""
    shop.create_items(engine)
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    monkeypatch.delenv(shop.RETENTION_VAR, raising=False)
    guest_settings_env(monkeypatch)
    return monkeypatch


def shop_defs(**attributes) -> dg.Definitions:
    return location(shop.policy(**attributes))


def run_shop(instance, **attributes) -> dg.ExecuteInProcessResult:
    return run_partition(shop_defs(**attributes), instance, shop.PARTITION, job=shop.JOB,
                         raise_on_error=False)


def fill(engine) -> tuple[list[int], list[int]]:
    """40 prunable rows (six batches of 7), and 10 that stay (fresh, or an account's)."""
    old = shop.add_items(engine, 40, updated_at=shop.OLD)
    kept = (shop.add_items(engine, 5, updated_at=shop.FRESH)
            + shop.add_items(engine, 5, updated_at=shop.OLD, owner_id=3))
    return old, kept


def test_each_batch_moves_its_rows_into_the_archive_every_column_as_it_was(env, engine):
    old, kept = fill(engine)
    before = shop.rows_of(engine, shop.TABLE)
    with dg.instance_for_test() as instance:
        result = run_shop(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=shop.ASSET_KEY)
    assert (meta["deletedTotal"], meta["batches"]) == (40, 6)
    assert (meta["archiveRows"], meta["archiveDeletedTotal"]) == (40, 0)
    assert meta["backlogRemaining"] == 0
    assert sorted(shop.rows_of(engine, shop.TABLE)) == sorted(kept)
    # Every column of every deleted row, arrays, jsonb, numeric, enum and generated included.
    archived = shop.rows_of(engine, shop.ARCHIVE)
    assert archived == {i: before[i] for i in old}
    assert shop.archive_stamps(engine) == [(result.run_id, shop.POLICY, 40)]
    with engine.connect() as conn:
        # The archive the run created refuses no row: no key, no check, no NOT NULL but its
        # own three columns.
        refusing = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = 'shop.items_archive'::regclass "
            "AND contype IN ('p', 'u', 'c', 'f', 'x')").scalar_one()
        not_null = set(conn.exec_driver_sql(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'shop.items_archive'::regclass "
            "AND attnum > 0 AND attnotnull").scalars())
        stamped = conn.exec_driver_sql(
            "SELECT bool_and(_retention_archived_at > now() - interval '5 minutes') "
            "FROM shop.items_archive").scalar_one()
    assert refusing == 0
    assert not_null == {"_retention_run_id", "_retention_policy", "_retention_archived_at"}
    assert stamped


def test_a_second_run_archives_nothing_twice(env, engine):
    old, _ = fill(engine)
    with dg.instance_for_test() as instance:
        first = run_shop(instance)
        second = run_shop(instance)
        assert first.success and second.success
        meta = materialization(second, asset_key=shop.ASSET_KEY)
    assert (meta["deletedTotal"], meta["archiveRows"]) == (0, 40)
    assert shop.ids_of(engine, shop.ARCHIVE) == sorted(old)  # each id once
    assert shop.archive_stamps(engine) == [(first.run_id, shop.POLICY, 40)]


def _refused_before_any_delete(engine, result, *phrases):
    assert not result.success
    text = failure_text(result)
    for phrase in phrases:
        assert phrase in text, text
    assert "Nothing was deleted" in text
    return text


def test_an_archive_missing_a_column_is_refused_before_any_delete(env, engine):
    fill(engine)
    before = shop.rows_of(engine, shop.TABLE)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE shop.items_archive (id bigint, owner_id bigint, tags text[], "
            "scores integer[], price numeric(10,2), mood shop.mood, note text, "
            "price_cents bigint, updated_at timestamptz, _retention_run_id text, "
            "_retention_policy text, _retention_archived_at timestamptz)")
    with dg.instance_for_test() as instance:
        result = run_shop(instance)
    _refused_before_any_delete(
        engine, result, "archive shop.items_archive has no column 'attrs' (jsonb)",
        "ALTER TABLE shop.items_archive ADD COLUMN attrs jsonb")
    assert shop.rows_of(engine, shop.TABLE) == before
    assert shop.ids_of(engine, shop.ARCHIVE) == []


@pytest.mark.parametrize("ddl, phrase", [
    ("ALTER TABLE shop.items_archive ALTER COLUMN price TYPE numeric(12, 2)",
     ("archive shop.items_archive column 'price' is numeric(12,2), but shop.items's is "
      "numeric(10,2)")),
    ("ALTER TABLE shop.items_archive ADD COLUMN extra int",
     "archive shop.items_archive has a column 'extra' that shop.items has not"),
    ("ALTER TABLE shop.items_archive ADD PRIMARY KEY (id)",
     "archive shop.items_archive has a primary key constraint 'items_archive_pkey'"),
    ("ALTER TABLE shop.items_archive ALTER COLUMN note SET NOT NULL",
     "archive shop.items_archive column 'note' is NOT NULL, but shop.items's is not"),
])
def test_an_archive_that_does_not_match_the_table_is_refused_naming_why(env, engine, ddl,
                                                                        phrase):
    with dg.instance_for_test() as instance:
        assert run_shop(instance).success  # creates the archive, on an empty table
        fill(engine)
        before = shop.rows_of(engine, shop.TABLE)
        with engine.begin() as conn:
            conn.exec_driver_sql(ddl)
        result = run_shop(instance)
    _refused_before_any_delete(engine, result, phrase)
    assert shop.rows_of(engine, shop.TABLE) == before


def test_an_archive_made_like_the_table_including_all_takes_each_row_as_it_was(env, engine):
    """Its ``GENERATED ALWAYS`` identity is written with the archived key, and its generated
    column, computed by the same expression as the table's, computes the same value."""
    old, kept = fill(engine)
    before = shop.rows_of(engine, shop.TABLE)
    with engine.begin() as conn:
        conn.exec_driver_sql(shop.ARCHIVE_LIKE_THE_TABLE)
    with dg.instance_for_test() as instance:
        result = run_shop(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=shop.ASSET_KEY)
    assert (meta["deletedTotal"], meta["archiveRows"]) == (40, 40)
    assert shop.rows_of(engine, shop.ARCHIVE) == {i: before[i] for i in old}
    assert sorted(shop.rows_of(engine, shop.TABLE)) == sorted(kept)


@pytest.mark.parametrize("ddl, phrase", [
    # A generated column the table's is not: the archive would not keep the row's value.
    ("ALTER TABLE shop.items_archive DROP COLUMN note, ADD COLUMN note text "
     "GENERATED ALWAYS AS (tags[1]) STORED",
     "archive shop.items_archive column 'note' is generated (GENERATED ALWAYS AS "
     "(tags[1]) STORED), but shop.items's is not"),
    ("ALTER TABLE shop.items_archive DROP COLUMN price_cents, ADD COLUMN price_cents bigint "
     "GENERATED ALWAYS AS ((price * 1000)::bigint) STORED",
     "archive shop.items_archive column 'price_cents' is generated (GENERATED ALWAYS AS "
     "(((price * (1000)::numeric))::bigint) STORED), but shop.items's is generated otherwise"),
])
def test_an_archive_computing_a_column_otherwise_is_refused_naming_it(env, engine, ddl, phrase):
    fill(engine)
    before = shop.rows_of(engine, shop.TABLE)
    with engine.begin() as conn:
        conn.exec_driver_sql(shop.ARCHIVE_LIKE_THE_TABLE)
        conn.exec_driver_sql(ddl)
    with dg.instance_for_test() as instance:
        result = run_shop(instance)
    text = _refused_before_any_delete(engine, result, phrase)
    assert "ALTER TABLE shop.items_archive ALTER COLUMN" in text and "DROP EXPRESSION" in text
    assert shop.rows_of(engine, shop.TABLE) == before


def test_an_archive_whose_trigger_routes_rows_elsewhere_is_refused_naming_it(env, engine):
    """Rows its trigger sends to a child table never come back from the ``INSERT``: the run
    could not count them, nor tell them from rows the trigger dropped."""
    fill(engine)
    before = shop.rows_of(engine, shop.TABLE)
    with engine.begin() as conn:
        conn.exec_driver_sql(shop.ROUTED_ARCHIVE)
    with dg.instance_for_test() as instance:
        result = run_shop(instance)
    text = _refused_before_any_delete(
        engine, result, "archive shop.items_archive has a BEFORE INSERT trigger "
        "'route_archived' (function shop.route_archived) on shop.items_archive",
        "DROP TRIGGER route_archived ON shop.items_archive")
    assert "NoProgressError" not in text
    assert shop.rows_of(engine, shop.TABLE) == before
    assert shop.ids_of(engine, shop.ARCHIVE) == []

    # Rows such an archive took before (by its trigger, into its child) are still its own: a
    # restore, which only takes rows out of it, brings them back.
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "WITH moved AS (DELETE FROM shop.items WHERE owner_id IS NULL AND updated_at < "
            f"'{shop.CUTOFF.isoformat()}' RETURNING *) INSERT INTO shop.items_archive "
            "SELECT *, 'an-earlier-run', 'shop_items', now() FROM moved")
    assert len(shop.ids_of(engine, "shop.items_archive_routed")) == 40
    with dg.instance_for_test() as instance:
        restored = shop_defs().resolve_job_def(shop.RESTORE_JOB).execute_in_process(
            run_config={"ops": {shop.RESTORE_OP: {"config": {
                "run_id": "an-earlier-run", "allow_prunable": True}}}},
            instance=instance, raise_on_error=False)
    assert restored.success, failure_text(restored)
    assert shop.rows_of(engine, shop.TABLE) == before
    assert shop.ids_of(engine, shop.ARCHIVE) == []


def test_a_table_column_named_like_an_archive_column_is_refused_at_the_first_run(env, engine):
    fill(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE shop.items ADD COLUMN _retention_policy text")
    with dg.instance_for_test() as instance:
        result = run_shop(instance)
    _refused_before_any_delete(
        engine, result, "shop.items has a column '_retention_policy', the name of a column the "
        "archive shop.items_archive keeps for itself")
    assert len(shop.ids_of(engine, shop.TABLE)) == 50
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT to_regclass('shop.items_archive')").scalar() is None


def test_archived_rows_past_the_archive_retention_are_deleted_by_the_next_run(env, engine):
    old, _ = fill(engine)
    with dg.instance_for_test() as instance:
        assert run_shop(instance).success
        with engine.begin() as conn:  # 25 of them archived 31 days ago, 15 of them 29 days ago
            conn.exec_driver_sql(
                "UPDATE shop.items_archive SET _retention_archived_at = now() - CASE WHEN id IN "
                "(SELECT id FROM shop.items_archive ORDER BY id LIMIT 25) "
                "THEN interval '31 days' ELSE interval '29 days' END")
        newer = shop.add_items(engine, 3, updated_at=shop.OLD)
        result = run_shop(instance, archive_retention_days=30, batch_size=10)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=shop.ASSET_KEY)
    assert meta["deletedTotal"] == 3
    assert (meta["archiveDeletedTotal"], meta["archiveRows"]) == (25, 18)
    assert shop.ids_of(engine, shop.ARCHIVE) == sorted(old)[25:] + newer


def date_archive(engine, past_retention: int) -> None:
    """Date the first ``past_retention`` archived rows (by id) 31 days back, the others 29."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE shop.items_archive SET _retention_archived_at = now() - CASE WHEN id IN "
            f"(SELECT id FROM shop.items_archive ORDER BY id LIMIT {past_retention}) "
            "THEN interval '31 days' ELSE interval '29 days' END")


def archive_check(instance, result) -> dg.AssetCheckEvaluation:
    """The latest evaluation of ``archive_within_retention``, as the asset's Checks tab shows
    it: that of ``result``'s run (a run's result, or its id)."""
    run_id = result if isinstance(result, str) else result.run_id
    record = instance.get_latest_asset_check_evaluation_record(
        dg.AssetCheckKey(shop.ASSET_KEY, ARCHIVE_CHECK))
    assert record is not None and record.run_id == run_id
    return record.event.dagster_event.event_specific_data


def failure_observation(instance, result) -> dict:
    """The metadata of the observation a failed run recorded of what stays done."""
    [entry] = instance.all_logs(result.run_id,
                                of_type=dg.DagsterEventType.ASSET_OBSERVATION)
    return {k: v.value for k, v in entry.asset_observation.metadata.items()}


def hold_archive(engine) -> None:
    """Have the archive refuse every delete (a trigger raising, as a legal hold might)."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION shop.hold() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'on hold'; END $$; "
            "CREATE TRIGGER hold BEFORE DELETE ON shop.items_archive "
            "FOR EACH ROW EXECUTE FUNCTION shop.hold()")


def test_the_archive_retention_runs_while_a_migration_has_the_purge_refused(env, engine):
    old, _ = fill(engine)
    with dg.instance_for_test() as instance:
        assert run_shop(instance).success
        date_archive(engine, 25)
        newer = shop.add_items(engine, 3, updated_at=shop.OLD)
        # The table gains a column the archive lacks: the purge is refused, as it must be.
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE shop.items ADD COLUMN coupon text")
        result = run_shop(instance, archive_retention_days=30)
        observed = failure_observation(instance, result)
        check = archive_check(instance, result)
    text = _refused_before_any_delete(
        engine, result, "archive shop.items_archive has no column 'coupon' (text)",
        "the archive's retention ran all the same: 25 rows of shop.items_archive archived "
        "more than 30 days ago deleted, 15 rows of the policy kept")
    assert "did not run" not in text
    assert (observed["deletedTotal"], observed["archiveDeletedTotal"],
            observed["archiveRows"]) == (0, 25, 15)
    assert shop.ids_of(engine, shop.ARCHIVE) == sorted(old)[25:]
    assert set(newer) <= set(shop.ids_of(engine, shop.TABLE))
    assert check.passed and check.metadata["overdueArchivedRows"].value == 0


def test_when_the_archive_retention_cannot_run_the_failure_says_so_and_its_check_is_red(
        env, engine):
    old, _ = fill(engine)
    with dg.instance_for_test() as instance:
        assert run_shop(instance).success
        date_archive(engine, 25)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE shop.items ADD COLUMN coupon text")
        hold_archive(engine)  # its retention cannot run either
        result = run_shop(instance, archive_retention_days=30)
        _refused_before_any_delete(
            engine, result, "archive shop.items_archive has no column 'coupon' (text)",
            "the archive's retention did not run: deleting rows of shop.items_archive past the "
            "archive's retention failed (0 deleted before stay deleted): raise_exception")
        check = archive_check(instance, result)
        assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
        assert check.metadata["overdueArchivedRows"].value == 25
        assert len(shop.ids_of(engine, shop.ARCHIVE)) == 40

        with engine.begin() as conn:  # both fixed: the next run deletes what is overdue
            conn.exec_driver_sql("DROP TRIGGER hold ON shop.items_archive; "
                                 "ALTER TABLE shop.items_archive ADD COLUMN coupon text")
        result = run_shop(instance, archive_retention_days=30)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=shop.ASSET_KEY)
        assert archive_check(instance, result).passed
    assert (meta["archiveDeletedTotal"], meta["archiveRows"]) == (25, 15)
    assert shop.ids_of(engine, shop.ARCHIVE) == sorted(old)[25:]


def test_an_archive_retention_that_fails_after_the_purge_turns_its_check_red(env, engine):
    fill(engine)
    with dg.instance_for_test() as instance:
        assert run_shop(instance).success
        date_archive(engine, 25)
        hold_archive(engine)
        newer = shop.add_items(engine, 3, updated_at=shop.OLD)
        result = run_shop(instance, archive_retention_days=30)
        check = archive_check(instance, result)
    assert not result.success
    assert ("deleting rows of shop.items_archive past the archive's retention failed (0 deleted "
            "before stay deleted): raise_exception") in failure_text(result)
    assert not check.passed and check.metadata["overdueArchivedRows"].value == 25
    assert len(shop.ids_of(engine, shop.ARCHIVE)) == 43  # the purge moved the 3 new rows
    assert not set(newer) & set(shop.ids_of(engine, shop.TABLE))


REEXECUTE = """
mutation($params: ReexecutionParams!) { launchPipelineReexecution(reexecutionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }
"""


def test_a_re_execution_from_asset_failure_turns_the_archive_check_green_once_it_ran(
        env, engine, dagster_storage_url):
    """The UI's "Re-execute from asset failure" of a run whose archive retention failed, once
    the cause is gone: Dagster leaves out of the new run the checks the failed run evaluated,
    the archive's among them (its purge step recorded it red). The new run deletes the
    overdue archived rows, and its purge step records the check, green: it is no longer red
    over rows that are gone until some later run."""
    from dagster_graphql.test.utils import execute_dagster_graphql

    from favorites_maintenance_tests.helpers.daemon import code_location, launch_run, pg_instance
    from favorites_maintenance_tests.helpers.policies import policy_sandbox

    fill(engine)
    partition = {"dagster/partition": shop.PARTITION}
    with policy_sandbox(shop.policy(archive_retention_days=30)) as sandbox, \
            pg_instance(dagster_storage_url, run_in_process=True) as instance, \
            code_location(instance, sandbox.location_target()) as workspace:
        # The asset page's Materialize selects the asset's checks: one record of the archive's.
        first = launch_run(workspace, "__ASSET_JOB", tags=partition,
                           asset=list(shop.ASSET_KEY.path),
                           run_config={"execution": {"config": {"in_process": {}}}})
        assert archive_check(instance, first).passed
        assert len(instance.all_logs(first, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)) \
            == 4
        date_archive(engine, 25)
        hold_archive(engine)
        failed = launch_run(workspace, shop.JOB, tags=partition)
        assert not archive_check(instance, failed).passed
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER hold ON shop.items_archive")
        launched = execute_dagster_graphql(
            workspace.create_request_context(), REEXECUTE,
            {"params": {"parentRunId": failed, "strategy": "FROM_ASSET_FAILURE"}},
        ).data["launchPipelineReexecution"]
        again = instance.get_run_by_id(launched["run"]["runId"])
        assert again.status == dg.DagsterRunStatus.SUCCESS
        assert ARCHIVE_CHECK not in {k.name for k in again.asset_check_selection}
        check = archive_check(instance, again.run_id)
    assert len(shop.ids_of(engine, shop.ARCHIVE)) == 15
    assert check.passed and check.metadata["overdueArchivedRows"].value == 0


def test_archive_within_retention_is_red_while_archived_rows_are_past_it(env, engine):
    fill(engine)
    check_key = dg.AssetCheckKey(shop.ASSET_KEY, ARCHIVE_CHECK)
    with dg.instance_for_test() as instance:
        result = run_shop(instance, archive_retention_days=30)
        assert result.success and archive_check(instance, result).passed
        date_archive(engine, 25)
        # The check alone, as the asset's Checks tab runs it: no purge, no archive retention.
        alone = shop_defs(archive_retention_days=30).resolve_job_def(shop.JOB).get_subset(
            asset_selection=set(), asset_check_selection={check_key})
        red = archive_check(instance, alone.execute_in_process(partition_key=shop.PARTITION,
                                                               instance=instance))
        assert not red.passed and red.severity == dg.AssetCheckSeverity.ERROR
        assert red.metadata["overdueArchivedRows"].value == 25
        assert "25 archived rows of policy shop_items" in red.description
        green = archive_check(instance, run_shop(instance, archive_retention_days=30))
    assert green.passed and green.metadata["overdueArchivedRows"].value == 0
    assert len(shop.ids_of(engine, shop.ARCHIVE)) == 15


def test_a_range_run_records_the_archive_check_once_for_each_day(env, engine):
    fill(engine)
    days = ["2026-06-13", "2026-06-14", shop.PARTITION]
    check_key = dg.AssetCheckKey(shop.ASSET_KEY, ARCHIVE_CHECK)
    with dg.instance_for_test() as instance:
        assert run_shop(instance).success
        date_archive(engine, 25)
        result = shop_defs(archive_retention_days=30).resolve_job_def(shop.JOB).execute_in_process(
            instance=instance, tags={"dagster/asset_partition_range_start": days[0],
                                     "dagster/asset_partition_range_end": days[-1]})
        assert result.success, failure_text(result)
        history = instance.event_log_storage.get_asset_check_execution_history(check_key,
                                                                               limit=10)
    mine = {r.partition: r.event.dagster_event.asset_check_evaluation_data
            for r in history if r.run_id == result.run_id}
    assert sorted(mine) == days
    assert all(e.passed for e in mine.values())
    # The archive is checked once, on the last day; the earlier days refer to it.
    assert mine[days[-1]].metadata["overdueArchivedRows"].value == 0
    assert all(mine[d].metadata["attributedTo"].value == days[-1] for d in days[:-1])
    assert len(shop.ids_of(engine, shop.ARCHIVE)) == 15


@pytest.mark.parametrize("attributes, phrase", [
    ({"archive_table": "items_archive"},
     "archive_table 'items_archive' must be written schema.table"),
    ({"archive_table": "shop.Items"}, "archive_table 'Items' is not a lower-case SQL identifier"),
    ({"archive_table": "shop.items"}, "archive_table shop.items is the policy's own table"),
    ({"archive_table": None, "archive_retention_days": 30},
     "policy shop_items, archive_retention_days is set, but the policy has no archive_table"),
])
def test_a_malformed_archive_is_refused_at_load(env, attributes, phrase):
    with pytest.raises(PolicyLoadError) as refused:
        shop_defs(**attributes)
    assert phrase in str(refused.value)


def test_the_guest_favorites_policy_keeps_no_archive(env, engine, rows):
    from favorites_maintenance.components.policy_tree import code_location
    from favorites_maintenance_tests.helpers.jobs import ASSET_KEY, JOB

    defs = code_location()
    assert not [j for j in defs.resolve_all_job_defs() if j.name.startswith("restore_")]
    assert ARCHIVE_CHECK not in {c.name for c in defs.resolve_asset_graph().asset_check_keys}
    rows.add_many(30, updated_at=shop.OLD)
    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, shop.PARTITION, job=JOB)
        meta = materialization(result, asset_key=ASSET_KEY)
    assert meta["deletedTotal"] == 30
    assert "archiveRows" not in meta and "archiveDeletedTotal" not in meta
    with engine.connect() as conn:
        tables = set(conn.execute(sa.text(
            "SELECT relname FROM pg_class WHERE relnamespace = 'favorites'::regnamespace "
            "AND relkind = 'r'")).scalars())
    assert tables == {"favorites"}
