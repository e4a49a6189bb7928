"""Holds read as the hold column's type wherever a row's fate or its count depends on them,
as a run's batches read them: a hold an application wrote ``00<id>`` for the bigint ``<id>``
keeps an archived row past the archive's retention (and a restored row from being counted
prunable: ``test_holds.py``); a hold column whose type has no equality (``json``) is compared as text."""

from __future__ import annotations

import logging

import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.retention.backlog import measure_backlog
from favorites_maintenance_tests.core.test_holds import (  # noqa: F401 (fixtures)
    SHOP_HOLDS,
    TEN_MIN,
    _hold_written_by_the_application,
    holds,
    holds_of,
    items,
    run,
    shop_rule,
)
from favorites_maintenance_tests.core.test_purge import CUTOFF, OLD
from favorites_maintenance_tests.helpers.purging import purge_rows


def test_an_archived_row_a_hold_written_otherwise_covers_outlives_the_archive_retention(
        items):  # noqa: F811
    """A hold an application wrote ``00<id>`` on an archived row keeps it in the archive past
    its retention, as the batches would keep the row: the prune reads the holds as the
    archive's column's type, and so does the count of the overdue archived rows."""
    from favorites_maintenance.retention.archive import ArchiveTarget
    from favorites_maintenance.retention.archive_retention import (
        count_overdue_archive,
        prune_archive,
    )
    from favorites_maintenance_tests.helpers import archive as shop

    engine, rule = items, shop_rule()
    ids = sorted(shop.add_items(engine, 5, updated_at=shop.OLD))
    purge_rows(engine, shop.CUTOFF, rule=rule, batch_size=3, max_run_duration=TEN_MIN,
               archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"))
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {SHOP_HOLDS} (policy, held_value, placed_by, "
                             "reason) VALUES (:p, :v, 'app', 'case')"),
                     {"p": shop.POLICY, "v": f"00{ids[1]}"})
        conn.exec_driver_sql("UPDATE shop.items_archive SET _retention_archived_at = "
                             "now() - interval '31 days'")
    assert count_overdue_archive(engine, shop.ARCHIVE, shop.POLICY, 30,
                                 hold=rule.hold).rows == 4
    pruned = prune_archive(engine, shop.ARCHIVE, shop.POLICY, 30, batch_size=4,
                           max_duration=TEN_MIN, hold=rule.hold)
    assert (pruned.deleted_total, pruned.rows) == (4, 1)
    assert shop.ids_of(engine, shop.ARCHIVE) == [ids[1]]
    assert count_overdue_archive(engine, shop.ARCHIVE, shop.POLICY, 30,
                                 hold=rule.hold).rows == 0


def test_a_hold_column_of_a_type_without_equality_is_compared_as_text(
        engine, rows, holds, caplog):  # noqa: F811
    """``json`` has no ``=``: the run and the backlog compare the holds as text (as ``json``
    keeps a value as written) instead of failing, and the run says so."""
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE favorites.favorites ADD COLUMN doc json")
    ids = rows.add_many(3, updated_at=OLD)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE favorites.favorites SET doc = CAST(:d AS json) "
                             "WHERE id = :i"), {"d": '{"case": 7}', "i": ids[0]})
    _hold_written_by_the_application(engine, '{"case": 7}')
    rule = GUEST_FAVORITES.with_hold(holds_of(column="doc"))
    backlog = measure_backlog(engine, rule, CUTOFF)
    assert (backlog.remaining, backlog.held) == (2, 1)
    with caplog.at_level(logging.WARNING):
        assert run(engine, rule).deleted_total == 2
    assert rows.ids() == {ids[0]}
    assert ("favorites.favorites.doc (json) has no equality operator: the hold test compares "
            "the values as text") in caplog.text
    assert "case" not in caplog.text
