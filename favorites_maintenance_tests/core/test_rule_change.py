"""What a change of a rule does to a table, counted against a real PostgreSQL with the rules'
own predicates: holds and guards as the purge applies them."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.retention.holds import create_hold_table, place_hold
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.rule_change import count_prunable, count_rule_change
from favorites_maintenance_tests.core.test_holds import HOLDS, holds_of

NOW = dt.datetime(2026, 6, 1, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)


def test_a_shorter_retention_counts_the_rows_between_the_cutoffs_and_skips_held_ones(
        engine, rows):
    create_hold_table(engine, HOLDS)
    rows.add_many(4, updated_at=NOW - 40 * DAY)
    between = rows.add_many(3, updated_at=NOW - 20 * DAY)
    rows.add_many(2, updated_at=NOW - 20 * DAY, user_id=5)
    place_hold(engine, holds_of(), str(between[0]), reason="dispute", placed_by="support")
    rule = GUEST_FAVORITES.with_hold(holds_of())

    with engine.connect() as conn:
        change = count_rule_change(conn, rule, NOW - 30 * DAY, rule, NOW - 10 * DAY)
        back = count_rule_change(conn, rule, NOW - 10 * DAY, rule, NOW - 30 * DAY)
    assert (change.newly_prunable, change.no_longer_prunable) == (2, 0)
    assert (back.newly_prunable, back.no_longer_prunable) == (0, 2)


def test_dropping_a_guard_column_counts_the_rows_it_kept(engine, rows):
    rows.add_many(3, updated_at=NOW - 40 * DAY)
    rows.add_many(5, updated_at=NOW - 40 * DAY, user_id=1)
    unguarded = RetentionRule.define("favorites.favorites", key_column="id",
                                     age_column="updated_at", null_columns=[])
    with engine.connect() as conn:
        change = count_rule_change(conn, GUEST_FAVORITES, NOW - 30 * DAY, unguarded,
                                   NOW - 30 * DAY)
        assert count_prunable(conn, unguarded, NOW - 30 * DAY) == 8
    assert (change.newly_prunable, change.no_longer_prunable) == (5, 0)


def test_rules_on_two_tables_are_refused():
    other = RetentionRule.define("favorites.other", key_column="id", age_column="updated_at",
                                 null_columns=[])
    with pytest.raises(ValueError, match="different tables: favorites.favorites and "
                                         "favorites.other"):
        count_rule_change(None, GUEST_FAVORITES, NOW, other, NOW)


def test_a_hold_written_otherwise_than_postgresql_writes_the_key_is_not_counted(engine, rows):
    create_hold_table(engine, HOLDS)
    ids = rows.add_many(3, updated_at=NOW - 20 * DAY)
    holds = holds_of()
    # Written by an application as "0<id>": a run's batches compare in bigint and keep the row.
    with engine.begin() as conn:
        conn.execute(sa.insert(holds.table).values(
            policy="guest_favorites", held_value=f"0{ids[0]}", reason="r", placed_by="app"))
    rule = GUEST_FAVORITES.with_hold(holds)
    with engine.connect() as conn:
        change = count_rule_change(conn, rule, NOW - 30 * DAY, rule, NOW - 10 * DAY)
        assert count_prunable(conn, rule, NOW - 10 * DAY) == 2
    assert change.newly_prunable == 2
