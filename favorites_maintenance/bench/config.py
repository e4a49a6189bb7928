"""What ``favorites-maintenance bench`` measures: :class:`BenchConfig`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from favorites_maintenance.bench.strategies import STRATEGIES
from favorites_maintenance.config.policy_settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_RUN_DURATION,
    DEFAULT_RETENTION_DAYS,
)

DEFAULT_ROWS = 2_000_000


@dataclass
class BenchConfig:
    """What to measure.

    Attributes:
        rows: size of the data set (the 10% run uses ``rows // 10``).
        strategies: which strategies to run, in order (``B`` is needed for the ratios).
        seed: ``setseed()`` value of the data set.
        idle_seconds: length of the idle window of the user workload before each purge.
        repeat: full-size runs of each strategy, in rounds; the run of median throughput is
            reported (all throughputs are kept in ``rows_per_second_runs``).
        user_ops_per_second: pace of the user workload.
        out: where the JSON goes (``None``: nowhere).
        db_prefix: prefix of the databases the bench creates (and drops) on the server.
        echo: progress lines.
    """

    rows: int = DEFAULT_ROWS
    strategies: Sequence[str] = STRATEGIES
    seed: float = 0.42
    idle_seconds: float = 5.0
    repeat: int = 1
    user_ops_per_second: float = 200.0
    out: Path | None = Path("bench-results/purge.json")
    db_prefix: str = "bench"
    retention_days: int = DEFAULT_RETENTION_DAYS
    batch_size: int = DEFAULT_BATCH_SIZE
    max_run_duration: dt.timedelta = DEFAULT_MAX_RUN_DURATION
    echo: Callable[[str], None] = print
    extra: dict[str, Any] = field(default_factory=dict)
