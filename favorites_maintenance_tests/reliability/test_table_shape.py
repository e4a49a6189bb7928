"""The table's columns are checked before the first batch, not assumed.

The production table belongs to another service. A ``timestamp without time zone`` age column
would shift the cutoff by the session's time zone, a ``NOT NULL`` guard would make the job
delete nothing forever, a non-unique key would let a batch's key stand for another row: each is
refused with the column, its type and the fix, by the job and by ``dry-run`` alike. A missing
partial index is only a warning.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from favorites_maintenance.cli import main
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.retention.errors import TableShapeError
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.local.guest_favorites import (
    RECOMMENDED_INDEX_NAME,
    RECOMMENDED_INDEX_SQL,
    create_partitioned_dev_schema,
    drop_dev_schema,
    month_starts,
)
from favorites_maintenance.retention.table_check import check_table
from favorites_maintenance_tests.helpers.jobs import TEST_PARTITIONS_START, guest_variable
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    OLD,
    PARTITION,
    error_text,
    materialization,
    run_job,
    step_failure,
)

THREE_HOURS = dt.timedelta(hours=3)
UTC = dt.timezone.utc


def recreate(engine, *, updated_at: str = "timestamptz NOT NULL",
             user_id: str = "bigint", key: str = "bigint PRIMARY KEY",
             index: bool = True) -> None:
    """Replace the dev table by one of another shape (same column names)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE favorites.favorites")
        conn.exec_driver_sql(
            f"CREATE TABLE favorites.favorites (id {key}, user_id {user_id}, anonymous_id uuid, "
            f"note text, updated_at {updated_at})")
        if index:
            conn.exec_driver_sql(RECOMMENDED_INDEX_SQL.replace(" CONCURRENTLY", ""))


def insert(engine, rows: list[tuple[int, int | None, str]]) -> None:
    """``(id, user_id, updated_at literal)`` rows."""
    with engine.begin() as conn:
        for row_id, user_id, updated_at in rows:
            conn.execute(sa.text(
                "INSERT INTO favorites.favorites (id, user_id, anonymous_id, updated_at) "
                "VALUES (:id, :user_id, gen_random_uuid(), CAST(:updated_at AS text)::"
                "timestamptz)"), {"id": row_id, "user_id": user_id, "updated_at": updated_at})


def ids(engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.exec_driver_sql("SELECT id FROM favorites.favorites").scalars())


def dry_run(db_url):
    """``dry-run`` of :data:`PARTITION`, a day of the policy whatever ran before (the variable
    of its first day set as the job's runs set it)."""
    return CliRunner().invoke(main, ["dry-run", "--partition", PARTITION], env={
        DATABASE_URL_VAR: sa.make_url(db_url).render_as_string(hide_password=False),
        guest_variable("partitions_start"): TEST_PARTITIONS_START.isoformat()})


def test_a_timestamp_without_time_zone_is_refused_by_the_job_and_the_dry_run(
        db_url, engine, monkeypatch):
    recreate(engine, updated_at="timestamp NOT NULL")
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{sa.make_url(db_url).database}" '
                             "SET timezone = 'America/New_York'")
    # UTC wall-clock times, 3 h either side of the cutoff.
    utc = dt.timezone.utc
    older = (CUTOFF - THREE_HOURS).astimezone(utc).replace(tzinfo=None).isoformat()
    newer = (CUTOFF + THREE_HOURS).astimezone(utc).replace(tzinfo=None).isoformat()
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO favorites.favorites (id, updated_at) VALUES "
                             "(1, CAST(:a AS timestamp)), (2, CAST(:b AS timestamp))"),
                     {"a": older, "b": newer})

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)

    assert not result.success
    step, error = step_failure(result)
    assert step.endswith("purge")
    text = error_text(error)
    assert "TableShapeError" in text
    assert "favorites.favorites.updated_at is TIMESTAMP WITHOUT TIME ZONE" in text
    assert ("ALTER TABLE favorites.favorites ALTER COLUMN updated_at TYPE timestamptz USING "
            "updated_at AT TIME ZONE 'UTC'") in text
    assert ids(engine) == {1, 2}  # nothing deleted, hours early or otherwise

    out = dry_run(db_url)
    assert out.exit_code == 2
    assert "updated_at is TIMESTAMP WITHOUT TIME ZONE" in out.output
    assert "prunable" not in out.output


