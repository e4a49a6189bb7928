"""The ``favorites-maintenance`` command line.

- ``demo``: the embedded PostgreSQL, a seeded dev table, one run of the job through Dagster on a
  persistent instance, and a summary of what happened.
- ``dry-run``: how many rows a policy's rule matches now and at its next scheduled run,
  deleting nothing (Laravel's ``--pretend``); ``--all`` policies, ``--json``.

``demo`` and ``dry-run`` take ``--policy NAME`` (default ``guest_favorites``): one of the
policies of ``favorites_maintenance/defs/``.
- ``dev``: the Dagster UI and daemon (``dagster dev``) on the embedded PostgreSQL server, with a
  seeded dev table, until Ctrl-C.
- ``bench``: the purge against the physical limit and the usual alternatives.
- ``restore``: a policy's archived rows back into its table (its ``restore_<policy>_job``).
- ``hold``: place, release and list the holds that keep rows from a policy's runs
  (``hold init`` creates the hold table).
- ``plan``: what a change to the policies (against a git ref or a folder) would newly delete,
  counted on each policy's database; exits 1 when a change widens past a limit.
- ``partition-functions``: the SQL that installs the owner's functions a policy with
  ``drop_expired_partitions`` calls under a least-privileged role, for ``psql -f -``.

The group is here; each family of commands has its module (``local``: ``demo`` and ``dev``;
``policies``: ``dry-run``, ``partition-functions``, ``restore``; ``plan``; ``bench``;
``holds``: ``hold``), and ``common`` what they share.
"""

from __future__ import annotations

import click

from favorites_maintenance.cli.bench import bench
from favorites_maintenance.cli.grants import grants
from favorites_maintenance.cli.holds import hold
from favorites_maintenance.cli.local import demo, dev
from favorites_maintenance.cli.plan import plan
from favorites_maintenance.cli.policies import dry_run, partition_functions, restore


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="favorites-maintenance", prog_name="favorites-maintenance")
def main() -> None:
    """Daily retention cleanup of PostgreSQL tables, one policy per table (Dagster +
    PostgreSQL); the first policy prunes stale guest favorites."""


for _command in (demo, dry_run, plan, partition_functions, grants, restore, dev, bench,
                 hold):
    main.add_command(_command)
