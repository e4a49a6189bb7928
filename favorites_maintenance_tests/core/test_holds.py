"""Holds against a real PostgreSQL: a row an active hold covers is never deleted, in every
batch form; a hold placed between two batches of a run protects its row from the next batch
on; a released hold makes its row prunable again at the next run."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.retention import ScanMode, StopReason, measure_backlog
from favorites_maintenance.retention.errors import InvalidArgumentError
from favorites_maintenance.retention.holds import (
    HoldTable,
    create_hold_table,
    list_holds,
    place_hold,
    release_hold,
)
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance_tests.core.test_purge import CUTOFF, OLD
from favorites_maintenance_tests.helpers.purging import purge_rows

TEN_MIN = dt.timedelta(minutes=10)
HOLDS = "favorites.retention_holds"


def holds_of(policy: str = "guest_favorites", column: str = "id") -> HoldTable:
    return HoldTable.define(HOLDS, column, policy)


@pytest.fixture
def holds(engine) -> HoldTable:
    create_hold_table(engine, HOLDS)
    return holds_of()


def run(engine, rule, **kwargs):
    kwargs.setdefault("batch_size", 1000)
    kwargs.setdefault("max_run_duration", TEN_MIN)
    return purge_rows(engine, CUTOFF, rule=rule, **kwargs)


@pytest.mark.parametrize("scan,optimistic", [(ScanMode.KEYSET, True), (ScanMode.KEYSET, False),
                                             (ScanMode.PAGE_ORDER, True),
                                             (ScanMode.PAGE_ORDER, False)])
def test_a_held_row_is_never_deleted_in_any_batch_form(engine, rows, holds, scan, optimistic):
    ids = rows.add_many(30, updated_at=OLD)
    account = rows.add(updated_at=OLD, user_id=7)
    held = {ids[3], ids[17], ids[29]}
    for key in held:
        place_hold(engine, holds, str(key), reason="dispute", placed_by="support")
    # Another policy's hold on the same key does not count for this one.
    place_hold(engine, holds_of("other_policy"), str(ids[5]), reason="x", placed_by="y")
    rule = GUEST_FAVORITES.with_hold(holds)

    report = run(engine, rule, batch_size=4, scan=scan, optimistic=optimistic)

    assert report.stop_reason is StopReason.EXHAUSTED
    assert report.deleted_total == 27
    assert rows.ids() == held | {account}
    backlog = measure_backlog(engine, rule, CUTOFF)
    assert (backlog.remaining, backlog.held) == (0, 3)


def test_a_hold_typed_another_way_than_postgresql_writes_the_key_still_covers_its_row(
        engine, rows, holds):
    ids = rows.add_many(3, updated_at=OLD)
    # "0042" is the bigint 42, which PostgreSQL writes as "42".
    place_hold(engine, holds, f" 0{ids[1]}", reason="dispute", placed_by="support",
               of_table="favorites.favorites")
    report = run(engine, GUEST_FAVORITES.with_hold(holds))
    assert report.deleted_total == 2 and rows.ids() == {ids[1]}
    assert [h.held_value for h in list_holds(engine, holds)] == [str(ids[1])]
    with pytest.raises(InvalidArgumentError, match=r"hold key is not a value of "
                       r"favorites.favorites.id \(bigint\)"):
        place_hold(engine, holds, "not-a-number", reason="r", placed_by="s",
                   of_table="favorites.favorites")


@pytest.mark.parametrize("column_type,too_long,fitting,written", [
    ("varchar(5)", "abcdeXYZ", "abc", "abc"),
    ("numeric(5, 2)", "1.234", "1.5", "1.50"),
    # Without its length, character is character(1) and bit is bit(1): not the measure.
    ("character(5)", "abcdeXYZ", "abc", "abc"),
    ("bit(3)", "1010", "101", "101"),
])
def test_a_key_the_column_would_cut_or_round_is_refused(engine, holds, column_type, too_long,
                                                         fitting, written):
    with engine.begin() as conn:
        conn.execute(sa.text(f"ALTER TABLE favorites.favorites ADD COLUMN token {column_type}"))
    token_holds = holds_of(column="token")
    # An explicit cast would keep "abcde" or 1.23: a hold on a value no row has.
    with pytest.raises(InvalidArgumentError, match=r"hold key does not fit "
                       r"favorites.favorites.token .*cut or rounded"):
        place_hold(engine, token_holds, too_long, reason="r", placed_by="s",
                   of_table="favorites.favorites")
    place_hold(engine, token_holds, fitting, reason="r", placed_by="s",
               of_table="favorites.favorites")
    assert [h.held_value for h in list_holds(engine, token_holds)] == [written]



def test_an_application_s_hold_the_column_would_cut_keeps_no_row_it_does_not_name(
        engine, rows, holds, caplog):
    """Read as varchar(5), ``abcdeXYZ`` would be cut to ``abcde`` and keep that row, which
    no hold names: the run compares as text instead, and says so without the value."""
    caplog.set_level(logging.WARNING, logger="favorites_maintenance")
    rows.add_many(3, updated_at=OLD)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE favorites.favorites ADD COLUMN token varchar(5)"))
        conn.execute(sa.text("UPDATE favorites.favorites SET token = 'abcde'"))
    _hold_written_by_the_application(engine, "abcdeXYZ")

    report = run(engine, GUEST_FAVORITES.with_hold(holds_of(column="token")))

    assert report.deleted_total == 3 and rows.ids() == set()
    assert ("an active hold of policy guest_favorites in favorites.retention_holds does not "
            "fit favorites.favorites.token (character varying(5))") in caplog.text
    assert "abcdeXYZ" not in caplog.text


def test_the_delete_repeats_the_hold_test(engine, rows, holds):
    ids = rows.add_many(5, updated_at=OLD)
    place_hold(engine, holds, str(ids[0]), reason="dispute", placed_by="support")
    rule = GUEST_FAVORITES.with_hold(holds)
    # A DELETE narrowed to the held row's key alone, as a batch's DELETE is to its rows.
    with engine.begin() as conn:
        deleted = conn.execute(rule.delete_prunable(CUTOFF, rule.key == ids[0])).rowcount
    assert deleted == 0 and ids[0] in rows.ids()


def test_a_hold_placed_between_two_batches_keeps_its_row_from_the_next_batch_on(
        engine, rows, holds):
    ids = sorted(rows.add_many(12, updated_at=OLD))  # keyset order is age order, here id order
    rule = GUEST_FAVORITES.with_hold(holds)
    placed = []

    def on_batch(batch):
        # Committed on its own, between the first batch's commit and the second batch.
        if batch.batch_no == 1:
            placed.append(place_hold(engine, holds, str(ids[8]), reason="late dispute",
                                     placed_by="support"))

    report = run(engine, rule, batch_size=4, on_batch=on_batch, target_batch_duration=dt.timedelta(0))

    assert placed and report.deleted_total == 11
    assert rows.ids() == {ids[8]}


def test_releasing_a_hold_makes_its_row_prunable_at_the_next_run(engine, rows, holds):
    ids = rows.add_many(6, updated_at=OLD)
    first = place_hold(engine, holds, str(ids[2]), reason="dispute", placed_by="support")
    second = place_hold(engine, holds, str(ids[2]), reason="regulator", placed_by="legal")
    rule = GUEST_FAVORITES.with_hold(holds)

    assert run(engine, rule).deleted_total == 5
    assert release_hold(engine, holds, first, released_by="support")
    # Released already: nothing to release.
    assert not release_hold(engine, holds, first, released_by="support")
    # Still covered by the second hold.
    assert run(engine, rule).deleted_total == 0 and rows.ids() == {ids[2]}
    assert release_hold(engine, holds, second, released_by="legal")
    assert run(engine, rule).deleted_total == 1 and rows.ids() == set()
    records = list_holds(engine, holds, include_released=True)
    assert [(h.hold_id, h.active, h.released_by) for h in records] == [
        (first, False, "support"), (second, False, "legal")]
    assert list_holds(engine, holds) == []


def test_a_hold_on_another_column_covers_every_row_with_that_value(engine, rows, holds):
    anonymous = "00000000-0000-4000-8000-00000000abcd"
    kept = {rows.add(updated_at=OLD, anonymous_id=anonymous) for _ in range(3)}
    rows.add_many(4, updated_at=OLD)
    by_visitor = holds_of(column="anonymous_id")
    place_hold(engine, by_visitor, anonymous, reason="ticket 1", placed_by="support")

    report = run(engine, GUEST_FAVORITES.with_hold(by_visitor), batch_size=2)

    assert report.deleted_total == 4 and rows.ids() == kept


def test_a_hold_does_not_keep_a_row_the_rule_keeps_anyway_from_being_counted_held(
        engine, rows, holds):
    account = rows.add(updated_at=OLD, user_id=3)
    fresh = rows.add(updated_at=CUTOFF + dt.timedelta(days=1))
    for key in (account, fresh):
        place_hold(engine, holds, str(key), reason="r", placed_by="b")
    backlog = measure_backlog(engine, GUEST_FAVORITES.with_hold(holds), CUTOFF)
    assert (backlog.remaining, backlog.held) == (0, 0)


def test_a_hold_table_name_that_is_not_schema_table_is_refused():
    from favorites_maintenance.retention.rule import RuleError

    with pytest.raises(RuleError, match="hold_table 'holds' must be written schema.table"):
        HoldTable.define("holds", "id", "p")


def test_a_hold_needs_a_reason(engine, holds):
    from favorites_maintenance.retention.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="reason"):
        place_hold(engine, holds, "1", reason=" ", placed_by="me")
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(holds.table)).scalar() == 0


def test_a_policy_names_its_hold_table_and_column_in_its_settings():
    from favorites_maintenance.config.policy import Policy, PolicyError
    from favorites_maintenance.config.policy_settings import SettingsError, parse_policy_settings

    settings = parse_policy_settings({"hold_table": HOLDS, "hold_column": "anonymous_id"}, {})
    policy = Policy(name="guest_favorites", rule=GUEST_FAVORITES, settings=settings)
    assert policy.rule.hold == holds_of(column="anonymous_id")
    by_key = Policy(name="guest_favorites", rule=GUEST_FAVORITES,
                    settings=parse_policy_settings({"hold_table": HOLDS}, {}))
    assert by_key.rule.hold == holds_of(column="id")
    with pytest.raises(PolicyError, match="hold_column is set, but the policy has no hold_table"):
        Policy(name="guest_favorites", rule=GUEST_FAVORITES,
               settings=parse_policy_settings({"hold_column": "anonymous_id"}, {}))
    with pytest.raises(SettingsError, match="hold_table"):
        parse_policy_settings({"hold_table": "holds"}, {})


# -- the archive -------------------------------------------------------------------------------

SHOP_HOLDS = "shop.item_holds"


@pytest.fixture
def items(engine):
    from favorites_maintenance_tests.helpers import archive as shop

    shop.create_items(engine)
    create_hold_table(engine, SHOP_HOLDS)
    return engine


def shop_rule():
    from favorites_maintenance.retention.rule import RetentionRule
    from favorites_maintenance_tests.helpers import archive as shop

    return RetentionRule.define(shop.TABLE, key_column="id", age_column="updated_at",
                                null_columns=["owner_id"]).with_hold(
        HoldTable.define(SHOP_HOLDS, "id", shop.POLICY))


def test_a_held_row_is_not_archived_and_a_held_archived_row_outlives_the_archive_retention(
        items):
    from favorites_maintenance.retention.archive import ArchiveTarget
    from favorites_maintenance.retention.archive_retention import (
        count_overdue_archive,
        prune_archive,
    )
    from favorites_maintenance_tests.helpers import archive as shop

    engine, rule = items, shop_rule()
    ids = sorted(shop.add_items(engine, 10, updated_at=shop.OLD))
    place_hold(engine, rule.hold, str(ids[0]), reason="kept in place", placed_by="legal")
    report = purge_rows(engine, shop.CUTOFF, rule=rule, batch_size=3, max_run_duration=TEN_MIN,
                        archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"))
    assert report.deleted_total == 9
    assert shop.ids_of(engine, shop.TABLE) == [ids[0]]
    assert sorted(shop.ids_of(engine, shop.ARCHIVE)) == ids[1:]

    # A hold placed on archived rows once they are in the archive, then their time is up.
    for key in ids[1:3]:
        place_hold(engine, rule.hold, str(key), reason="dispute", placed_by="support")
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE shop.items_archive SET _retention_archived_at = "
                             "now() - interval '31 days'")
    overdue = count_overdue_archive(engine, shop.ARCHIVE, shop.POLICY, 30, hold=rule.hold)
    assert overdue.rows == 7
    pruned = prune_archive(engine, shop.ARCHIVE, shop.POLICY, 30, batch_size=4,
                           max_duration=TEN_MIN, hold=rule.hold)
    assert (pruned.deleted_total, pruned.rows) == (7, 2)
    assert sorted(shop.ids_of(engine, shop.ARCHIVE)) == ids[1:3]
    assert count_overdue_archive(engine, shop.ARCHIVE, shop.POLICY, 30,
                                 hold=rule.hold).rows == 0


@pytest.mark.parametrize("written_by", ["hold place", "an application"])
def test_a_restored_row_a_hold_covers_is_not_counted_prunable_and_stays_at_the_next_run(
        items, written_by):
    """Written by an application as ``00<id>`` for the bigint ``<id>``, the hold keeps the row
    from the next run all the same, so the restore does not count it prunable either."""
    from favorites_maintenance.retention.archive import ArchiveTarget
    from favorites_maintenance.retention.restore import Selection, restore
    from favorites_maintenance_tests.helpers import archive as shop

    engine, rule = items, shop_rule()
    ids = sorted(shop.add_items(engine, 4, updated_at=shop.OLD))
    purge_rows(engine, shop.CUTOFF, rule=rule, batch_size=10, max_run_duration=TEN_MIN,
               archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"))
    if written_by == "hold place":
        place_hold(engine, rule.hold, str(ids[1]), reason="restored for a dispute",
                   placed_by="support")
    else:
        with engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO {SHOP_HOLDS} (policy, held_value, placed_by, "
                                 "reason) VALUES (:p, :v, 'app', 'case')"),
                         {"p": shop.POLICY, "v": f"00{ids[1]}"})

    report = restore(engine, rule, shop.ARCHIVE, shop.POLICY, Selection(run_id="run-1"),
                     retention_days=365, allow_prunable=True)
    assert (report.restored_rows, report.prunable_rows) == (4, 3)
    again = purge_rows(engine, shop.CUTOFF, rule=rule, batch_size=10, max_run_duration=TEN_MIN,
                       archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-2"))
    assert again.deleted_total == 3
    assert shop.ids_of(engine, shop.TABLE) == [ids[1]]


# -- partitions ----------------------------------------------------------------------------------


def test_an_expired_partition_holding_a_held_row_is_not_detached_and_its_rows_go_by_batches(
        db_url):
    from favorites_maintenance.local.guest_favorites import (
        create_partitioned_dev_schema,
        drop_dev_schema,
        month_starts,
    )
    from favorites_maintenance.retention.database import create_engine
    from favorites_maintenance.retention.partition_phase import Action
    from favorites_maintenance.retention.partitioned import drop_expired_partitions
    from favorites_maintenance_tests.conftest import Rows

    engine = create_engine(db_url)
    try:
        drop_dev_schema(engine)
        january = dt.datetime(2024, 1, 10, tzinfo=dt.UTC)
        cutoff = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
        create_partitioned_dev_schema(engine, month_starts(january, 12))
        create_hold_table(engine, HOLDS)
        rows = Rows(engine)
        ids = sorted(rows.add_many(20, updated_at=january))
        rule = GUEST_FAVORITES.with_hold(holds_of())
        hold = place_hold(engine, rule.hold, str(ids[4]), reason="dispute", placed_by="support")

        result = drop_expired_partitions(engine, rule, cutoff)
        [kept] = [d for d in result.decisions if d.partition == "favorites.favorites_20240101"]
        assert kept.action is Action.KEPT
        assert kept.checks[-1] == ("holds a row an active hold of favorites.retention_holds "
                                   "covers")
        assert "favorites.favorites_20240101" not in result.detached and result.rows_removed == 0
        report = purge_rows(engine, cutoff, rule=rule, batch_size=6, max_run_duration=TEN_MIN)
        assert report.deleted_total == 19 and rows.ids() == {ids[4]}

        # Released, the partition goes whole at the next run; a hold placed once it is
        # detached keeps the detached table from being dropped.
        release_hold(engine, rule.hold, hold, released_by="support")
        detached = drop_expired_partitions(engine, rule, cutoff,
                                           detached_retention=dt.timedelta(0))
        assert "favorites.favorites_20240101" in detached.detached
        place_hold(engine, rule.hold, str(ids[4]), reason="again", placed_by="support")
        later = drop_expired_partitions(engine, rule, cutoff, detached_retention=dt.timedelta(0))
        [table] = [d for d in later.decisions
                   if d.partition == "favorites.favorites_20240101_detached"]
        assert table.action is Action.KEPT_DETACHED
        assert table.checks[-1] == ("holds a row the rule keeps, or one an active hold of "
                                    "favorites.retention_holds covers: not dropped")
        with engine.connect() as conn:
            assert conn.exec_driver_sql(
                "SELECT id FROM favorites.favorites_20240101_detached").scalars().all() \
                == [ids[4]]
    finally:
        engine.dispose()


def test_a_missing_hold_table_or_hold_column_is_refused_before_any_delete(engine, rows):
    from favorites_maintenance.retention.errors import TableShapeError

    ids = rows.add_many(3, updated_at=OLD)
    with pytest.raises(TableShapeError, match=(
            "hold_table favorites.retention_holds does not exist .*: create it with "
            "favorites-maintenance hold init --policy guest_favorites")):
        run(engine, GUEST_FAVORITES.with_hold(holds_of()))
    create_hold_table(engine, HOLDS)
    with pytest.raises(TableShapeError, match="favorites.favorites has no column 'visitor'"):
        run(engine, GUEST_FAVORITES.with_hold(holds_of(column="visitor")))
    assert rows.ids() == set(ids)


def test_a_row_whose_hold_column_is_null_is_prunable(engine, rows, holds):
    # NULL matches no hold: such a row is pruned as if there were no holds.
    kept = rows.add(updated_at=OLD, note="case-7")
    gone = {rows.add(updated_at=OLD), rows.add(updated_at=OLD, note="case-8")}
    by_note = holds_of(column="note")
    place_hold(engine, by_note, "case-7", reason="dispute", placed_by="support")

    report = run(engine, GUEST_FAVORITES.with_hold(by_note), batch_size=2)

    assert report.deleted_total == len(gone) and rows.ids() == {kept}


def _hold_written_by_the_application(engine, value: str) -> None:
    """A hold inserted as an application may write it, without hold place's check."""
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {HOLDS} (policy, held_value, placed_by, reason) "
                             "VALUES ('guest_favorites', :v, 'app', 'case')"), {"v": value})


