"""The retention core's purge as the tests call it: on the dev table's guest rule unless a test
names another, with the purge's settings as keywords."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.retention.archive import ArchiveTarget
from favorites_maintenance.retention.batch_loop import PurgeOptions
from favorites_maintenance.retention.purge import purge
from favorites_maintenance.retention.report import BatchResult, PurgeReport
from favorites_maintenance.retention.rule import RetentionRule


def purge_rows(engine: sa.Engine, cutoff: dt.datetime, *,
               rule: RetentionRule = GUEST_FAVORITES,
               should_stop: Callable[[], bool] = lambda: False,
               on_batch: Callable[[BatchResult], None] | None = None,
               archive: ArchiveTarget | None = None, **options: Any) -> PurgeReport:
    """:func:`~favorites_maintenance.retention.purge.purge` of ``rule`` at ``cutoff``, its
    :class:`~favorites_maintenance.retention.batch_loop.PurgeOptions` built from ``options``
    (``batch_size`` and ``max_run_duration`` at least); raises what the purge raises."""
    return purge(engine, rule, cutoff, PurgeOptions(**options), should_stop=should_stop,
                 on_batch=on_batch, archive=archive)
