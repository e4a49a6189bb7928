"""The second database of ``favorites-maintenance dev`` and ``demo``: two policies on two
databases, to see in the UI.

The embedded server holds a second favorites database, ``favorites_eu``, whose URL the
local commands export as ``FAVORITES_EU_DATABASE_URL`` (an exported value is replaced: the
local commands only ever touch their embedded server). The policy ``eu_guest_favorites``
(``second_database_defs/``) names that variable in its ``database_url_env``, so it gets its own
database resource, its own database pool and its own run tag beside ``guest_favorites``, and
its runs go in parallel with those of ``guest_favorites``.

``dev`` serves :func:`defs` (the deployed code location plus this policy) as the code location
``favorites_maintenance``; the deployed code location (``workspace.yaml``) never holds this
policy.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from favorites_maintenance.local.embedded import EmbeddedPostgres

#: The second database on the embedded server, its variable, and the policy on it.
EU_DATABASE = "favorites_eu"
EU_URL_VAR = "FAVORITES_EU_DATABASE_URL"
EU_POLICY = "eu_guest_favorites"
#: The location name of the deployed code location: dev's UI reads the same.
LOCATION_NAME = "favorites_maintenance"


def export_eu_database(server: EmbeddedPostgres) -> None:
    """Create the ``favorites_eu`` database on ``server`` if missing and export its URL as
    ``FAVORITES_EU_DATABASE_URL`` in this process's environment (child processes, the
    code server and the runs, inherit it)."""
    url = server.ensure_database(EU_DATABASE)
    os.environ[EU_URL_VAR] = url.render_as_string(hide_password=False)


def second_tree() -> dg.ComponentTree:
    """The component tree of ``second_database_defs/``: the policy of the second database."""
    from favorites_maintenance.components.policy_tree import PROJECT_ROOT
    from favorites_maintenance.local import second_database_defs

    return dg.ComponentTree.from_module(defs_module=second_database_defs,
                                        project_root=PROJECT_ROOT)


def local_policies():
    """Every policy ``dev`` and ``demo`` serve: those of ``favorites_maintenance/defs/``, then
    that of the second database (:class:`~favorites_maintenance.config.policy.Policy` list).

    Raises:
        favorites_maintenance.components.load_errors.PolicyLoadError: as for the code location.
    """
    from favorites_maintenance.components.policy_tree import load_policies

    return [*load_policies(), *load_policies(second_tree())]


def local_code_location(tree: dg.ComponentTree | None = None,
                        only: str | None = None) -> dg.Definitions:
    """The policies of ``tree`` (default: the deployed code location's,
    ``favorites_maintenance/defs/``) plus the policy of the second database (``only``: policy
    ``only`` alone, see :func:`~favorites_maintenance.components.policy_tree.code_location`)."""
    from favorites_maintenance.components.policy_tree import code_location

    return code_location(tree, second_tree(), only=only)


@dg.definitions
def defs() -> dg.Definitions:
    """The code location ``dev`` serves (see :func:`write_workspace`): the deployed one, loaded
    by Dagster's stock loader, and the second database's policy, loaded by the same component
    (an invalid setting or policy is its load error in one line, as for the deployed one)."""
    from favorites_maintenance.components.policy_tree import merge_trees

    return merge_trees(dg.ComponentTree.for_project(Path(__file__).parent), second_tree())


def write_workspace(folder: Path) -> Path:
    """Write ``folder/workspace.yaml``, the workspace of ``dev``: this module's :func:`defs`
    under the deployed location's name; return its path."""
    path = folder / "workspace.yaml"
    path.write_text(
        "# Written by `favorites-maintenance dev`: the deployed code location plus the policy of\n"
        "# the second embedded database (favorites_maintenance/local/second_database.py).\n"
        "load_from:\n"
        "  - python_module:\n"
        f"      module_name: {__name__}\n"
        f"      location_name: {LOCATION_NAME}\n")
    return path


def prepare_eu_table(rows: int, echo: Callable[[str], None], reseed: bool = False) -> None:
    """Create and seed the dev table of the second database as ``dev`` does the first one's
    (:func:`~favorites_maintenance.local.dev.prepare_dev_table`), ``rows`` rows when it is
    empty; its lines start with the database's name."""
    from favorites_maintenance.config.deployment import require_database_url
    from favorites_maintenance.local.dev import prepare_dev_table
    from favorites_maintenance.retention.database import create_engine

    engine = create_engine(require_database_url(EU_URL_VAR))
    try:
        prepare_dev_table(engine, rows, lambda line: echo(f"{EU_DATABASE}: {line}"),
                          reseed=reseed)
    finally:
        engine.dispose()