def test_the_batches_compare_the_holds_in_the_key_s_type_against_a_hash_of_them(
        engine, rows, holds):
    """Without the hold table's change counter (a table made before it), each batch
    statement reads the active holds once, as the key's type, into a hashed subplan: no
    row's key is written as text to be compared."""
    drop_change_counter(engine)
    rows.add_many(30, updated_at=OLD)
    place_hold(engine, holds, "1", reason="dispute", placed_by="support")
    executed = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):
        if "retention_holds" in statement and not statement.lstrip().startswith("EXPLAIN"):
            executed.append((statement, parameters))

    try:
        run(engine, GUEST_FAVORITES.with_hold(holds), batch_size=10,
            target_batch_duration=dt.timedelta(0))
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    deletes = [(sql, params) for sql, params in executed if sql.lstrip().startswith("DELETE")]
    assert deletes
    sql, params = deletes[0]
    with engine.begin() as conn:
        plan = "\n".join(r[0] for r in conn.exec_driver_sql(
            "EXPLAIN (VERBOSE, COSTS OFF) " + sql, params))
        conn.rollback()
    assert "hashed SubPlan" in plan, plan
    assert "(retention_holds.held_value)::bigint" in plan, plan
    assert "(favorites.id)::text" not in plan, plan


def test_an_application_s_hold_written_otherwise_than_postgresql_writes_the_key_keeps_its_row(
        engine, rows, holds, caplog):
    """``0042`` is the bigint 42: the batches read the hold as the key's type, so it keeps
    the row, and the run says that the counts, which compare as text, miss it."""
    caplog.set_level(logging.WARNING, logger="favorites_maintenance")
    ids = rows.add_many(4, updated_at=OLD)
    _hold_written_by_the_application(engine, f"00{ids[2]}")
    report = run(engine, GUEST_FAVORITES.with_hold(holds))
    assert report.deleted_total == 3 and rows.ids() == {ids[2]}
    assert ("1 active hold(s) of policy guest_favorites in favorites.retention_holds are not "
            "written as PostgreSQL writes bigint") in caplog.text
    assert f"00{ids[2]}" not in caplog.text


