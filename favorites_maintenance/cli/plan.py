"""``plan``: what a change to the policies would newly delete, counted on each policy's
database (:mod:`favorites_maintenance.plan`)."""

from __future__ import annotations

import sys

import click

from favorites_maintenance.cli.common import (
    check_deployment_settings,
    echo,
    fail,
    location_option,
    location_tree,
)


@click.command(short_help="Show what a change to the policies will delete; delete nothing.")
@location_option
@click.option("--base", required=True, metavar="REF|FOLDER",
              help="What the policies are compared with: a git ref of the repository (main, "
                   "origin/main, a commit), read at that commit, or a folder of policy files.")
@click.option("--max-newly-prunable", default=0, show_default=True, type=click.IntRange(min=0),
              help="Exit 1 when a policy would newly delete more rows than this (its table "
                   "and its archive; an added policy: its first backlog).")
@click.option("--allow-widening", is_flag=True,
              help="Report widening changes without failing on them.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
def plan(base: str, max_newly_prunable: int, allow_widening: bool, as_json: bool) -> None:
    """Compare the policies of the code location with those of --base: for every policy
    added, removed or changed, count on its own database (read only) the rows its new rule
    would delete now that the old one keeps, and the rows it stops deleting; list the settings
    that changed, the partitions newly past the cutoff (drop_expired_partitions) and the
    archived rows a shorter archive retention deletes.

    Exit codes: 0, nothing widens past --max-newly-prunable (or --allow-widening); 1, a policy
    would newly delete more rows than that; 2, the base, a policy or a database could not be
    read (the other policies are still counted).
    """
    import json

    from favorites_maintenance.components.load_errors import PolicyLoadError
    from favorites_maintenance.components.policy_tree import load_policies
    from favorites_maintenance.plan import PlanBaseError, base_policies, compare, count

    check_deployment_settings()
    tree = location_tree()
    try:
        head = load_policies(tree)
        old = base_policies(base, tree)
    except (PolicyLoadError, PlanBaseError) as exc:
        fail(str(exc))
    lines = [count(line, before, after) for line, before, after in compare(old, head)]
    widening = [line for line in lines if line.widening > max_newly_prunable]
    if as_json:
        echo(json.dumps({"base": base, "policies": [line.as_json() for line in lines],
                          "max_newly_prunable": max_newly_prunable,
                          "widening": [line.name for line in widening]}, indent=2))
    else:
        for line in lines:
            _echo_plan(line)
    for line in lines:
        if line.error:
            click.secho(f"error: {line.error}", fg="red", err=True)
    if widening and not allow_widening:
        click.secho(f"error: {', '.join(line.name for line in widening)}: would newly delete "
                    f"more than --max-newly-prunable {max_newly_prunable} rows; check the "
                    "change, then pass --allow-widening (or raise the limit) to accept it",
                    fg="red", err=True)
    if any(line.error for line in lines):
        sys.exit(2)
    if widening and not allow_widening:
        sys.exit(1)


def _echo_plan(line) -> None:
    """The text form of one policy's plan line."""
    echo(f"{line.change:<10} {line.name}" + (f" ({line.database})" if line.database else ""))
    for name, values in line.settings_changed.items():
        echo(f"           {name}: {values['from'] or 'unset'} -> {values['to'] or 'unset'}")
    if line.change == "unchanged":
        return

    def rows(count: int | None) -> str:
        return "not counted" if count is None else f"{count:,} rows"

    echo(f"           newly prunable {rows(line.newly_prunable)}, no longer prunable "
          f"{rows(line.no_longer_prunable)}")
    if line.partitions_newly_expired:
        echo(f"           partitions newly detached: {', '.join(line.partitions_newly_expired)}")
    if line.archive_newly_prunable:
        echo(f"           archived rows newly past the archive retention: "
              f"{line.archive_newly_prunable:,}")
