-- The role the cleanup of {{table}} runs as, holding only what the job needs.
--
-- This file is a template: print it for a policy, and run it once per database as the owner of
-- the table (or a superuser):
--     favorites-maintenance grants --policy NAME --role favorites_cleanup | psql -f - "$OWNER_URL"
-- then give the role a password the way your platform manages secrets (psql: \password).
-- favorites_maintenance.retention.least_privilege.apply_least_privilege() runs the same text.
--
-- What the job does, and the privilege each statement needs (key {{key}}, age {{age}},
-- guard: {{guard_text}}):
--   SELECT <key>, <age> ... WHERE <guard> AND <age> < $cutoff
--       ORDER BY <age>, <key> FOR UPDATE SKIP LOCKED     -> SELECT on the columns it reads
--   DELETE ... WHERE <same guard> AND ctid = <batch ctid>
--       AND <key> = <batch key>                             -> DELETE on the table, and SELECT
--                                                              on ctid (a row address, no data)
--   SELECT count(*), min(<age>) ... (the backlog)          -> SELECT on the same columns
--   pg_is_in_recovery(), set_config(...)                   -> nothing
-- and one more, which PostgreSQL imposes: a row-locking clause (FOR UPDATE, FOR SHARE, ...)
-- requires UPDATE privilege on at least one column of the table, even when the rows are then
-- only deleted. Without it every batch fails with "permission denied for table ...", and
-- without the lock clause the job could no longer skip rows a user transaction holds (it would
-- wait on them) nor run side by side with another purge. The grant below is therefore UPDATE on
-- the age column only: the column the rule reads anyway, the least harmful to hold (no ownership,
-- no key). The job never writes it: the least-privilege test runs the whole job under this role
-- with a trigger that refuses any UPDATE by it.
--
-- With row-level security enabled on the table, the role also needs the policies of
-- row_level_security.sql (next to this file): without an UPDATE policy FOR UPDATE locks nothing.
--
-- Optional, for the purge's health indicators (docs/sharing-the-database.md): reading the
-- replay position of other sessions' standbys (pg_stat_replication) and an autovacuum's
-- progress on the table (pg_stat_progress_vacuum) needs the privileges of pg_read_all_stats,
-- part of pg_monitor. Without them the purge logs once that it skips those two indicators and
-- goes on (replication slots and the WAL rate stay readable). The role is NOINHERIT, so the
-- grant has to carry INHERIT itself; it needs a superuser (or ADMIN OPTION on pg_monitor):
-- GRANT pg_monitor TO :"role" WITH INHERIT TRUE;
--
-- Not granted: any other column (a private one is never read), INSERT, TRUNCATE, REFERENCES,
-- TRIGGER, CREATE on the schema, and anything on any other table.

CREATE ROLE :"role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS;

REVOKE ALL ON TABLE {{table_sql}} FROM :"role";
GRANT USAGE ON SCHEMA {{schema_sql}} TO :"role";
GRANT SELECT ({{read_columns_sql}}, ctid) ON TABLE {{table_sql}} TO :"role";
GRANT DELETE ON TABLE {{table_sql}} TO :"role";
-- Only for FOR UPDATE SKIP LOCKED (see above); never used to write.
GRANT UPDATE ({{age_sql}}) ON TABLE {{table_sql}} TO :"role";
