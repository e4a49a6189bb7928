"""What ``favorites-maintenance bench`` measures: :class:`BenchConfig`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from favorites_maintenance.bench.strategies import DAILY_STRATEGIES, STRATEGIES
from favorites_maintenance.config.policy_settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_RUN_DURATION,
    DEFAULT_RETENTION_DAYS,
)

DEFAULT_ROWS = 2_000_000
#: The data set of the ``daily`` scenario.
DEFAULT_DAILY_ROWS = 10_000_000
#: The scenarios: ``backlog`` (every prunable row of a fresh data set), ``daily`` (the day's
#: newly expired rows of a data set whose backlog was cleared).
SCENARIOS = ("backlog", "daily")
#: ``sleep_ratio`` of strategy ``A_paced``.
DEFAULT_PACED_SLEEP_RATIO = 3.0


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
        scenarios: which of :data:`SCENARIOS` to run, in order.
        daily_rows: the size of the ``daily`` scenario's data set.
        daily_strategies: the strategies of the ``daily`` scenario.
        paced_sleep_ratio: ``sleep_ratio`` of ``A_paced``.
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
    scenarios: Sequence[str] = ("backlog",)
    daily_rows: int = DEFAULT_DAILY_ROWS
    daily_strategies: Sequence[str] = DAILY_STRATEGIES
    paced_sleep_ratio: float = DEFAULT_PACED_SLEEP_RATIO
