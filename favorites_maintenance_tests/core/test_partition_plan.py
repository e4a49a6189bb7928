"""Which partitions of a range-partitioned table get a purge step, on a real server: those
holding a row the rule prunes, whatever their bounds say, and nothing else."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.errors import TableShapeError
from favorites_maintenance.retention.partition_plan import prunable_partitions
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.local.guest_favorites import (
    create_partitioned_dev_schema,
    dev_favorites,
    drop_dev_schema,
    month_starts,
)
from favorites_maintenance_tests.helpers.partitioned import erasure_log
from favorites_maintenance_tests.helpers.purging import purge_rows

UTC = dt.UTC
CUTOFF = dt.datetime(2024, 3, 15, tzinfo=UTC)


@pytest.fixture
def monthly(db_url):
    """Six monthly partitions from 2024-01 and a default one."""
    engine = create_engine(db_url)
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, month_starts(dt.datetime(2024, 1, 1, tzinfo=UTC), 6),
                                  default_partition=True)
    yield engine
    engine.dispose()


def add(engine, at: dt.datetime, *, user_id: int | None = None) -> int:
    with engine.begin() as conn:
        return conn.execute(sa.insert(dev_favorites).returning(dev_favorites.c.id), {
            "user_id": user_id,
            "anonymous_id": None if user_id else "00000000-0000-4000-8000-000000000001",
            "item_id": 1, "created_at": at, "updated_at": at}).scalar_one()


def names(partitions) -> list[str]:
    return [p.name for p in partitions]


def test_only_partitions_holding_a_prunable_row_are_listed_oldest_first(monthly):
    add(monthly, dt.datetime(2024, 2, 10, tzinfo=UTC))             # prunable
    add(monthly, dt.datetime(2024, 1, 5, tzinfo=UTC), user_id=3)   # an account row alone
    add(monthly, dt.datetime(2024, 3, 1, tzinfo=UTC))              # before the cutoff
    add(monthly, dt.datetime(2024, 3, 20, tzinfo=UTC))             # same month, after it
    add(monthly, dt.datetime(2024, 4, 2, tzinfo=UTC))              # after the cutoff
    add(monthly, dt.datetime(2023, 6, 1, tzinfo=UTC))              # the default partition

    found = prunable_partitions(monthly, GUEST_FAVORITES, CUTOFF)

    assert names(found) == ["favorites_20240201", "favorites_20240301", "favorites_default"]


def test_each_partition_purged_on_its_own_keeps_the_rows_of_the_others(monthly):
    accounts = {add(monthly, dt.datetime(2024, 2, d, tzinfo=UTC), user_id=d) for d in (1, 2)}
    guests_feb = {add(monthly, dt.datetime(2024, 2, d, tzinfo=UTC)) for d in (3, 4, 5)}
    guests_jan = {add(monthly, dt.datetime(2024, 1, d, tzinfo=UTC)) for d in (3, 4)}
    [february] = [p for p in prunable_partitions(monthly, GUEST_FAVORITES, CUTOFF)
                  if p.name == "favorites_20240201"]

    report = purge_rows(monthly, CUTOFF, batch_size=2, max_run_duration=dt.timedelta(minutes=1),
                        rule=GUEST_FAVORITES.within(february.ages))

    assert report.deleted_total == len(guests_feb)
    with monthly.connect() as conn:
        left = set(conn.execute(sa.select(dev_favorites.c.id)).scalars())
    assert left == accounts | guests_jan


def scanned(engine, statement) -> set[str]:
    """The tables the plan of ``statement`` scans (its literal values inlined, as the server
    plans the job's statements with their parameters known)."""
    sql = str(statement.compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        [plan] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql.replace("%", "%%")
                                      ).scalar_one()
    found, stack = set(), [plan["Plan"]]
    while stack:
        node = stack.pop()
        if "Scan" in node["Node Type"]:
            found.add(node["Relation Name"])
        stack.extend(node.get("Plans", []))
    return found


def test_the_default_partition_is_purged_through_the_table_its_deletes_seen_by_its_triggers(
        monthly):
    erasure_log(monthly)
    before = {add(monthly, dt.datetime(2023, 6, d, tzinfo=UTC)) for d in (1, 2, 3)}   # default
    after = {add(monthly, dt.datetime(2024, 9, d, tzinfo=UTC)) for d in (1, 2)}       # default
    february = {add(monthly, dt.datetime(2024, 2, d, tzinfo=UTC)) for d in (1, 2)}
    account = add(monthly, dt.datetime(2023, 6, 4, tzinfo=UTC), user_id=9)
    found = {p.name: p for p in prunable_partitions(monthly, GUEST_FAVORITES, CUTOFF)}
    default = found["favorites_default"]
    assert default.ages == ((None, dt.datetime(2024, 1, 1, tzinfo=UTC)),
                            (dt.datetime(2024, 7, 1, tzinfo=UTC), None))

    rule = GUEST_FAVORITES.within(default.ages)
    # The planner prunes every other partition from the step's statements.
    assert scanned(monthly, rule.delete_prunable(CUTOFF)) == {"favorites_default"}
    assert scanned(monthly, GUEST_FAVORITES.within(found["favorites_20240201"].ages)
                   .delete_prunable(CUTOFF)) == {"favorites_20240201"}
    report = purge_rows(monthly, CUTOFF, batch_size=2, max_run_duration=dt.timedelta(minutes=1),
                        rule=rule)

    assert report.deleted_total == len(before)
    with monthly.connect() as conn:
        left = set(conn.execute(sa.select(dev_favorites.c.id)).scalars())
        logged = conn.execute(sa.text("SELECT sum(deleted) FROM favorites.erasure_log")
                              ).scalar_one()
    assert left == after | february | {account}
    assert logged == len(before)


def test_a_table_that_is_not_partitioned_is_refused_naming_the_setting(engine):
    with pytest.raises(TableShapeError, match="favorites.favorites is not a partitioned table, "
                                              "but max_parallel_partitions is set"):
        prunable_partitions(engine, GUEST_FAVORITES, CUTOFF)
