"""``session_replication_role = replica`` (set on the database or the role, as a replication
tool may leave it) turns triggers and foreign keys off: a purge would delete rows whose
``RESTRICT`` children remain and skip their cascades, and report a clean success. The job and
``dry-run`` refuse to run, naming the setting and its fix."""

from __future__ import annotations

import dagster as dg
import sqlalchemy as sa
from click.testing import CliRunner

from favorites_maintenance.cli import main
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.reliability.conftest import (
    OLD,
    PARTITION,
    error_text,
    materialization,
    run_job,
    step_failure,
)


def children(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {table: conn.exec_driver_sql(f"SELECT count(*) FROM favorites.{table}").scalar()
                for table in ("shares", "pins")}


def test_a_database_in_replica_mode_is_refused_and_nothing_is_deleted(db_url, engine, rows,
                                                                      monkeypatch):
    shared, pinned, plain = (rows.add(updated_at=OLD) for _ in range(3))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"""
            CREATE TABLE favorites.shares (favorite_id bigint REFERENCES favorites.favorites(id)
                ON DELETE CASCADE);
            CREATE TABLE favorites.pins (favorite_id bigint REFERENCES favorites.favorites(id)
                ON DELETE RESTRICT);
            INSERT INTO favorites.shares VALUES ({shared});
            INSERT INTO favorites.pins VALUES ({pinned});""")
    database = sa.make_url(db_url).database
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{database}" SET session_replication_role = replica')

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
        [failed] = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.user_message.startswith("run failed")]

    assert not result.success and materialization(result) is None
    step, error = step_failure(result)
    assert step.endswith("purge")
    text = error_text(error)
    assert "ReplicationRoleError" in text
    assert "session_replication_role is 'replica' for the job's sessions (set by: database)" in text
    fix = f'ALTER DATABASE "{database}" RESET session_replication_role'
    assert fix in text and "batch_no=0" in failed
    assert rows.ids() == {shared, pinned, plain}
    assert children(engine) == {"shares": 1, "pins": 1}

    out = CliRunner().invoke(main, ["dry-run", "--partition", PARTITION], env={
        DATABASE_URL_VAR: sa.make_url(db_url).render_as_string(hide_password=False)})
    assert out.exit_code == 2 and "session_replication_role is 'replica'" in out.output
    assert fix in out.output

    # Reset as the message says: the cascade runs, the restricted row is skipped.
    with engine.begin() as conn:
        conn.exec_driver_sql(fix)
    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
    assert result.success
    assert (materialization(result)["deletedTotal"], materialization(result)["skippedRows"]) == (
        2, 1)
    assert rows.ids() == {pinned}
    assert children(engine) == {"shares": 0, "pins": 1}


def test_a_role_in_replica_mode_is_refused_naming_the_role(db_url, engine, rows, roles,
                                                           monkeypatch):
    rows.add(updated_at=OLD)
    url = roles.create("replicator", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'ALTER ROLE "{url.username}" SET session_replication_role = replica')

    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)

    assert not result.success
    text = error_text(step_failure(result)[1])
    assert "(set by: user)" in text
    assert f'ALTER ROLE "{url.username}" RESET session_replication_role' in text
    assert rows.count() == 1