def test_the_backlog_counts_a_hold_written_otherwise_as_held_as_the_batches_keep_its_row(
        engine, rows, holds):
    """The backlog and its held rows read the holds as the batches do: the row a hold
    written ``0042`` keeps is counted held, before the run and after it."""
    ids = rows.add_many(4, updated_at=OLD)
    _hold_written_by_the_application(engine, f"00{ids[2]}")
    rule = GUEST_FAVORITES.with_hold(holds)
    before = measure_backlog(engine, rule, CUTOFF)
    assert (before.remaining, before.held) == (3, 1)
    assert run(engine, rule).deleted_total == 3 and rows.ids() == {ids[2]}
    after = measure_backlog(engine, rule, CUTOFF)
    assert (after.remaining, after.held) == (0, 1)


def test_a_hold_on_a_citext_column_keeps_a_row_cased_otherwise_and_is_counted_held(
        engine, holds):
    """On a ``citext`` hold column, ``Ann@Example.com`` holds the row of ``ann@example.com``:
    the run keeps it and the backlog counts it held."""
    table = "favorites.citext_contacts"
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS citext")
        conn.exec_driver_sql(f"CREATE TABLE {table} (id bigint PRIMARY KEY, email citext NOT "
                             "NULL, user_id bigint, updated_at timestamptz NOT NULL)")
        conn.execute(sa.text(f"INSERT INTO {table} VALUES (1, 'ann@example.com', NULL, :old), "
                             "(2, 'bob@example.com', NULL, :old)"), {"old": OLD})
    try:
        _hold_written_by_the_application(engine, "Ann@Example.com")
        rule = RetentionRule.define(table, key_column="id", age_column="updated_at",
                                    null_columns=["user_id"]).with_hold(holds_of(column="email"))
        backlog = measure_backlog(engine, rule, CUTOFF)
        assert (backlog.remaining, backlog.held) == (1, 1)
        assert run(engine, rule).deleted_total == 1
        with engine.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT id FROM {table}").scalars().all() == [1]
        assert measure_backlog(engine, rule, CUTOFF).held == 1
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {table}")


