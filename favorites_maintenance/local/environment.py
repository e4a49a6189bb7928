"""The local environment of ``favorites-maintenance demo|dev``: the embedded PostgreSQL server
serving both the favorites database and Dagster's storage, and a persistent ``DAGSTER_HOME``.

Everything lives in ``.favorites-maintenance/`` of the checkout (ignored by git), so runs stay
in Dagster's history from one command to the next.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from favorites_maintenance.config.parsers import METRICS_PUSHGATEWAY_URL_VAR
from favorites_maintenance.local.embedded import (
    DAGSTER_DATABASE,
    FAVORITES_DATABASE,
    EmbeddedPostgres,
)
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR

#: The deployment's monitoring, which the local commands never feed.
MONITORING_VARIABLES = (METRICS_PUSHGATEWAY_URL_VAR, "OTEL_EXPORTER_OTLP_ENDPOINT",
                        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

STATE_DIR = ".favorites-maintenance"
DAGSTER_STORAGE_URL_VAR = "DAGSTER_POSTGRES_URL"


#: What the workspace of the package's own checkout serves.
_OWN_LOCATION = "favorites_maintenance."


class NotACheckoutError(RuntimeError):
    """The embedded server was asked for outside the package's own checkout: the package is
    installed (a wheel in ``site-packages``), or the working folder is another project's."""


def _installed() -> bool:
    """Whether the package runs from an installed copy (a wheel), not from its checkout."""
    return any(part in ("site-packages", "dist-packages")
               for part in Path(__file__).resolve().parts)


def project_root(start: Path | None = None) -> Path:
    """The package's own checkout: the nearest folder from ``start`` (default: cwd) up holding
    ``dagster.yaml`` and a ``workspace.yaml`` that serves ``favorites_maintenance``, else the
    folder above the package when it runs from its checkout. Only there may ``demo``, ``dev``
    and Dagster's development server start the embedded server and write its files.

    Raises:
        NotACheckoutError: the package is installed (a wheel), or neither folder is its
            checkout (another project's, whatever its ``dagster.yaml``).
    """
    if _installed():
        raise NotACheckoutError(
            "favorites-maintenance is installed, not run from its checkout: its embedded "
            "PostgreSQL server is for its own checkout only (git clone, pip install -e .); "
            "point DAGSTER_POSTGRES_URL and the policies' database variables at your servers "
            "(docs/adopting.md)")
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        workspace = folder / "workspace.yaml"
        if workspace.is_file() and (folder / "dagster.yaml").is_file():
            if _OWN_LOCATION in workspace.read_text():
                return folder
            break  # another project's: never start a server in it
    package_root = Path(__file__).resolve().parents[2]
    if (package_root / "workspace.yaml").is_file() and here.is_relative_to(package_root):
        return package_root
    raise NotACheckoutError(
        f"{here} is not favorites-maintenance's checkout: its embedded PostgreSQL server starts "
        "only there; run from the checkout, or set DAGSTER_POSTGRES_URL (docs/adopting.md)")


@dataclass
class LocalEnvironment:
    """The embedded server and ``DAGSTER_HOME`` under ``root/.favorites-maintenance``.

    Attributes:
        root: the checkout (holds ``dagster.yaml`` and ``workspace.yaml``).
        server: the embedded PostgreSQL server (started by :meth:`start`).
    """

    root: Path
    server: EmbeddedPostgres | None = None
    replaced_database_url: bool = False
    #: Variables of the deployment's monitoring that were set and are ignored here.
    ignored_variables: tuple[str, ...] = ()

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def dagster_home(self) -> Path:
        return self.state_dir / "dagster_home"

    def start(self, *, dagster_home: bool = True) -> "LocalEnvironment":
        """Start the server, create its databases, write ``DAGSTER_HOME/dagster.yaml`` and
        export ``FAVORITES_DATABASE_URL``, ``FAVORITES_EU_DATABASE_URL`` (the second
        database, :mod:`~favorites_maintenance.local.second_database`), ``DAGSTER_POSTGRES_URL``
        and ``DAGSTER_HOME`` into this process's environment (child processes inherit them).
        Without ``dagster_home`` (Dagster's development server, which chose its instance folder
        already), neither the folder nor ``DAGSTER_HOME`` is touched.

        An exported ``FAVORITES_DATABASE_URL`` is replaced (in this process only) by the embedded
        database, and :attr:`replaced_database_url` says so: the local commands recreate and seed
        the dev table, which must never touch another database. The Pushgateway URL and the
        OTLP endpoints are removed the same way (:attr:`ignored_variables`): a local run must
        not overwrite the deployment's gauges nor send spans to its collector.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The server process runs as an unprivileged user when we are root: it must reach pgdata.
        os.chmod(self.state_dir, 0o755)
        self.server = EmbeddedPostgres(self.state_dir / "pgdata").start()
        favorites_url = self.server.ensure_database(FAVORITES_DATABASE)
        self.server.ensure_database(DAGSTER_DATABASE)
        storage_url = self.server.url(DAGSTER_DATABASE, driver="postgresql+psycopg2")
        if dagster_home:
            self.dagster_home.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.root / "dagster.yaml", self.dagster_home / "dagster.yaml")
        # Always the embedded database: demo and dev recreate or seed the table, which must never
        # happen to a database named by an exported FAVORITES_DATABASE_URL.
        self.replaced_database_url = DATABASE_URL_VAR in os.environ
        os.environ[DATABASE_URL_VAR] = favorites_url.render_as_string(False)
        # The second database, its policy's (FAVORITES_EU_DATABASE_URL): embedded too.
        from favorites_maintenance.local.second_database import export_eu_database

        export_eu_database(self.server)
        # Nor may a local run overwrite the deployment's gauges or join its traces.
        self.ignored_variables = tuple(v for v in MONITORING_VARIABLES if v in os.environ)
        for variable in self.ignored_variables:
            del os.environ[variable]
        os.environ[DAGSTER_STORAGE_URL_VAR] = storage_url.render_as_string(False)
        if dagster_home:
            os.environ["DAGSTER_HOME"] = str(self.dagster_home)
        return self

    def stop(self) -> bool:
        """Leave the embedded server: stop it unless another live process uses it.

        Returns:
            True if the server is stopped now, False if it was left running for the others
            (see :meth:`~favorites_maintenance.local.embedded.EmbeddedPostgres.stop`).
        """
        if self.server is None:
            return True
        stopped = self.server.stop()
        self.server = None
        return stopped
