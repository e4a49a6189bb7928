"""Dagster's storage migrations are read once per test process, and an instance opened after
that is at the same head revision as one whose migrations were read afresh."""

from __future__ import annotations

import dagster as dg
import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext

from favorites_maintenance_tests.helpers import migration_scripts
from favorites_maintenance_tests.helpers.daemon import pg_instance


def _fresh_heads() -> set[str]:
    """The head revision of each location read so far, read again from its files."""
    heads = set()
    for (ini, location) in migration_scripts.scripts_read():
        config = migration_scripts.Config(ini)
        config.set_main_option("script_location", location)
        heads.add(migration_scripts._FROM_CONFIG(migration_scripts.ScriptDirectory, config)
                  .as_revision_number("head"))
    return heads


def test_a_second_instance_reuses_the_migrations_read_for_the_first(tmp_path):
    with dg.instance_for_test():
        pass
    first = migration_scripts.scripts_read()
    assert first, "no Dagster migrations were read through ScriptDirectory.from_config"
    with dg.instance_for_test():
        pass
    again = migration_scripts.scripts_read()
    assert again.keys() == first.keys()
    assert all(again[key] is first[key] for key in first)


def test_a_postgres_instance_is_stamped_at_the_head_of_the_migrations_on_disk(
        dagster_storage_url):
    with pg_instance(dagster_storage_url):
        pass
    engine = sa.create_engine(dagster_storage_url)
    try:
        with engine.connect() as conn:
            stamped = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    assert stamped in _fresh_heads()
