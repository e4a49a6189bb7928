-- The role the guest favorites cleanup runs as, holding only what the job needs.
--
-- Run once per database, as the owner of favorites.favorites (or a superuser), e.g.
--     psql -v role=favorites_cleanup -f least_privilege.sql "$OWNER_URL"
-- then give the role a password the way your platform manages secrets (psql: \password).
-- favorites_maintenance.retention.least_privilege.apply_least_privilege() runs the same text.
--
-- What the job does, and the privilege each statement needs:
--   SELECT id, updated_at ... WHERE user_id IS NULL AND updated_at < $cutoff
--       ORDER BY updated_at, id FOR UPDATE SKIP LOCKED   -> SELECT on the three columns it reads
--   DELETE ... WHERE <same guard> AND ctid = <batch ctid>
--       AND id = <batch id>                                 -> DELETE on the table, and SELECT
--                                                              on ctid (a row address, no data)
--   SELECT count(*), min(updated_at) ... (the backlog)     -> SELECT on the three columns
--   pg_is_in_recovery(), set_config(...)                   -> nothing
-- and one more, which PostgreSQL imposes: a row-locking clause (FOR UPDATE, FOR SHARE, ...)
-- requires UPDATE privilege on at least one column of the table, even when the rows are then
-- only deleted. Without it every batch fails with "permission denied for table favorites", and
-- without the lock clause the job could no longer skip rows a user transaction holds (it would
-- wait on them) nor run side by side with another purge. The grant below is therefore UPDATE on
-- updated_at only: the column the rule reads anyway, the least harmful to hold (no ownership,
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
-- Not granted: any other column (anonymous_id and note are private and never read), INSERT,
-- TRUNCATE, REFERENCES, TRIGGER, CREATE on the schema, and anything on any other table.

CREATE ROLE :"role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS;

REVOKE ALL ON TABLE favorites.favorites FROM :"role";
GRANT USAGE ON SCHEMA favorites TO :"role";
GRANT SELECT (id, user_id, updated_at, ctid) ON TABLE favorites.favorites TO :"role";
GRANT DELETE ON TABLE favorites.favorites TO :"role";
-- Only for FOR UPDATE SKIP LOCKED (see above); never used to write.
GRANT UPDATE (updated_at) ON TABLE favorites.favorites TO :"role";
