"""The purge with an archive, at the core: the move is one statement per batch, and a column
added to the table during a run stops it before any row reaches the archive without it."""

from __future__ import annotations

import datetime as dt

import pytest

from favorites_maintenance.retention.archive import ArchiveTarget
from favorites_maintenance.retention.archive_retention import count_overdue_archive, prune_archive
from favorites_maintenance.retention.errors import ArchiveError
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.scan import ScanMode
from favorites_maintenance_tests.helpers import archive as shop
from favorites_maintenance_tests.helpers.purging import purge_rows

RULE = RetentionRule.define(shop.TABLE, key_column="id", age_column="updated_at",
                            null_columns=["owner_id"])
MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def items(engine):
    shop.create_items(engine)
    return engine


def test_a_column_added_during_the_run_rolls_the_batch_back_and_ends_the_run(items):
    engine = items
    ids = shop.add_items(engine, 30, updated_at=shop.OLD)
    before = shop.rows_of(engine, shop.TABLE)

    def migrate_after_the_first_batch(batch):
        if batch.batch_no == 1:  # between two batches: no transaction of the purge is open
            with engine.begin() as conn:
                conn.exec_driver_sql("ALTER TABLE shop.items ADD COLUMN label text "
                                     "DEFAULT 'kept'")

    with pytest.raises(ArchiveError) as raised:
        purge_rows(engine, shop.CUTOFF, batch_size=10, max_run_duration=MINUTE, rule=RULE,
                   archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"),
                   on_batch=migrate_after_the_first_batch)
    assert raised.value.column == "label"
    assert "changed during the run" in str(raised.value)
    # Batch 1 moved its 10 rows; batch 2 rolled back: its rows are still in the table.
    assert shop.ids_of(engine, shop.ARCHIVE) == sorted(ids)[:10]
    assert sorted(shop.ids_of(engine, shop.TABLE)) == sorted(ids)[10:]
    assert shop.rows_of(engine, shop.ARCHIVE) == {i: before[i] for i in sorted(ids)[:10]}

    # The next run refuses the archive, which lacks the new column, before any delete.
    with pytest.raises(ArchiveError, match="has no column 'label'"):
        purge_rows(engine, shop.CUTOFF, batch_size=10, max_run_duration=MINUTE, rule=RULE,
                   archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-2"))
    assert len(shop.ids_of(engine, shop.TABLE)) == 20


def test_a_routing_trigger_added_to_the_archive_during_the_run_rolls_the_batch_back(items):
    engine = items
    ids = shop.add_items(engine, 30, updated_at=shop.OLD)
    before = shop.rows_of(engine, shop.TABLE)

    def route_after_the_first_batch(batch):
        if batch.batch_no == 1:
            with engine.begin() as conn:  # every row sent to a table outside the archive
                conn.exec_driver_sql(
                    "CREATE TABLE shop.elsewhere (LIKE shop.items_archive); "
                    "CREATE FUNCTION shop.route() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "INSERT INTO shop.elsewhere VALUES (NEW.*); RETURN NULL; END $$; "
                    "CREATE TRIGGER route BEFORE INSERT ON shop.items_archive FOR EACH ROW "
                    "EXECUTE FUNCTION shop.route()")

    with pytest.raises(ArchiveError) as raised:
        purge_rows(engine, shop.CUTOFF, batch_size=10, max_run_duration=MINUTE, rule=RULE,
                   archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"),
                   on_batch=route_after_the_first_batch)
    assert ("archive shop.items_archive has a BEFORE INSERT trigger 'route' (function "
            "shop.route) on shop.items_archive") in str(raised.value)
    assert "The batch was rolled back and no batch follows" in str(raised.value)
    # Batch 1 moved its 10 rows; batch 2 rolled back: no row left for the other table.
    assert shop.rows_of(engine, shop.ARCHIVE) == {i: before[i] for i in sorted(ids)[:10]}
    assert sorted(shop.ids_of(engine, shop.TABLE)) == sorted(ids)[10:]
    assert shop.ids_of(engine, "shop.elsewhere") == []


def test_an_archive_with_an_insert_rule_is_refused_before_any_delete(items):
    engine = items
    purge_rows(engine, shop.CUTOFF, batch_size=10, max_run_duration=MINUTE, rule=RULE,
               archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-0"))  # creates the archive
    shop.add_items(engine, 5, updated_at=shop.OLD)
    before = shop.rows_of(engine, shop.TABLE)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE shop.elsewhere (LIKE shop.items_archive); "
                             "CREATE RULE elsewhere AS ON INSERT TO shop.items_archive "
                             "DO INSTEAD INSERT INTO shop.elsewhere VALUES (NEW.*)")
    with pytest.raises(ArchiveError) as raised:
        purge_rows(engine, shop.CUTOFF, batch_size=10, max_run_duration=MINUTE, rule=RULE,
                   archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"))
    assert ("archive shop.items_archive has a rule 'elsewhere' ON INSERT on "
            "shop.items_archive") in str(raised.value)
    assert "DROP RULE elsewhere ON shop.items_archive" in str(raised.value)
    assert shop.rows_of(engine, shop.TABLE) == before


def test_archive_retention_deletes_only_its_own_policys_rows_past_it(items):
    engine = items
    shop.add_items(engine, 12, updated_at=shop.OLD)
    report = purge_rows(engine, shop.CUTOFF, batch_size=5, max_run_duration=MINUTE, rule=RULE,
                        archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"))
    assert (report.deleted_total, report.batches) == (12, 3)
    with engine.begin() as conn:
        # Another policy sharing the archive, and rows archived 31 days ago.
        conn.exec_driver_sql(
            "UPDATE shop.items_archive SET _retention_archived_at = now() - interval '31 days', "
            "_retention_policy = CASE WHEN mod(id, 4) = 0 THEN 'other' ELSE _retention_policy END")
    pruned = prune_archive(engine, shop.ARCHIVE, shop.POLICY, 30, batch_size=2,
                           max_duration=MINUTE)
    assert (pruned.deleted_total, pruned.rows) == (9, 0)
    assert pruned.batches == 5
    assert len(shop.ids_of(engine, shop.ARCHIVE)) == 3  # the other policy's
    again = prune_archive(engine, shop.ARCHIVE, "other", 32, batch_size=2, max_duration=MINUTE)
    assert (again.deleted_total, again.rows) == (0, 3)


def test_the_overdue_count_is_what_the_archive_retention_deletes(items):
    engine = items
    assert count_overdue_archive(engine, shop.ARCHIVE, shop.POLICY, 30).rows == 0  # no archive
    shop.add_items(engine, 12, updated_at=shop.OLD)
    purge_rows(engine, shop.CUTOFF, batch_size=5, max_run_duration=MINUTE, rule=RULE,
               archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"))
    with engine.begin() as conn:
        # A quarter belongs to another policy; of this policy's 9, 8 are past 30 days.
        conn.exec_driver_sql(
            "UPDATE shop.items_archive SET _retention_archived_at = now() - interval '1 day' "
            "* (31 + id), _retention_policy = CASE WHEN mod(id, 4) = 0 THEN 'other' "
            "ELSE _retention_policy END")
        conn.exec_driver_sql(
            "UPDATE shop.items_archive SET _retention_archived_at = now() - interval '29 days' "
            "WHERE id = (SELECT max(id) FROM shop.items_archive WHERE mod(id, 4) <> 0)")
        oldest = conn.exec_driver_sql(
            "SELECT min(_retention_archived_at) FROM shop.items_archive "
            "WHERE _retention_policy = 'shop_items'").scalar_one()

    overdue = count_overdue_archive(engine, shop.ARCHIVE, shop.POLICY, 30)
    assert (overdue.rows, overdue.oldest) == (8, oldest)
    assert overdue.oldest.utcoffset() == dt.timedelta(0) and overdue.oldest < overdue.limit
    pruned = prune_archive(engine, shop.ARCHIVE, shop.POLICY, 30, batch_size=5,
                           max_duration=MINUTE)
    assert (pruned.deleted_total, pruned.rows) == (overdue.rows, 1)
    after = count_overdue_archive(engine, shop.ARCHIVE, shop.POLICY, 30)
    assert (after.rows, after.oldest) == (0, None)
    assert count_overdue_archive(engine, shop.ARCHIVE, "other", 30).rows == 3


def test_a_restore_leaves_the_rows_the_table_refuses_in_the_archive_counted(items):
    from favorites_maintenance.retention.restore import Selection, restore

    engine = items
    ids = shop.add_items(engine, 200, updated_at=shop.OLD)
    before = shop.rows_of(engine, shop.TABLE)
    purge_rows(engine, shop.CUTOFF, batch_size=50, max_run_duration=MINUTE, rule=RULE,
               archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"))
    refused = set(sorted(ids)[::40])  # five rows the table now refuses
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION shop.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.id IN ({', '.join(map(str, refused))}) THEN RAISE EXCEPTION 'no'; END IF; "
            "RETURN NEW; END $$; CREATE TRIGGER refuse BEFORE INSERT ON shop.items "
            "FOR EACH ROW EXECUTE FUNCTION shop.refuse()")
    report = restore(engine, RULE, shop.ARCHIVE, shop.POLICY, Selection(run_id="run-1"),
                     retention_days=365, batch_size=20, allow_prunable=True)
    assert (report.restored_rows, report.failed_rows, report.left_in_archive) == (195, 5, 5)
    assert report.failed_causes == (
        "raise_exception (SQLSTATE P0001) from function shop.refuse()",)
    assert set(shop.ids_of(engine, shop.ARCHIVE)) == refused
    assert shop.rows_of(engine, shop.TABLE) == {i: r for i, r in before.items()
                                                if i not in refused}


@pytest.mark.parametrize("scan", [ScanMode.KEYSET, ScanMode.PAGE_ORDER])
@pytest.mark.parametrize("optimistic", [True, False], ids=["optimistic", "locking"])
@pytest.mark.parametrize("made", ["by_the_run", "like_the_table"])
def test_every_batch_form_moves_its_rows_into_the_archive(items, scan, optimistic, made):
    """Keyset and page order, the optimistic pair of statements and the locking statement:
    every row a batch removes reaches the archive whole, in the batch's own transaction, the
    archive made by the run or by its owner with ``LIKE ... INCLUDING ALL``."""
    engine = items
    if made == "like_the_table":
        with engine.begin() as conn:
            conn.exec_driver_sql(shop.ARCHIVE_LIKE_THE_TABLE)
    ids = shop.add_items(engine, 23, updated_at=shop.OLD)
    before = shop.rows_of(engine, shop.TABLE)
    report = purge_rows(engine, shop.CUTOFF, batch_size=5, max_run_duration=MINUTE, rule=RULE,
                        archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"), scan=scan,
                        optimistic=optimistic)
    assert report.scan_mode == scan.value
    assert report.deleted_total == 23 and report.skipped_rows == 0
    assert shop.ids_of(engine, shop.TABLE) == []
    assert shop.rows_of(engine, shop.ARCHIVE) == {i: before[i] for i in ids}