@pytest.mark.parametrize("shape, column, said", [
    ({"updated_at": "date NOT NULL"}, "updated_at",
     "favorites.favorites.updated_at is DATE"),
    ({"user_id": "bigint NOT NULL"}, "user_id",
     "favorites.favorites.user_id is NOT NULL, so no row can ever pass the guard "
     "(user_id IS NULL)"),
    ({"key": "bigint NOT NULL"}, "id", "favorites.favorites.id is not unique"),
])
def test_other_shapes_the_rule_cannot_use_are_refused_naming_the_column(
        db_url, engine, monkeypatch, shape, column, said):
    recreate(engine, **shape)

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)

    assert not result.success
    text = error_text(step_failure(result)[1])
    assert said in text
    assert dry_run(db_url).exit_code == 2 and said in dry_run(db_url).output


def test_a_key_unique_with_the_age_column_is_enough(db_url, engine, monkeypatch):
    # The primary key of a table partitioned by updated_at must include it.
    recreate(engine, key="bigint")
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE favorites.favorites ADD PRIMARY KEY (id, updated_at)")
    insert(engine, [(1, None, OLD.isoformat()), (2, 5, OLD.isoformat())])

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)

    assert result.success
    assert ids(engine) == {2}


def test_a_missing_partial_index_is_a_warning_with_the_statement_to_run(
        db_url, engine, monkeypatch):
    recreate(engine, index=False)
    insert(engine, [(1, None, OLD.isoformat()), (2, 5, OLD.isoformat())])

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
        warnings = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.level == 30 and "partial index" in e.user_message]

    assert result.success
    assert materialization(result)["deletedTotal"] == 1
    assert len(warnings) == 1 and RECOMMENDED_INDEX_SQL in warnings[0]
    out = dry_run(db_url)
    assert out.exit_code == 0
    assert "warning:" in out.stderr and RECOMMENDED_INDEX_SQL in out.stderr


def test_a_view_in_place_of_the_table_is_refused_naming_it(db_url, engine, monkeypatch):
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE favorites.favorites RENAME TO base")
        conn.exec_driver_sql("CREATE VIEW favorites.favorites AS SELECT * FROM favorites.base")
    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
    assert "favorites.favorites is a view" in error_text(step_failure(result)[1])


def test_a_nullable_key_is_refused_and_a_timestamptz_domain_is_accepted(
        db_url, engine, monkeypatch):
    recreate(engine, key="bigint UNIQUE")
    out = dry_run(db_url)
    assert out.exit_code == 2 and "favorites.favorites.id is nullable" in out.output

    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE DOMAIN favorites.instant AS timestamptz")
    recreate(engine, updated_at="favorites.instant NOT NULL")
    insert(engine, [(1, None, OLD.isoformat()), (2, 5, OLD.isoformat())])
    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
    assert result.success and ids(engine) == {2}


def test_a_table_in_a_publication_without_replica_identity_is_refused_before_the_first_batch(
        db_url, engine, monkeypatch):
    # Unique but no primary key: REPLICA IDENTITY DEFAULT has nothing to identify rows by.
    recreate(engine, key="bigint NOT NULL UNIQUE")
    insert(engine, [(1, None, OLD.isoformat()), (2, 5, OLD.isoformat())])
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE PUBLICATION favorites_to_warehouse "
                             "FOR TABLE favorites.favorites")

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
        batches = [e.user_message for e in instance.all_logs(result.run_id)
                   if e.user_message.startswith("batch ")]

    assert not result.success and batches == []
    step, error = step_failure(result)
    assert step.endswith("purge")
    text = error_text(error)
    assert "TableShapeError" in text
    said = ("favorites.favorites is in publication favorites_to_warehouse, which publishes "
            "deletes, but has no replica identity (REPLICA IDENTITY DEFAULT and no primary key)")
    fix = ("ALTER TABLE favorites.favorites REPLICA IDENTITY USING INDEX "
           "favorites_id_key")
    assert said in text and fix in text
    assert ids(engine) == {1, 2}
    out = dry_run(db_url)
    assert out.exit_code == 2 and said in out.output and fix in out.output

    with engine.begin() as conn:
        conn.exec_driver_sql(fix)
    with dg.instance_for_test() as instance:
        assert run_job(db_url, instance, monkeypatch=monkeypatch).success
    assert ids(engine) == {2}


