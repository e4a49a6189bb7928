"""What the commands share: their output and exit, the ``--policy`` and ``-m`` options, the
policies of the code location they read, and an engine on a policy's own database."""

from __future__ import annotations

import sys

import click
import sqlalchemy as sa
from sqlalchemy.engine import URL

from favorites_maintenance.config.deployment import (
    DeploymentSettings,
    load_deployment_settings,
)
from favorites_maintenance.config.parsers import SettingsError


def echo(message: str) -> None:
    click.echo(message, err=False)


def fail(message: str) -> None:
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(2)


def check_deployment_settings() -> DeploymentSettings:
    """The deployment's settings, or exit naming the variable at fault."""
    try:
        return load_deployment_settings()
    except SettingsError as exc:
        fail(str(exc))


#: The policy a command reads without ``--policy``, when the code location has it.
DEFAULT_POLICY = "guest_favorites"


def policy_option(command):
    """``--policy NAME``: the policy a command reads; left out, ``guest_favorites`` when the
    code location has it, else the code location's only policy (see :func:`load_policy`)."""
    return click.option(
        "--policy", "policy_name", default=None, metavar="NAME",
        help=f"The retention policy, by the name its defs.yaml gives it "
             f"(<defs folder>/<folder>/defs.yaml); default: {DEFAULT_POLICY} when the code "
             f"location has it, else its only policy.",
    )(command)


#: The code location of the commands that read policies (``-m``, else the working folder's
#: ``[tool.dg]`` project): set by :func:`location_option`.
_location: dict[str, str | None] = {"module_name": None}


def location_option(command):
    """``-m/--module-name``: the code location whose policies the command reads."""
    def remember(ctx, param, value):
        _location["module_name"] = value
        return value

    return click.option(
        "-m", "--module-name", default=None, metavar="MODULE", expose_value=False,
        callback=remember, is_eager=True,
        help="The code location's module (my_platform.definitions), as Dagster's command line "
             "takes it; default: the [tool.dg] project of the working folder, else, in its own "
             "checkout, this package's policies.")(command)


def location_tree():
    """The component tree of the code location the command reads (see
    :func:`~favorites_maintenance.components.policy_tree.project_tree`); exits naming what
    to give when there is none."""
    from favorites_maintenance.components.load_errors import PolicyLoadError
    from favorites_maintenance.components.policy_tree import project_tree

    try:
        return project_tree(_location["module_name"])
    except PolicyLoadError as exc:
        fail(str(exc))


def load_policy(name: str | None, *, local: bool = False):
    """The policy ``name`` of the code location the command reads (:func:`location_tree`:
    ``-m``, else the working folder's project, else ``favorites_maintenance/defs/``), its
    settings validated, loaded alone: each broken policy file beside it is named on one line,
    and the command goes on. ``name`` ``None`` (no ``--policy``): :data:`DEFAULT_POLICY` when
    the code location has it, else its only policy file (see :func:`_default_policy`). Exit
    with the policy's own error when it is the broken one, or naming the valid ones when there
    is no such policy (or, without ``--policy``, none, or several and no default). ``local``:
    also the policy of the second embedded database of ``demo`` and ``dev``."""
    from favorites_maintenance.components.load_errors import PolicyLoadError
    from favorites_maintenance.components.policy_tree import load_policies, policy_files

    tree = location_tree()
    files = policy_files(tree)
    policies = {p.name: p for f in files for p in f.policies}
    broken = [f for f in files if f.error]
    where = f"{_shown_folder(tree.defs_module_path)}/<policy>/defs.yaml"
    if name is None:
        name = _default_policy(sorted(policies), broken, where)
    extra: list[str] = []
    if local:
        from favorites_maintenance.local.second_database import second_tree

        try:
            second = {p.name: p for p in load_policies(second_tree())}
        except PolicyLoadError as exc:
            fail(str(exc))
        extra = [n for n in sorted(second) if n not in policies]
        policies.update(second)
    if name not in policies:
        own = [f.error for f in broken if _declares(f.path, name)]
        if own:
            fail(own[0])
        located = sorted(n for n in policies if n not in extra)
        fail(f"--policy {name!r}: no such policy; the policies are "
             f"{', '.join(located) or 'none'} ({where})"
             + (f", and {', '.join(extra)} (the second embedded database of this package)"
                if extra else "")
             + "".join(f"\n{f.error}" for f in broken))
    for f in broken:
        warn_broken(f.error)
    return policies[name]


