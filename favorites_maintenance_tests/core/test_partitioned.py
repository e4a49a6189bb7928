"""Reading a range-partitioned table's partitions from the catalogs, on a real server."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.errors import TableShapeError
from favorites_maintenance.retention.partition_phase import Action
from favorites_maintenance.retention.partitioned import drop_expired_partitions
from favorites_maintenance.retention.table_partitions import leaf_partitions
from favorites_maintenance.local.guest_favorites import (
    GUEST_FAVORITES,
    create_partitioned_dev_schema,
    drop_dev_schema,
    month_starts,
)
from favorites_maintenance_tests.conftest import Rows

UTC = dt.UTC


@pytest.fixture
def bare_engine(db_url):
    """An engine on a per-test database whose favorites schema is dropped (tests build their
    own table)."""
    engine = create_engine(db_url)
    drop_dev_schema(engine)
    yield engine
    engine.dispose()


def test_leaf_partitions_reads_bounds_as_utc_instants_whatever_the_session_time_zone(bare_engine):
    bounds = month_starts(dt.datetime(2024, 1, 1, tzinfo=UTC), 3)
    create_partitioned_dev_schema(bare_engine, bounds, default_partition=True)
    with bare_engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL TimeZone = 'Asia/Kolkata'"))
        conn.execute(sa.text("SET LOCAL DateStyle = 'SQL, DMY'"))
        parts = leaf_partitions(conn, "favorites", "favorites", age_column="updated_at")
    assert [(p.name, p.lower, p.upper, p.is_default) for p in parts] == [
        ("favorites_20240101", bounds[0], bounds[1], False),
        ("favorites_20240201", bounds[1], bounds[2], False),
        ("favorites_20240301", bounds[2], bounds[3], False),
        ("favorites_default", None, None, True),
    ]
    assert not any(p.detach_pending for p in parts)


def test_open_ended_ranges_read_as_none(bare_engine):
    create_partitioned_dev_schema(bare_engine, [])
    with bare_engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE favorites.old PARTITION OF favorites.favorites "
            "FOR VALUES FROM (MINVALUE) TO ('2024-01-01 00:00+00')"))
        conn.execute(sa.text(
            "CREATE TABLE favorites.new PARTITION OF favorites.favorites "
            "FOR VALUES FROM ('2024-01-01 00:00+00') TO (MAXVALUE)"))
        parts = leaf_partitions(conn, "favorites", "favorites")
    jan = dt.datetime(2024, 1, 1, tzinfo=UTC)
    assert [(p.name, p.lower, p.upper) for p in parts] == [("old", None, jan),
                                                            ("new", jan, None)]


def test_a_table_that_is_not_partitioned_is_refused_by_name(engine):
    with engine.connect() as conn, pytest.raises(TableShapeError,
                                                 match="favorites.favorites is not a partitioned"):
        leaf_partitions(conn, "favorites", "favorites", age_column="updated_at")


def test_a_table_partitioned_on_another_column_is_refused_naming_its_key(bare_engine):
    with bare_engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA favorites"))
        conn.execute(sa.text(
            "CREATE TABLE favorites.favorites (id bigint, updated_at timestamptz NOT NULL, "
            "created_at timestamptz NOT NULL) PARTITION BY RANGE (created_at)"))
        conn.execute(sa.text(
            "CREATE TABLE favorites.by_hash (id bigint, updated_at timestamptz NOT NULL) "
            "PARTITION BY HASH (id)"))
    with bare_engine.connect() as conn:
        with pytest.raises(TableShapeError, match=r"partitioned by RANGE \(created_at\), but "
                           r".*RANGE \(updated_at\)"):
            leaf_partitions(conn, "favorites", "favorites", age_column="updated_at")
        with pytest.raises(TableShapeError, match=r"by_hash is partitioned by HASH \(id\)"):
            leaf_partitions(conn, "favorites", "by_hash", age_column="updated_at")


JAN_2024 = dt.datetime(2024, 1, 10, tzinfo=UTC)
CUTOFF_2024 = dt.datetime(2024, 6, 1, tzinfo=UTC)


@pytest.fixture
def monthly(bare_engine):
    """The dev table partitioned by month over 2024, 20 guest rows in January, nothing else."""
    create_partitioned_dev_schema(bare_engine, month_starts(JAN_2024, 12))
    Rows(bare_engine).add_many(20, updated_at=JAN_2024)
    return bare_engine


@pytest.mark.parametrize("ddl, said", [
    (("CREATE TABLE favorites.refs (favorite_id bigint, favorite_at timestamptz, FOREIGN KEY "
      "(favorite_id, favorite_at) REFERENCES favorites.favorites (id, updated_at))"),
     "foreign key refs_favorite_id_favorite_at_fkey of favorites.refs"),
    ("CREATE PUBLICATION favorites_pub FOR TABLE favorites.favorites",
     "publication favorites_pub"),
    ("ALTER TABLE favorites.favorites ENABLE ROW LEVEL SECURITY",
     "row-level security on favorites.favorites"),
    (("CREATE FUNCTION favorites.audit() RETURNS trigger LANGUAGE plpgsql AS "
      "$$ BEGIN RETURN NULL; END $$; CREATE TRIGGER audit AFTER DELETE ON favorites.favorites "
      "FOR EACH STATEMENT EXECUTE FUNCTION favorites.audit()"),
     "DELETE trigger audit on favorites.favorites"),
])
def test_a_partition_a_drop_would_bypass_something_for_is_kept(monthly, ddl, said):
    with monthly.begin() as conn:
        conn.exec_driver_sql(ddl)
    result = drop_expired_partitions(monthly, GUEST_FAVORITES, CUTOFF_2024)
    assert result.detached == () and result.rows_removed == 0
    [january] = [d for d in result.decisions if d.partition == "favorites.favorites_20240101"]
    assert january.action is Action.KEPT
    assert january.checks[-1] == f"a DROP would bypass {said}"
    with monthly.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM favorites.favorites").scalar() == 20


def test_without_anything_in_the_way_the_expired_partitions_are_detached(monthly):
    result = drop_expired_partitions(monthly, GUEST_FAVORITES, CUTOFF_2024)
    # January to May 2024 end at or before June 1st.
    assert result.detached == tuple(f"favorites.favorites_2024{m:02d}01" for m in range(1, 6))
    assert result.rows_removed == 20 and result.privilege == "owner"
