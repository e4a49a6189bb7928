"""What a change to the policies will delete, before it is deployed (``favorites-maintenance
plan``), as ``terraform plan`` shows what an apply will destroy.

The policies of a code location's defs folder are compared with those of a base: a git ref of
the same repository (its defs folder at that commit) or another folder of policy files. For each
policy added, removed or changed, the rows its new rule would delete now that the old one keeps
(``newly_prunable``) and the rows it stops deleting (``no_longer_prunable``) are counted on the
policy's own database, read only, by the database server's clock, with the project's own
predicates (:mod:`favorites_maintenance.retention.rule_change`); with ``drop_expired_partitions``
the partitions newly past the cutoff are named, and with an archive the archived rows a shorter
``archive_retention_days`` newly deletes are counted. docs/plan.md has the command and a CI
example.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.components.load_errors import PolicyLoadError
from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.config.deployment import require_database_url
from favorites_maintenance.config.parsers import SettingsError, safe_url
from favorites_maintenance.config.policy import Policy
from favorites_maintenance.config.policy_settings import SETTINGS, setting_text
from favorites_maintenance.pipeline.partitions import read_now
from favorites_maintenance.retention.archive_retention import count_overdue_archive
from favorites_maintenance.retention.database import create_engine, limit_transaction
from favorites_maintenance.retention.errors import RetentionError, describe
from favorites_maintenance.retention.table_partitions import leaf_partitions
from favorites_maintenance.retention.rule import compute_cutoff
from favorites_maintenance.retention.rule_change import count_prunable, count_rule_change

ADDED, REMOVED, CHANGED, UNCHANGED = "added", "removed", "changed", "unchanged"


class PlanBaseError(Exception):
    """The base of a plan could not be read: a git ref that does not resolve, a folder that
    does not exist, policy files that do not load (the message names which)."""


class PlanCountError(Exception):
    """Something a policy's plan counts is not there yet (an archive before its first run)."""


@dataclass
class PolicyPlan:
    """One policy's line of a plan.

    Attributes:
        name: the policy's name.
        change: ``added``, ``removed``, ``changed`` or ``unchanged``.
        settings_changed: for a changed policy, field -> ``{"from": text, "to": text}`` for
            every field of the rule and every setting that differs, as a policy file writes it
            (``None``: unset); see :func:`policy_fields`.
        newly_prunable: rows the new policy would delete now that the base's keeps (an added
            policy: its whole first backlog), or ``None`` when not counted (``error``).
        no_longer_prunable: rows the base's policy deletes now that the new one keeps (a
            removed policy: its whole backlog).
        partitions_newly_expired: ``schema.name`` of each partition a run would now detach
            (``drop_expired_partitions``) that the base's would keep attached.
        archive_newly_prunable: archived rows past the new ``archive_retention_days`` and not
            past the base's (deleted by the next run's archive retention); ``None`` when not
            counted (``error``).
        database: the database counted on, its password hidden (a policy moved to another
            database: ``<base's> -> <new>``).
        error: why the rows could not be counted, or ``None``.
    """

    name: str
    change: str
    settings_changed: dict[str, dict[str, str | None]] = field(default_factory=dict)
    newly_prunable: int | None = 0
    no_longer_prunable: int | None = 0
    partitions_newly_expired: list[str] = field(default_factory=list)
    archive_newly_prunable: int | None = 0
    database: str | None = None
    error: str | None = None

    @property
    def widening(self) -> int:
        """Rows the change newly deletes (table and archive), 0 when not counted."""
        return (self.newly_prunable or 0) + (self.archive_newly_prunable or 0)

    def as_json(self) -> dict:
        """The line as a JSON-ready dict (counts in rows)."""
        return dataclasses.asdict(self)


def policy_fields(policy: Policy) -> dict[str, str | None]:
    """Every field of ``policy`` that decides what it deletes and how, as a policy file writes
    it (``None``: unset): the rule's (``table``, ``key_column``, ``age_column``,
    ``null_columns``), ``database_url_env``, ``archive_table`` and each setting of
    :class:`~favorites_maintenance.config.policy_settings.PolicySettings`, a default included
    (writing a default out is no change)."""
    rule = policy.rule
    fields = {"table": rule.qualified_name, "key_column": rule.key.name,
              "age_column": rule.age.name,
              "null_columns": "[" + ", ".join(c.name for c in rule.guards) + "]",
              "database_url_env": policy.database_url_env,
              "archive_table": policy.archive_table}
    for name in SETTINGS:
        fields[name] = setting_text(getattr(policy.settings, name))
    return fields


