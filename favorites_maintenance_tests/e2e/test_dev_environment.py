"""The environment ``favorites-maintenance dev`` gives ``dagster dev`` and the processes it
starts: Dagster's two warnings a user of ``dev`` cannot act on are filtered, and nothing else.

A Python process started with that environment raises the warnings, as Dagster's processes
would, and its standard error is read.
"""

import subprocess
import sys

from favorites_maintenance.local.dev import dev_environment

#: Dagster's two warnings ``dev`` filters, two of the same categories it keeps, and the
#: user's own.
RAISE_WARNINGS = """
import warnings
import dagster as dg

warnings.warn("Function `dev_command` is superseded and its usage is discouraged. Use 'dg "
              "dev' instead.", dg.SupersessionWarning)
warnings.warn("Parameter `execution_type` of function `AssetsDefinition.__init__` is currently "
              "in beta, and may have breaking changes in minor version releases.",
              dg.BetaWarning)
warnings.warn("Function `other_command` is superseded and its usage is discouraged.",
              dg.SupersessionWarning)
warnings.warn("Parameter `partitions_def` of function `asset_check` is currently in beta.",
              dg.BetaWarning)
warnings.warn("the user's own", UserWarning)
warnings.warn("deprecated by the user", DeprecationWarning)
"""


def _stderr(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", RAISE_WARNINGS], env=env, capture_output=True,
                          text=True, timeout=120, check=True).stderr


def test_dev_filters_dagster_s_two_warnings_and_keeps_the_others(monkeypatch):
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    shown = _stderr(dev_environment())
    assert "dev_command" not in shown and "execution_type" not in shown, shown
    assert "other_command" in shown and "partitions_def" in shown, shown
    assert "the user's own" in shown


def test_dev_keeps_the_user_s_own_warning_filters(monkeypatch):
    # A filter of the user's that shows what Python hides by default, and one malformed entry
    # (Python ignores it with a note of its own).
    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning,not a filter")
    env = dev_environment()
    assert env["PYTHONWARNINGS"].startswith("default::DeprecationWarning,not a filter,")
    shown = _stderr(env)
    assert "deprecated by the user" in shown, shown
    assert "dev_command" not in shown and "execution_type" not in shown, shown
