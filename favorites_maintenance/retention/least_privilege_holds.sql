-- Optional: what the cleanup role needs, on top of least_privilege.sql, for a policy with a
-- hold_table: here the guest-favorites table with the hold table favorites.retention_holds
-- and holds on the key, id (write your hold table's name; docs/holds.md).
--
-- Run once per database, as the owner of the schema (or a superuser), after
-- least_privilege.sql:
--     psql -v role=favorites_cleanup -f least_privilege_holds.sql "$OWNER_URL"
-- favorites_maintenance.retention.least_privilege.apply_hold_privileges() runs the same text.
--
-- What the job does with holds, and the privilege each statement needs:
--   every count and probe: ... AND id NOT IN (SELECT held_value FROM <holds>
--       WHERE policy = ... AND released_at IS NULL)     -> SELECT (policy, held_value,
--                                                          released_at) on the hold table
--   the run's copy of the active holds, and before every batch the hold table's change
--       counter: SELECT changes FROM <holds>_changes    -> SELECT on the counter (without
--                                                          it the batches read the holds)
--   the held_rows check: count(*), min(placed_at) of the active holds   -> SELECT (placed_at)
--       and the active holds no row has: NOT EXISTS (SELECT 1 FROM favorites.favorites
--       WHERE id = CAST(held_value AS bigint))          -> SELECT (id), granted already
--   the hold column of the policy's table: id here, granted by least_privilege.sql. A policy
--   whose hold_column is another column needs SELECT on that column too, e.g.
--       GRANT SELECT (anonymous_id) ON TABLE favorites.favorites TO :"role";
--   (the column's values are then readable by the role: grant it only when holds need it).
--   the check of the hold table's columns                  -> nothing (the catalogs)
-- Not granted: INSERT, UPDATE, DELETE on the hold table. The job never writes a hold; whoever
-- places and releases holds (hold place, hold release, or the application) uses a role of its
-- own with SELECT, INSERT and UPDATE on the table; the trigger that raises the counter runs as
-- its owner, so that role needs nothing on the counter.
--
-- The hold table itself: created below by the owner, with the DDL hold init runs (and
-- hold init --print-sql prints), so that the job's role needs no CREATE on the schema.

CREATE TABLE IF NOT EXISTS favorites.retention_holds (
	hold_id BIGINT GENERATED ALWAYS AS IDENTITY, 
	policy TEXT NOT NULL, 
	held_value TEXT NOT NULL, 
	placed_by TEXT NOT NULL, 
	reason TEXT NOT NULL, 
	placed_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, 
	released_at TIMESTAMP WITH TIME ZONE, 
	released_by TEXT, 
	PRIMARY KEY (hold_id), 
	CONSTRAINT retention_holds_reason_given CHECK (reason <> '')
);
CREATE INDEX IF NOT EXISTS retention_holds_active_idx ON favorites.retention_holds (policy, held_value) WHERE released_at IS NULL;
CREATE TABLE IF NOT EXISTS favorites.retention_holds_changes (
	one BOOLEAN DEFAULT true NOT NULL, 
	changes BIGINT DEFAULT '0' NOT NULL, 
	PRIMARY KEY (one), 
	CONSTRAINT retention_holds_changes_one_row CHECK (one)
);
INSERT INTO favorites.retention_holds_changes (one, changes) VALUES (true, 0) ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION favorites.retention_holds_changed() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ BEGIN UPDATE favorites.retention_holds_changes SET changes = changes + 1; RETURN NULL; END $$;
CREATE OR REPLACE TRIGGER retention_holds_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON favorites.retention_holds FOR EACH STATEMENT EXECUTE FUNCTION favorites.retention_holds_changed();
ALTER TABLE favorites.retention_holds ENABLE ALWAYS TRIGGER retention_holds_changed;
REVOKE ALL ON TABLE favorites.retention_holds FROM PUBLIC;
GRANT SELECT (policy, held_value, placed_at, released_at) ON TABLE favorites.retention_holds TO :"role";
REVOKE ALL ON TABLE favorites.retention_holds_changes FROM PUBLIC;
GRANT SELECT ON TABLE favorites.retention_holds_changes TO :"role";
