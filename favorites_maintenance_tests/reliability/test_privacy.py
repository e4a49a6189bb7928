"""Privacy: whatever fails, no anonymous id, no note and no password is logged or recorded.

Every failure path of the other reliability tests is run here on rows whose ``anonymous_id``
and ``note`` hold sentinel values, as a role whose password is a sentinel too. Everything that
could carry text is collected: Python log records of every logger at DEBUG (SQLAlchemy and
psycopg included), what reached stdout/stderr, Dagster's event log (messages, errors with their
causes and stacks, metadata values) and the exceptions raised by the core.
"""

from __future__ import annotations

import datetime as dt
import socket

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import dev_favorites
from favorites_maintenance.retention import SkippedRowsError
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.helpers.sessions import kill_when
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    FRESH,
    OLD,
    SENTINEL_ANON,
    SENTINEL_NOTE,
    everything_dagster_recorded,
    run_job,
    slow_delete,
)

PASSWORD = "SENTINEL-PASSWORD-q8Zr"
SENTINELS = (SENTINEL_ANON, SENTINEL_NOTE, PASSWORD)


def seed(engine, n: int = 250) -> None:
    """Prunable and kept guest rows, all carrying the sentinels; one marked to be slow."""
    step = dt.timedelta(seconds=1)
    with engine.begin() as conn:
        conn.execute(sa.insert(dev_favorites), [
            {"user_id": None, "anonymous_id": SENTINEL_ANON, "item_id": i,
             "note": "SLOW" if i == 120 else SENTINEL_NOTE,
             "created_at": OLD + i * step, "updated_at": OLD + i * step} for i in range(n)])
        conn.execute(sa.insert(dev_favorites), [
            {"user_id": None, "anonymous_id": SENTINEL_ANON, "item_id": i, "note": SENTINEL_NOTE,
             "created_at": FRESH, "updated_at": FRESH} for i in range(10)])


def refuse_deletes_quoting_the_row(engine) -> None:
    """A service-side trigger whose error quotes the row: message, DETAIL, HINT and CONTEXT."""
    with engine.begin() as conn:
        conn.execute(sa.text("""
            CREATE FUNCTION favorites.refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'cannot delete favorite of %: %', OLD.anonymous_id, OLD.note
                    USING DETAIL = 'row ' || OLD.anonymous_id || ' / ' || OLD.note,
                          HINT = OLD.note;
            END $$;
            CREATE TRIGGER refuse_delete BEFORE DELETE ON favorites.favorites
                FOR EACH ROW EXECUTE FUNCTION favorites.refuse_delete();"""))


class Collected:
    def __init__(self, caplog, capfd):
        self.caplog, self.capfd = caplog, capfd
        self.texts: list[str] = []

    def run(self, url, instance, monkeypatch, **settings):
        result = run_job(url, instance, monkeypatch=monkeypatch, **settings)
        self.texts.append(everything_dagster_recorded(instance, result.run_id))
        self.texts.extend(repr(e) for e in result.all_events)
        return result

    def assert_clean(self):
        out, err = self.capfd.readouterr()
        everything = "\n".join([*self.texts, self.caplog.text, out, err])
        assert everything.strip()  # something was collected
        for sentinel in SENTINELS:
            assert sentinel not in everything, sentinel


@pytest.fixture
def collected(all_logs, capfd):
    return Collected(all_logs, capfd)


@pytest.fixture
def role_url(roles, engine):
    url = roles.create("private", least_privilege=True, password=PASSWORD)
    assert url.password == PASSWORD
    return url


