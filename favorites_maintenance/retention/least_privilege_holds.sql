-- Optional: what the cleanup role needs, on top of least_privilege.sql, for a policy with a
-- hold_table: here {{table}} with the hold table {{hold_table}} and holds on
-- {{hold_column}} (docs/holds.md).
--
-- This file is a template: print it for a policy, and run it once per database as the owner of
-- the schema (or a superuser), after least_privilege.sql:
--     favorites-maintenance grants --policy NAME --role favorites_cleanup | psql -f - "$OWNER_URL"
-- favorites_maintenance.retention.least_privilege.apply_hold_privileges() runs the same text.
--
-- What the job does with holds, and the privilege each statement needs:
--   every batch without the run's copy, count and probe: ... AND <hold column> NOT IN (SELECT held_value FROM <holds>
--       WHERE policy = ... AND released_at IS NULL)     -> SELECT (policy, held_value,
--                                                          released_at) on the hold table
--   the run's copy of the active holds, and before every batch the hold table's change
--       counter: SELECT changes FROM <holds>_changes    -> SELECT on the counter (without
--                                                          it the batches read the holds)
--   the held_rows check: count(*), min(placed_at) of the active holds   -> SELECT (placed_at)
--       and the active holds no row has: NOT EXISTS (SELECT 1 FROM <table>
--       WHERE <hold column> = CAST(held_value AS ...))  -> SELECT on the hold column
--   the hold column of the policy's table: least_privilege.sql grants the key, the guard and
--   the age columns; a hold column that is none of them is granted at the end of this file
--   (its values are then readable by the role: the policy's holds need it).
--   the check of the hold table's columns                  -> nothing (the catalogs)
-- Not granted: INSERT, UPDATE, DELETE on the hold table. The job never writes a hold; whoever
-- places and releases holds (hold place, hold release, or the application) uses a role of its
-- own with SELECT, INSERT and UPDATE on the table; the trigger that raises the counter runs as
-- its owner, so that role needs nothing on the counter.
--
-- The hold table itself: created below by the owner, with the DDL hold init runs (and
-- hold init --print-sql prints), so that the job's role needs no CREATE on the schema.

{{create_hold_table}}
REVOKE ALL ON TABLE {{hold_table_sql}} FROM PUBLIC;
GRANT SELECT (policy, held_value, placed_at, released_at) ON TABLE {{hold_table_sql}} TO :"role";
REVOKE ALL ON TABLE {{hold_changes_sql}} FROM PUBLIC;
GRANT SELECT ON TABLE {{hold_changes_sql}} TO :"role";
{{hold_column_grant}}