def _default_policy(valid: list[str], broken, where: str) -> str:
    """The policy a command reads without ``--policy``: :data:`DEFAULT_POLICY` among the
    ``valid`` names, else the code location's only policy file, broken or not (a broken one
    then fails with its own error). Exit saying what to do when there is none, or several: a
    broken file beside a valid one may be the policy meant."""
    from favorites_maintenance.components.policy_tree import declared_name

    if DEFAULT_POLICY in valid:
        return DEFAULT_POLICY
    unloaded = sorted(declared_name(f.path) for f in broken)
    if len(valid) + len(unloaded) == 1:
        return [*valid, *unloaded][0]
    if not valid and not unloaded:
        fail(f"the code location has no policy ({where}); write one with "
             f"dg scaffold defs favorites_maintenance.RetentionPolicy NAME, or give -m")
    shown = [*valid, *(f"{n} (does not load)" for n in unloaded)]
    fail(f"--policy is required: the code location has {len(shown)} policies, "
         f"{', '.join(shown)} ({where})")


def _shown_folder(path) -> str:
    """``path`` relative to the working folder when it is under it."""
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def warn_broken(error: str) -> None:
    """One line about a broken policy file beside the one a command uses."""
    click.secho(f"warning: {error} (not loaded; the code location does not load until it is "
                "fixed)", fg="yellow", err=True)


def _declares(path, name: str) -> bool:
    """Whether the policy file ``path`` names its policy ``name`` (or, unnamed, its folder)."""
    from favorites_maintenance.components.policy_tree import declared_name

    return declared_name(path) == name


def prunable_rows_at(policy, partition: str | None, engine: sa.Engine):
    """What ``policy``'s rule matches for a run of daily ``partition`` now, by the clock of
    ``engine``'s database server (``None``: a run without a partition), the cutoff as the job
    computes it; exits naming ``--partition`` when it is not one of the policy's days.

    Raises:
        ConnectError: the database's clock could not be read.
    """
    from favorites_maintenance.pipeline.partitions import policy_partitions
    from favorites_maintenance.testing import prunable_rows

    days = policy_partitions(policy)
    if partition is not None and not days.has_partition_key(partition):
        fail(f"--partition {partition!r} is not a day of policy {policy.name} (YYYY-MM-DD, "
              f"from {days.get_first_partition_key()} to yesterday)")
    try:
        return prunable_rows(policy, partition=partition, database=engine)
    except ValueError as exc:
        fail(f"--partition {exc}")


def policy_engine(policy, *, needed_for: str | None = None,
                  fail_fast: bool = True) -> tuple[sa.Engine, URL]:
    """An engine on ``policy``'s own database, from the variable its ``database_url_env``
    names, and the URL it was built from (for messages, through ``safe_url``); the caller
    disposes of the engine. Opens no connection.

    Exits naming the variable when it is unset, empty or not a usable URL, with ``needed_for``
    (what needs the database) in brackets after the reason; with ``fail_fast=False`` raises
    instead, for a command that reports the error and goes on to the next policy.

    Raises:
        SettingsError: with ``fail_fast=False``, the variable is unset, empty or not a usable
            URL (the message names it).
        ConnectOptionError: an option of the URL's query the driver cannot take.
    """
    from favorites_maintenance.config.deployment import require_database_url
    from favorites_maintenance.retention.database import create_engine

    try:
        url = require_database_url(policy.database_url_env)
    except SettingsError as exc:
        if not fail_fast:
            raise
        fail(f"{exc} ({needed_for})" if needed_for else str(exc))
    return create_engine(url), url
