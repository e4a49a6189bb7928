"""Dagster's storage migrations read once per test process.

Each Dagster instance a test opens (``dg.instance_for_test``, ``pg_instance``) checks and stamps
its run, event log and schedule storage against Dagster's Alembic migrations, and Alembic's
``ScriptDirectory.from_config`` reads and executes every migration script anew each time: about
90 files, seven times per instance, about half of the CPU an instance costs to open. The
scripts are files of the installed Dagster that do not change while the tests run, so
:func:`read_migration_scripts_once` keeps the directory read for each location and hands it
out again. The storage itself is created, checked and stamped exactly as before, against the
same head revision; the processes a test starts (code servers, daemons, run workers) read the
scripts on their own, as a deployment's do.
"""

from __future__ import annotations

from alembic.config import Config
from alembic.script import ScriptDirectory

#: (Alembic ini file, its ``script_location``) -> the directory read from them.
_READ: dict[tuple[str | None, str], ScriptDirectory] = {}
_FROM_CONFIG = ScriptDirectory.from_config.__func__


def _from_config_once(cls, config: Config) -> ScriptDirectory:
    location = config.get_main_option("script_location")
    if location is None or cls is not ScriptDirectory:
        return _FROM_CONFIG(cls, config)
    key = (config.config_file_name, location)
    if key not in _READ:
        _READ[key] = _FROM_CONFIG(cls, config)
    return _READ[key]


def read_migration_scripts_once() -> None:
    """From now on in this process, ``ScriptDirectory.from_config`` reads the scripts of each
    Alembic ini file and script location once and returns that same directory for every later
    config naming them. Idempotent."""
    ScriptDirectory.from_config = classmethod(_from_config_once)


def scripts_read() -> dict[tuple[str | None, str], ScriptDirectory]:
    """The directories read so far, by (ini file, script location) (a copy)."""
    return dict(_READ)