def test_a_hold_that_is_not_a_value_of_the_key_s_type_covers_no_row_and_fails_no_run(
        engine, rows, holds, caplog):
    """The run compares as text (a cast of such a value would fail every batch), and says so
    without the value."""
    caplog.set_level(logging.WARNING, logger="favorites_maintenance")
    ids = rows.add_many(4, updated_at=OLD)
    _hold_written_by_the_application(engine, "not-a-number")
    place_hold(engine, holds, str(ids[0]), reason="dispute", placed_by="support")
    report = run(engine, GUEST_FAVORITES.with_hold(holds))
    assert report.deleted_total == 3 and rows.ids() == {ids[0]}
    assert ("an active hold of policy guest_favorites in favorites.retention_holds is not a "
            "value of favorites.favorites.id (bigint): it covers no row") in caplog.text
    assert "not-a-number" not in caplog.text


def test_a_hold_not_of_the_key_s_type_written_during_a_run_skips_no_row(
        engine, rows, holds, caplog):
    """The batch that meets it fails on reading it as the key's type and is taken again with
    the holds compared as text: no row is skipped as if it were the one at fault."""
    caplog.set_level(logging.WARNING, logger="favorites_maintenance")
    ids = sorted(rows.add_many(12, updated_at=OLD))
    place_hold(engine, holds, str(ids[10]), reason="dispute", placed_by="support")

    def on_batch(batch):
        if batch.batch_no == 1:
            _hold_written_by_the_application(engine, "not-a-number")

    report = run(engine, GUEST_FAVORITES.with_hold(holds), batch_size=4, on_batch=on_batch,
                 target_batch_duration=dt.timedelta(0))
    assert report.deleted_total == 11 and rows.ids() == {ids[10]}
    assert "skipped row" not in caplog.text
    assert ("is not a value of favorites.favorites.id (bigint): it covers no row"
            in caplog.text)
    assert "not-a-number" not in caplog.text