def compare(base: Sequence[Policy], head: Sequence[Policy]) -> list[tuple[PolicyPlan,
                                                                          Policy | None,
                                                                          Policy | None]]:
    """Each policy of ``base`` or ``head`` by name, in name order: its uncounted plan line, the
    base's policy and the head's (``None`` where it has none)."""
    old, new = {p.name: p for p in base}, {p.name: p for p in head}
    lines = []
    for name in sorted(old.keys() | new.keys()):
        changed = {}
        if name in old and name in new:
            before, after = policy_fields(old[name]), policy_fields(new[name])
            changed = {k: {"from": before[k], "to": after[k]}
                       for k in before if before[k] != after[k]}
        kind = (ADDED if name not in old else REMOVED if name not in new
                else CHANGED if changed else UNCHANGED)
        lines.append((PolicyPlan(name, kind, changed), old.get(name), new.get(name)))
    return lines


def count(line: PolicyPlan, old: Policy | None, new: Policy | None) -> PolicyPlan:
    """Fill ``line``'s counts on the policies' databases (read only, by the database server's
    clock). What cannot be read (a database, a table, a partitioning or an archive not there
    yet) is the line's ``error`` and its count ``None``; what can is still counted, on that
    side and for the other policies. An unchanged policy is not counted (both rules admit the
    same rows)."""
    if line.change == UNCHANGED:
        return line
    errors: list[str] = []

    def attempt(what: str, read) -> None:
        try:
            read()
        except (SettingsError, RetentionError, PlanCountError, sa.exc.SQLAlchemyError) as exc:
            reason = describe(exc) if isinstance(exc, sa.exc.DBAPIError) else str(exc)
            errors.append(f"{what}: {reason}")
            setattr(line, what, None)

    if (old is not None and new is not None and old.database_url_env == new.database_url_env
            and old.rule.qualified_name == new.rule.qualified_name):
        def both() -> None:
            with _reading(new) as (conn, now, shown):
                line.database = shown
                change = count_rule_change(
                    conn, old.rule, compute_cutoff(now, old.settings.retention_days),
                    new.rule, compute_cutoff(now, new.settings.retention_days))
                line.newly_prunable = change.newly_prunable
                line.no_longer_prunable = change.no_longer_prunable
                line.partitions_newly_expired = _newly_expired(conn, old, new, now)

        attempt("newly_prunable", both)
        if line.newly_prunable is None:
            line.no_longer_prunable = None
    else:
        # Another table or database: the old rule's rows are no longer deleted there, the new
        # rule's first backlog is; each side read on its own.
        def old_side() -> None:
            with _reading(old) as (conn, now, shown):
                line.database = shown
                line.no_longer_prunable = count_prunable(
                    conn, old.rule, compute_cutoff(now, old.settings.retention_days))

        def new_side() -> None:
            with _reading(new) as (conn, now, shown):
                line.database = f"{line.database} -> {shown}" if line.database else shown
                line.newly_prunable = count_prunable(
                    conn, new.rule, compute_cutoff(now, new.settings.retention_days))
                line.partitions_newly_expired = _newly_expired(conn, None, new, now)

        if old is not None:
            attempt("no_longer_prunable", old_side)
        if new is not None:
            attempt("newly_prunable", new_side)
    if new is not None and new.archive_table is not None:
        def archive() -> None:
            line.archive_newly_prunable = _archive_newly_prunable(old, new)

        attempt("archive_newly_prunable", archive)
    if errors:
        line.error = f"could not count policy {line.name}'s rows: {'; '.join(errors)}"
    return line


@contextmanager
def _reading(policy: Policy) -> Iterator[tuple[sa.Connection, dt.datetime, str]]:
    """A read-only transaction on ``policy``'s database, bounded like the job's reads: the
    connection, the server's clock and the database's URL as shown (no password).

    Raises:
        SettingsError: the policy's database variable is unset or invalid, named.
    """
    url = require_database_url(policy.database_url_env)
    engine = create_engine(url)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(sa.text("SET TRANSACTION READ ONLY"))
            limit_transaction(conn)
            yield conn, read_now(conn).database, safe_url(url)
    finally:
        engine.dispose()


def _newly_expired(conn: sa.Connection, old: Policy | None, new: Policy,
                   now: dt.datetime) -> list[str]:
    """The partitions of ``new``'s table whose range ends by its cutoff and not by ``old``'s
    (or that ``old`` would not drop), for a policy with ``drop_expired_partitions``."""
    if not new.settings.drop_expired_partitions:
        return []
    rule = new.rule
    cutoff = compute_cutoff(now, new.settings.retention_days)
    before = None
    if old is not None and old.settings.drop_expired_partitions:
        before = compute_cutoff(now, old.settings.retention_days)
    return [f"{p.schema}.{p.name}"
            for p in leaf_partitions(conn, rule.table.schema, rule.table.name,
                                     age_column=rule.age.name)
            if not p.is_default and p.upper is not None and p.upper <= cutoff
            and (before is None or p.upper > before)]


