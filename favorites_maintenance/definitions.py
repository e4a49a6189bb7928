"""The code location: every retention policy of ``favorites_maintenance/defs/``, loaded by
Dagster's stock loader, as any project's ``definitions.py`` loads its defs folder
(docs/adopting.md). Each policy's definitions carry the resources they use; a policy or
setting that is not valid stops the load with one line naming it (README, "Adding a retention
policy").
"""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    """Every policy of ``favorites_maintenance/defs/`` with its checks, job, schedule and
    resources, and the sensors every policy shares."""
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
