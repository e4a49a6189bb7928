"""Dagster's own storage (runs, events, ticks), as ``dagster.yaml`` names it.

It is dagster-postgres' storage on the PostgreSQL database of ``DAGSTER_POSTGRES_URL``, the
same as ``storage: postgres`` with ``postgres_url: {env: DAGSTER_POSTGRES_URL}``, with two
differences when that variable is unset:

- under Dagster's development server (``dg dev`` or ``dagster dev``, which set
  ``DAGSTER_IS_DEV_CLI``) in the package's own checkout
  (:func:`~favorites_maintenance.local.environment.project_root`), the checkout's embedded
  PostgreSQL server is started (or attached to) and serves both Dagster's storage and the favorites database, the dev table created and
  seeded when empty, as ``favorites-maintenance dev`` does;
- anywhere else (a deployment's webserver or daemon, an installed package, another project's
  development server), the instance refuses to load with one line naming the variable: no
  server is started and no file written.

The embedded server is left when the process that started it exits (the last process using
it stops it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster_postgres import DagsterPostgresStorage

from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.pipeline.dagster_internals import ConfigurableClassData

#: Dagster's storage URL: ``postgresql+psycopg2://user:password@host:5432/dagster``.
STORAGE_URL_VAR = "DAGSTER_POSTGRES_URL"
#: Set by ``dagster dev`` (and so ``dg dev``) in its own process before the instance loads.
DEV_CLI_VAR = "DAGSTER_IS_DEV_CLI"
#: Rows seeded into an empty dev table, as ``favorites-maintenance dev`` does by default.
DEV_ROWS = 200_000

#: The local environment started in this process, kept for its lifetime.
_local = None


class DeployedPostgresStorage(DagsterPostgresStorage):
    """The ``storage: custom`` class of ``dagster.yaml``: dagster-postgres' storage, its URL
    read as the module docstring says.

    Config:
        url_variable: the variable holding the storage URL (default ``DAGSTER_POSTGRES_URL``).
        should_autocreate_tables: as dagster-postgres' (default true).
    """

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"url_variable": dg.Field(str, default_value=STORAGE_URL_VAR, is_required=False),
                "should_autocreate_tables": dg.Field(bool, default_value=True,
                                                     is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData,
                          config_value: Mapping[str, Any]):
        """dagster-postgres' storage on the variable's URL (see the module docstring).

        Raises:
            SettingsError: the variable is unset or empty outside Dagster's development server.
        """
        variable = config_value.get("url_variable", STORAGE_URL_VAR)
        url = os.environ.get(variable, "").strip()
        if not url and os.environ.get(DEV_CLI_VAR) and variable == STORAGE_URL_VAR:
            url = _start_local_environment() or ""
        if not url:
            raise SettingsError(variable, "is not set: Dagster's storage needs the URL of its "
                                "PostgreSQL database, postgresql+psycopg2://user:password@host:"
                                "5432/dagster (docs/deploying.md); for a local UI run "
                                "`favorites-maintenance dev` or `dg dev`")
        return cls(
            postgres_url=url, inst_data=inst_data,
            should_autocreate_tables=config_value.get("should_autocreate_tables", True))


def _start_local_environment() -> str | None:
    """Start the checkout's embedded server for Dagster's development server, prepare the dev
    table, export the URLs for the processes it starts; return the storage URL (``None``
    outside the package's own checkout: nothing started)."""
    global _local
    from favorites_maintenance.config.deployment import load_deployment_settings
    from favorites_maintenance.local.dev import prepare_dev_table
    from favorites_maintenance.local.environment import (
        LocalEnvironment,
        NotACheckoutError,
        project_root,
    )
    from favorites_maintenance.retention.database import create_engine

    try:
        root = project_root()
    except NotACheckoutError:
        return None
    env = LocalEnvironment(root)
    print(f"{STORAGE_URL_VAR} is not set: Dagster's storage and the favorites database are the "
          f"embedded PostgreSQL server of this checkout ({env.state_dir / 'pgdata'}), as for "
          "`favorites-maintenance dev`", flush=True)
    env.start(dagster_home=False)
    engine = create_engine(load_deployment_settings().require_database_url())
    try:
        prepare_dev_table(engine, DEV_ROWS, lambda line: print(line, flush=True))
    finally:
        engine.dispose()
    _local = env
    return os.environ[STORAGE_URL_VAR]