def test_a_publication_row_filter_outside_the_replica_identity_is_refused_before_the_first_batch(
        db_url, engine, rows, monkeypatch):
    # The dev table's replica identity is its primary key (id): the filter's user_id is not in
    # it, and PostgreSQL refuses every DELETE (SQLSTATE 42P10) to keep subscribers consistent.
    guests = set(rows.add_many(3, updated_at=OLD))
    accounts = set(rows.add_many(2, updated_at=OLD, user_id=5))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE PUBLICATION guests_to_warehouse "
                             "FOR TABLE favorites.favorites WHERE (user_id IS NULL)")

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
        batches = [e.user_message for e in instance.all_logs(result.run_id)
                   if e.user_message.startswith("batch ")]

    assert not result.success and batches == []
    step, error = step_failure(result)
    assert step.endswith("purge")
    text = error_text(error)
    assert "TableShapeError" in text
    said = ("favorites.favorites cannot be purged: publication guests_to_warehouse publishes the "
            "deletes of favorites.favorites with the row filter (user_id IS NULL), on column "
            "user_id, which is not part of its replica identity (the primary key: id)")
    fix = "ALTER TABLE favorites.favorites REPLICA IDENTITY FULL"
    assert said in text and "SQLSTATE 42P10" in text and fix in text
    assert rows.ids() == guests | accounts
    out = dry_run(db_url)
    assert out.exit_code == 2 and said in out.output and fix in out.output

    with engine.begin() as conn:
        conn.exec_driver_sql(fix)
    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
    assert result.success and materialization(result)["deletedTotal"] == 3
    assert rows.ids() == accounts


@pytest.mark.parametrize("publication, refused", [
    # Published through the parent: its filter applies to every partition.
    ("FOR TABLE favorites.favorites WHERE (user_id IS NULL) "
     "WITH (publish_via_partition_root = true)",
     ["favorites.favorites_20240101", "favorites.favorites_20240201"]),
    # One partition published with a filter of its own.
    ("FOR TABLE favorites.favorites_20240201 WHERE (user_id IS NULL AND id > 0)",
     ["favorites.favorites_20240201"]),
    # Through the parent, the parent's filter wins over the partition's own.
    ("FOR TABLE favorites.favorites WHERE (id > 0), favorites.favorites_20240201 "
     "WHERE (user_id IS NULL) WITH (publish_via_partition_root = true)", []),
])
def test_a_row_filter_is_checked_on_each_partition_as_postgresql_applies_it(
        engine, publication, refused):
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, month_starts(dt.datetime(2024, 1, 1, tzinfo=UTC), 2))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE PUBLICATION warehouse {publication}")
    with engine.connect() as conn:
        deletable = {}
        for partition in ("favorites_20240101", "favorites_20240201"):
            with conn.begin_nested() as attempt:  # what PostgreSQL says of a DELETE there
                try:
                    conn.exec_driver_sql(f"DELETE FROM favorites.{partition} WHERE false")
                    deletable[f"favorites.{partition}"] = True
                except sa.exc.DBAPIError:
                    deletable[f"favorites.{partition}"] = False
                attempt.rollback()
        if not refused:
            check_table(conn, GUEST_FAVORITES)
        else:
            with pytest.raises(TableShapeError) as raised:
                check_table(conn, GUEST_FAVORITES)
            assert (f"publication warehouse publishes the deletes of {refused[0]} with the row "
                    "filter") in str(raised.value)
            assert raised.value.column == "user_id"
    assert [p for p, ok in deletable.items() if not ok] == refused

    with engine.begin() as conn:  # the fix the refusal gives, on each partition
        for partition in deletable:
            conn.exec_driver_sql(f"ALTER TABLE {partition} REPLICA IDENTITY FULL")
    with engine.connect() as conn:
        check_table(conn, GUEST_FAVORITES)


def test_a_publication_the_table_can_serve_changes_nothing(db_url, engine, rows, monkeypatch):
    # The dev table has a primary key: REPLICA IDENTITY DEFAULT uses it.
    rows.add_many(3, updated_at=OLD)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE PUBLICATION everything FOR ALL TABLES")
        conn.exec_driver_sql("CREATE PUBLICATION inserts_only FOR TABLE favorites.favorites "
                             "WHERE (user_id IS NULL) WITH (publish = 'insert')")
        # A row filter on the replica identity's columns (the primary key) is no obstacle.
        conn.exec_driver_sql("CREATE PUBLICATION by_key FOR TABLE favorites.favorites "
                             "WHERE (id > 0)")
    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
    assert result.success and materialization(result)["deletedTotal"] == 3