def _archive_newly_prunable(old: Policy | None, new: Policy) -> int:
    """Archived rows of ``new``'s archive past its ``archive_retention_days`` and not past
    ``old``'s (all of them when ``old`` had another archive or none), each count a read of
    its own.

    Raises:
        SettingsError: the database variable is unset or invalid.
        PlanCountError: the archive does not exist yet.
        ArchiveCountError: the archive cannot be read.
    """
    engine = create_engine(require_database_url(new.database_url_env))
    try:
        with engine.connect() as conn:
            if conn.execute(sa.select(sa.func.to_regclass(new.archive_table))).scalar() is None:
                raise PlanCountError(f"archive {new.archive_table} does not exist yet (the "
                                     "policy's first run creates it)")
        def overdue(days: int) -> int:
            return count_overdue_archive(engine, new.archive_table, new.name, days,
                                         hold=new.rule.hold).rows

        after = overdue(new.settings.archive_retention_days)
        if old is None or old.archive_table != new.archive_table \
                or old.database_url_env != new.database_url_env:
            return after
        return max(0, after - overdue(old.settings.archive_retention_days))
    finally:
        engine.dispose()


def base_policies(base: str, tree: dg.ComponentTree) -> list[Policy]:
    """The policies of ``base``: a folder of policy files (``defs.yaml`` in sub-folders, as a
    defs folder), else a git ref of the repository holding ``tree``'s defs folder, read at
    that commit (none when the folder did not exist there).

    Raises:
        PlanBaseError: the ref does not resolve, git is missing, or the base's policy files do
            not load (their one-line errors).
    """
    folder = Path(base)
    with tempfile.TemporaryDirectory(prefix="favorites-plan-") as scratch:
        package = f"favorites_plan_base_{uuid.uuid4().hex[:12]}"
        target = Path(scratch) / package
        if folder.is_dir():
            shutil.copytree(folder, target, ignore=shutil.ignore_patterns("__pycache__"))
        elif not _export(base, tree.defs_module_path, target):
            return []
        (target / "__init__.py").touch()
        sys.path.insert(0, scratch)
        try:
            importlib.invalidate_caches()
            module = importlib.import_module(package)
            base_tree = dg.ComponentTree.from_module(defs_module=module,
                                                     project_root=Path(scratch))
            try:
                policies = load_policies(base_tree)
            except PolicyLoadError as exc:
                # Named by their path in the base, not in the scratch copy.
                shown = str(exc).replace(f"{package}/", "")
                raise PlanBaseError(f"--base {base}: its policies do not load: {shown}") from None
            if not policies and folder.is_dir():
                # Every policy would read as added: a wrong folder, not a first deployment.
                raise PlanBaseError(f"--base {base}: no policy file (<policy>/defs.yaml of type "
                                    "favorites_maintenance.RetentionPolicy) in that folder; "
                                    "give the defs folder holding the policies' folders")
            return policies
        finally:
            sys.path.remove(scratch)
            for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
                del sys.modules[name]


def _export(ref: str, defs_folder: Path, target: Path) -> bool:
    """Write ``defs_folder`` as it was at git ``ref`` into ``target``; ``False`` when the folder
    did not exist at that commit.

    Raises:
        PlanBaseError: git is missing, the folder is in no repository, or ``ref`` does not
            resolve to a commit.
    """
    def git(*args: str, where: Path = defs_folder) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(["git", "-C", str(where), *args], capture_output=True,
                                  check=False)
        except FileNotFoundError:
            raise PlanBaseError(f"--base {ref}: is not a folder, and git is not installed to "
                                "read it as a git ref") from None

    top = git("rev-parse", "--show-toplevel")
    if top.returncode:
        raise PlanBaseError(f"--base {ref}: is not a folder, and {defs_folder} is in no git "
                            "repository to read it as a git ref")
    if git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode:
        raise PlanBaseError(f"--base {ref}: neither a folder nor a git ref of "
                            f"{top.stdout.decode().strip()} (a branch, tag or commit)")
    root = Path(top.stdout.decode().strip()).resolve()
    relative = defs_folder.resolve().relative_to(root)
    # Paths are the repository's, not the working folder's.
    listed = git("ls-tree", "-d", "--name-only", ref, "--", relative.as_posix(), where=root)
    if not listed.stdout.strip():
        return False
    archive = git("archive", "--format=tar", ref, "--", relative.as_posix(), where=root)
    if archive.returncode:
        raise PlanBaseError(f"--base {ref}: git archive failed: "
                            f"{archive.stderr.decode().strip()}")
    with tempfile.TemporaryDirectory() as unpacked:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(unpacked, filter="data")
        shutil.copytree(Path(unpacked) / relative, target,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return True