def test_no_failure_path_logs_a_private_value_or_the_password(
        db_url, engine, roles, role_url, collected, monkeypatch):
    seed(engine)
    collected.caplog.clear()
    with dg.instance_for_test() as instance:
        # 1. The backend killed in the middle of a batch.
        with slow_delete(engine, seconds=30), kill_when(engine):
            assert not collected.run(role_url, instance, monkeypatch, batch_size=50).success

        # 2. A statement timeout of the role: the batches holding the slow row are cancelled
        # and split, the row is skipped, the run goes on.
        with engine.begin() as conn:
            conn.exec_driver_sql(f'ALTER ROLE "{role_url.username}" '
                                 "SET statement_timeout = '200ms'")
        with slow_delete(engine, seconds=3):
            assert collected.run(role_url, instance, monkeypatch, batch_size=50).success
        with engine.begin() as conn:
            conn.exec_driver_sql(f'ALTER ROLE "{role_url.username}" RESET statement_timeout')
        seed(engine, n=30)  # rows for the failures below: that run deleted all but one

        # 3. A trigger of the favorites service refusing the delete, quoting the row.
        refuse_deletes_quoting_the_row(engine)
        assert not collected.run(role_url, instance, monkeypatch).success
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER refuse_delete ON favorites.favorites")

        # 4. A missing permission (the row-lock privilege revoked).
        with engine.begin() as conn:
            conn.exec_driver_sql(f'REVOKE UPDATE (updated_at) ON favorites.favorites '
                                 f'FROM "{role_url.username}"')
        assert not collected.run(role_url, instance, monkeypatch).success

        # 5. An unreachable server, the password in the URL.
        sock = socket.create_server(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        unreachable = role_url.set(host="127.0.0.1", port=port, query={})
        assert not collected.run(unreachable, instance, monkeypatch).success

        # 6. The table gone.
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE favorites.favorites RENAME TO gone")
        assert not collected.run(db_url.set(password=PASSWORD), instance, monkeypatch).success
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE favorites.gone RENAME TO favorites")

        # And the run that succeeds in the end.
        assert collected.run(db_url.set(password=PASSWORD), instance, monkeypatch).success
    collected.assert_clean()


def test_core_errors_never_carry_the_row_the_database_quoted(engine, collected):
    seed(engine, n=20)
    refuse_deletes_quoting_the_row(engine)
    collected.caplog.clear()
    # Every row fails: the batch is split down to single rows, each skipped by its key, until
    # the table is taken for blocked.
    with pytest.raises(SkippedRowsError) as raised:
        purge_rows(engine, CUTOFF, batch_size=10, max_run_duration=dt.timedelta(minutes=1))
    err = raised.value
    assert "raise_exception (SQLSTATE P0001)" in str(err)
    assert err.__cause__ is None and err.__suppress_context__
    collected.texts += [str(err), repr(err), repr(err.report)]
    collected.assert_clean()


def test_a_bad_password_or_host_never_echoes_the_password(db_url, collected):
    for url in (db_url.set(password=PASSWORD, database="no_such_db"),
                db_url.set(password=PASSWORD, host="127.0.0.1", port=1, query={})):
        engine = create_engine(url)
        try:
            with pytest.raises(Exception) as raised:
                purge_rows(engine, CUTOFF, batch_size=10, max_run_duration=dt.timedelta(minutes=1))
            collected.texts += [str(raised.value), repr(raised.value), repr(engine),
                                str(engine.url)]
        finally:
            engine.dispose()
    collected.assert_clean()


def test_an_archive_and_a_restore_never_log_an_archived_value(
        db_url, engine, collected, monkeypatch):
    """A policy archiving rows that carry the sentinels: its purge, a refused archive, a refused
    restore, a restore whose inserts a trigger refuses quoting the row, and a restore that
    succeeds leave no value in logs, Dagster's records, metadata or spans."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
    from favorites_maintenance_tests.helpers.jobs import guest_settings_env, run_partition
    from favorites_maintenance_tests.helpers.policies import favorites_policy, location

    spans = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(spans))

    seed(engine, n=120)
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.set(password=PASSWORD)
                       .render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    defs = location(favorites_policy("archived", batch_size=25,
                                     archive_table="favorites.favorites_archive"))
    restore_job = defs.resolve_job_def("restore_archived_job")
    collected.caplog.clear()

    def record(result):
        collected.texts.append(everything_dagster_recorded(instance, result.run_id))
        collected.texts.extend(repr(e) for e in result.all_events)
        return result

    def restore(**config):
        return record(restore_job.execute_in_process(
            run_config={"ops": {"restore_archived": {"config": config}}}, instance=instance,
            raise_on_error=False))

    with dg.instance_for_test() as instance:
        # An archive lacking a column, refused before any delete.
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE favorites.favorites_archive (id bigint)")
        assert not record(run_partition(defs, instance, "2026-06-15", job="archived_cleanup_job",
                                        raise_on_error=False)).success
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE favorites.favorites_archive")
        purged = record(run_partition(defs, instance, "2026-06-15", job="archived_cleanup_job"))
        assert purged.success
        # Prunable rows refused; a key back in the table; then inserts refused quoting the row.
        assert not restore(run_id=purged.run_id).success
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO favorites.favorites (id, anonymous_id, item_id, note, updated_at) "
                "SELECT id, anonymous_id, 1, note, now() FROM favorites.favorites_archive "
                "ORDER BY id LIMIT 1")
            conn.exec_driver_sql("""
                CREATE FUNCTION favorites.refuse_insert() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.item_id % 2 = 0 THEN
                        RAISE EXCEPTION 'cannot restore %: %', NEW.anonymous_id, NEW.note
                            USING DETAIL = NEW.note;
                    END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER refuse_insert BEFORE INSERT ON favorites.favorites
                    FOR EACH ROW EXECUTE FUNCTION favorites.refuse_insert();""".replace("%", "%%"))
        partly = restore(run_id=purged.run_id, allow_prunable=True, batch_size=10)
        assert partly.success
        with engine.connect() as conn:
            left = conn.exec_driver_sql(
                "SELECT count(*) FROM favorites.favorites_archive").scalar_one()
        assert left > 1  # the key that came back, and the rows the trigger refused
    collected.texts += [repr(dict(s.attributes)) + (s.status.description or "")
                        for s in spans.get_finished_spans()]
    assert spans.get_finished_spans()
    collected.assert_clean()
