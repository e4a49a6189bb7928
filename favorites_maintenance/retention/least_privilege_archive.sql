-- Optional: what the cleanup role needs, on top of least_privilege.sql, for a policy with an
-- archive_table: here {{table}} with the archive {{archive}}.
--
-- This file is a template: print it for a policy, and run it once per database as the owner of
-- the table (or a superuser), after least_privilege.sql:
--     favorites-maintenance grants --policy NAME --role favorites_cleanup | psql -f - "$OWNER_URL"
-- (grants reads the table's columns from the policy's database, for the archive's DDL).
-- favorites_maintenance.retention.least_privilege.apply_archive_privileges() runs the same text.
--
-- An archive keeps the rows the retention was meant to remove, every column of them (private
-- ones included), for archive_retention_days
-- (30 by default). Whoever may SELECT the archive may read them: this role, the archive's owner
-- and superusers; grant nobody else (docs/archive.md).
--
-- What the job does with an archive, and the privilege each statement needs:
--   DELETE ... RETURNING <every column>             -> SELECT on every column of the table
--   INSERT INTO <archive> SELECT ... (the same statement)      -> INSERT on the archive
--   DELETE FROM <archive> WHERE _retention_policy = ... AND _retention_archived_at < ...
--       (the archive's retention), count(*) of it               -> SELECT, DELETE on it
--   restore: DELETE FROM <archive> ... RETURNING <every column> -> SELECT, DELETE on it
--            INSERT INTO <table> SELECT ...                     -> INSERT on the table
--            NOT EXISTS (SELECT 1 FROM <table> WHERE {{key}} = ...) -> SELECT on {{key}} (granted)
--   the check of the archive's columns                          -> nothing (the catalogs)
-- The archive itself: created below by the owner, with the DDL the first run would run (a run
-- that may not create a missing archive refuses before any delete and prints that DDL). The
-- alternative, GRANT CREATE ON the archive's schema, lets the first run create it (the role then
-- owns it); it also lets the role create any other table there, so the owner's DDL is preferred.
-- INSERT on the table is needed by restore only: leave it out, and grant it for the time of a
-- restore, where the job must never write rows otherwise.

GRANT SELECT ON TABLE {{table_sql}} TO :"role";
-- restore only (see above)
GRANT INSERT ON TABLE {{table_sql}} TO :"role";

{{create_archive}}
REVOKE ALL ON TABLE {{archive_sql}} FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON TABLE {{archive_sql}} TO :"role";