def create_index_concurrently_that_fails(engine, sql: str) -> None:
    """Run ``CREATE INDEX CONCURRENTLY`` as a migration would, and have it fail: a writer's
    open transaction makes it wait, and its statement_timeout cancels it, which leaves the
    index behind INVALID."""
    writer = engine.connect()
    builder = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        writer.begin()
        writer.exec_driver_sql("UPDATE favorites.favorites SET note = note WHERE id = -1")
        builder.exec_driver_sql("SET statement_timeout = '500ms'")
        with pytest.raises(sa.exc.OperationalError, match="statement timeout"):
            builder.exec_driver_sql(sql)
    finally:
        writer.rollback()
        writer.close()
        builder.close()


def test_an_invalid_recommended_index_is_a_warning_with_the_fix(db_url, engine, monkeypatch):
    recreate(engine, index=False)
    insert(engine, [(1, None, OLD.isoformat()), (2, 5, OLD.isoformat())])
    create_index_concurrently_that_fails(engine, RECOMMENDED_INDEX_SQL)
    with engine.connect() as conn:  # the README's IF NOT EXISTS retry does nothing
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            RECOMMENDED_INDEX_SQL)
        assert conn.exec_driver_sql(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = "
            f"'favorites.{RECOMMENDED_INDEX_NAME}'::regclass").scalar_one() is False

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
        warnings = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.level == 30 and "INVALID" in e.user_message]

    assert result.success and ids(engine) == {2}
    fix = f"DROP INDEX CONCURRENTLY favorites.{RECOMMENDED_INDEX_NAME}; then {RECOMMENDED_INDEX_SQL}"
    assert len(warnings) == 1 and fix in warnings[0]
    assert f"index favorites.{RECOMMENDED_INDEX_NAME} on favorites.favorites is INVALID" in (
        warnings[0])
    out = dry_run(db_url)
    assert out.exit_code == 0 and fix in out.stderr


def test_an_invalid_unique_index_is_no_proof_that_the_key_is_unique(db_url, engine, monkeypatch):
    recreate(engine, key="bigint NOT NULL")
    # Two rows share id 1: the unique index's build fails on them and leaves it INVALID.
    insert(engine, [(1, None, OLD.isoformat()), (1, 5, OLD.isoformat()),
                    (2, None, OLD.isoformat())])
    with engine.connect() as conn, pytest.raises(sa.exc.IntegrityError):
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            "CREATE UNIQUE INDEX CONCURRENTLY favorites_id_idx ON favorites.favorites (id)")

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)

    assert not result.success
    text = error_text(step_failure(result)[1])
    assert "favorites.favorites.id is not unique" in text
    assert ("Unique index favorites.favorites_id_idx is INVALID" in text
            and "DROP INDEX CONCURRENTLY favorites.favorites_id_idx" in text)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM favorites.favorites").scalar() == 3
    assert "is not unique" in dry_run(db_url).output


@pytest.mark.parametrize("validated", [True, False])
def test_a_guard_made_not_null_by_a_check_constraint_is_refused_like_a_not_null_column(
        db_url, engine, monkeypatch, validated):
    recreate(engine)
    insert(engine, [(1, 5, OLD.isoformat())])
    with engine.begin() as conn:
        if not validated:  # old guest rows may remain: they are still prunable
            insert(engine, [(2, None, OLD.isoformat())])
        conn.exec_driver_sql(
            "ALTER TABLE favorites.favorites ADD CONSTRAINT favorites_account_only CHECK "
            f"(user_id IS NOT NULL AND id > 0){'' if validated else ' NOT VALID'}")

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)

    said = ("favorites.favorites.user_id is NOT NULL by CHECK constraint "
            "favorites.favorites_account_only, so no row can ever pass the guard "
            "(user_id IS NULL)")
    if validated:
        assert not result.success and said in error_text(step_failure(result)[1])
        out = dry_run(db_url)
        assert out.exit_code == 2 and said in out.output
    else:
        assert result.success and ids(engine) == {1}