@pytest.fixture
def case_holds(engine, rows, holds) -> HoldTable:
    """Holds on ``case_no``, a column whose domain over bigint refuses values under 1: a
    CHECK, not the type, refuses ``0``."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE DOMAIN favorites.case_no AS bigint CHECK (VALUE > 0)"))
        conn.execute(sa.text("ALTER TABLE favorites.favorites ADD COLUMN case_no "
                             "favorites.case_no"))
    return holds_of(column="case_no")


def _numbered(engine, ids) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE favorites.favorites SET case_no = id WHERE id = ANY(:ids)"),
                     {"ids": list(ids)})


def test_a_hold_the_hold_column_s_domain_refuses_covers_no_row_and_fails_no_run(
        engine, rows, case_holds, caplog):
    caplog.set_level(logging.WARNING, logger="favorites_maintenance")
    ids = rows.add_many(4, updated_at=OLD)
    _numbered(engine, ids)
    with pytest.raises(InvalidArgumentError, match=r"hold key is not a value of "
                       r"favorites.favorites.case_no \(favorites.case_no\)"):
        place_hold(engine, case_holds, "0", reason="r", placed_by="s",
                   of_table="favorites.favorites")
    _hold_written_by_the_application(engine, "0")
    place_hold(engine, case_holds, str(ids[0]), reason="dispute", placed_by="support")
    report = run(engine, GUEST_FAVORITES.with_hold(case_holds))
    assert report.deleted_total == 3 and rows.ids() == {ids[0]}
    assert ("an active hold of policy guest_favorites in favorites.retention_holds is not a "
            "value of favorites.favorites.case_no (favorites.case_no): it covers no row"
            in caplog.text)


def test_a_hold_the_domain_refuses_written_during_a_run_skips_no_row(
        engine, rows, case_holds, caplog):
    caplog.set_level(logging.WARNING, logger="favorites_maintenance")
    ids = sorted(rows.add_many(12, updated_at=OLD))
    _numbered(engine, ids)
    place_hold(engine, case_holds, str(ids[10]), reason="dispute", placed_by="support")

    def on_batch(batch):
        if batch.batch_no == 1:
            _hold_written_by_the_application(engine, "-7")

    report = run(engine, GUEST_FAVORITES.with_hold(case_holds), batch_size=4,
                 on_batch=on_batch, target_batch_duration=dt.timedelta(0))
    assert report.deleted_total == 11 and rows.ids() == {ids[10]}
    assert "skipped row" not in caplog.text
    assert "batch 2 was rolled back and is taken again" in caplog.text


def drop_change_counter(engine) -> None:
    """The hold table as it was before it had a change counter."""
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TRIGGER {HOLDS.split('.')[1]}_changed ON {HOLDS}"))
        conn.execute(sa.text(f"DROP FUNCTION {HOLDS}_changed()"))
        conn.execute(sa.text(f"DROP TABLE {HOLDS}_changes"))
