-- Optional: what the cleanup role needs, on top of least_privilege.sql, for a policy with an
-- archive_table: here the guest-favorites table with the archive favorites.favorites_archive
-- (the guest-favorites policy itself keeps no archive; write your table's and archive's names).
--
-- Run once per database, as the owner of the table (or a superuser), after least_privilege.sql:
--     psql -v role=favorites_cleanup -f least_privilege_archive.sql "$OWNER_URL"
-- favorites_maintenance.retention.least_privilege.apply_archive_privileges() runs the same text.
--
-- An archive keeps the rows the retention was meant to remove, every column of them (private
-- ones included: favorites.favorites' anonymous_id and note), for archive_retention_days
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
--            NOT EXISTS (SELECT 1 FROM <table> WHERE id = ...)  -> SELECT on id (granted)
--   the check of the archive's columns                          -> nothing (the catalogs)
-- The archive itself: created below by the owner, with the DDL the first run would run (a run
-- that may not create a missing archive refuses before any delete and prints that DDL). The
-- alternative, GRANT CREATE ON SCHEMA favorites, lets the first run create it (the role then
-- owns it); it also lets the role create any other table there, so the owner's DDL is preferred.
-- INSERT on the table is needed by restore only: leave it out, and grant it for the time of a
-- restore, where the job must never write rows otherwise.

GRANT SELECT ON TABLE favorites.favorites TO :"role";
-- restore only (see above)
GRANT INSERT ON TABLE favorites.favorites TO :"role";

CREATE TABLE favorites.favorites_archive (
	id bigint,
	user_id bigint,
	anonymous_id uuid,
	item_id bigint,
	note text,
	created_at timestamp with time zone,
	updated_at timestamp with time zone,
	_retention_run_id TEXT NOT NULL,
	_retention_policy TEXT NOT NULL,
	_retention_archived_at TIMESTAMP WITH TIME ZONE NOT NULL
);
CREATE INDEX favorites_archive_brin_idx ON favorites.favorites_archive USING brin (_retention_policy, _retention_run_id, _retention_archived_at) WITH (autosummarize = on);
REVOKE ALL ON TABLE favorites.favorites_archive FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON TABLE favorites.favorites_archive TO :"role";
