-- Optional: what the cleanup role needs, on top of least_privilege.sql, for a policy with
-- drop_expired_partitions: true on {{table}}, partitioned by range on {{age}}; the
-- functions keep every partition that holds a {{guard_text}} (docs/partitioned-tables.md).
--
-- This file is a template: print it for a policy, and run it once per database as the owner of
-- the table (or a superuser), after least_privilege.sql:
--     favorites-maintenance partition-functions --policy NAME --role favorites_cleanup \
--         | psql -f - "$OWNER_URL"
-- favorites_maintenance.retention.least_privilege.apply_partition_functions() runs the same text.
--
-- Detaching and dropping a partition alter the table, which only its owner may do. Rather than
-- giving the cleanup role ownership, the owner installs two SECURITY DEFINER functions that run
-- as the owner, with a fixed search_path, and do one thing each, after checking again, under the
-- lock they take, what the job checked before calling them:
--   {{detach_function}}(partition, cutoff, lock_timeout_ms) -> rows detached
--       detaches one partition of {{table}} only when its upper bound is at or before
--       the cutoff (itself not in the future), it holds no {{guard_text}} and no row
--       at or after the cutoff, and no DELETE trigger, row-level security, publication that
--       publishes deletes or foreign key referencing it or the table would be bypassed; a
--       detach left pending (DETACH ... CONCURRENTLY interrupted) is finalized. The table is
--       renamed <partition>_detached (_2, _3, ... when taken), so that a tool creating
--       partitions by name (pg_partman) never writes into it, and marked by a comment (from
--       which table, which partition it was and its bounds, when, how many rows).
--   {{drop_function}}(table, keep_for, lock_timeout_ms) -> rows dropped
--       drops one table only when the comment says it was detached from {{table}} by
--       these functions or the job, keep_for has passed since, it is not a partition again and
--       it holds no {{guard_text}}.
-- Each refusal raises SQLSTATE 55000 with a message starting "kept: ", which the run logs; the
-- job then leaves the partition's rows to its batches.
--
-- A function cannot run DETACH ... CONCURRENTLY (PostgreSQL refuses it inside a transaction):
-- the function's DETACH is the plain one. It holds an ACCESS EXCLUSIVE lock on the table for the
-- time of the catalog change only; its wait for that lock, behind other sessions, is bounded by
-- lock_timeout_ms (the job's lock timeout), and the job tries again later with a longer pause.

CREATE OR REPLACE FUNCTION {{detach_function}}(
    part regclass, cutoff timestamptz, lock_timeout_ms integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $fn$
DECLARE
    parent CONSTANT regclass := {{parent_literal}}::regclass;
    bound text;
    pending boolean;
    upper_bound timestamptz;
    blocker text;
    found boolean;
    rows_found bigint;
    part_schema name;
    part_name name;
    suffix text;
    free_name text;
BEGIN
    IF cutoff IS NULL OR cutoff > now() THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'kept: the cutoff is not a past instant';
    END IF;
    PERFORM set_config('lock_timeout', greatest(coalesce(lock_timeout_ms, 1), 1) || 'ms', true);
    SELECT i.inhdetachpending, pg_get_expr(c.relpartbound, c.oid) INTO pending, bound
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhrelid = part AND i.inhparent = parent;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: %s is not a partition of %s', part, parent);
    END IF;
    upper_bound := CAST(substring(bound FROM $re$ TO \('([^']*)'\)$re$) AS timestamptz);
    IF upper_bound IS NULL OR upper_bound > cutoff THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: the range of %s (%s) does not end at or before the cutoff',
                             part, bound);
    END IF;
    -- The same order as DETACH itself: the table, then the partition.
    EXECUTE format('LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE', parent);
    EXECUTE format('LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE', part);
    SELECT b INTO blocker FROM (
{{bypass_query}}    ) AS blockers LIMIT 1;
    IF blocker IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: a DROP would bypass %s', blocker);
    END IF;
    -- The rows the guard keeps ('false' for a rule with no guard, which keeps none).
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE %s)', part, {{kept_condition}})
       INTO found;
    IF found THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: %s holds a row with %s NOT NULL', part, {{guard_names}});
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE %I >= $1)', part, {{age_literal}})
       INTO found USING cutoff;
    IF found THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: %s holds a row at or after the cutoff', part);
    END IF;
    EXECUTE format('SELECT count(*) FROM %s', part) INTO rows_found;
    IF pending THEN
        EXECUTE format('ALTER TABLE %s DETACH PARTITION %s FINALIZE', parent, part);
    ELSE
        EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', parent, part);
    END IF;
    -- A free name, so that nothing that creates partitions by name reuses this table.
    SELECT n.nspname, c.relname INTO part_schema, part_name
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = part;
    FOR attempt IN 1..1000 LOOP
        suffix := '_detached' || CASE WHEN attempt > 1 THEN '_' || attempt ELSE '' END;
        free_name := part_name;
        WHILE octet_length(free_name || suffix) > 63 LOOP
            free_name := left(free_name, -1);
        END LOOP;
        free_name := free_name || suffix;
        EXIT WHEN to_regclass(format('%I.%I', part_schema, free_name)) IS NULL
              AND to_regtype(format('%I.%I', part_schema, free_name)) IS NULL;
    END LOOP;
    EXECUTE format('ALTER TABLE %s RENAME TO %I', part, free_name);
    EXECUTE format('COMMENT ON TABLE %s IS %L', part, json_build_object(
        'favorites_maintenance', 'detached', 'from', {{table_literal}},
        'partition', format('%s.%s', part_schema, part_name), 'bounds', bound,
        'at', now(), 'rows', rows_found)::text);
    RETURN rows_found;
END
$fn$;

CREATE OR REPLACE FUNCTION {{drop_function}}(
    detached regclass, keep_for interval, lock_timeout_ms integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $fn$
DECLARE
    note text := obj_description(detached, 'pg_class');
    mark jsonb;
    found boolean;
    rows_found bigint;
BEGIN
    IF note IS NULL OR note NOT LIKE '{"favorites_maintenance"%' THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: %s was not detached by the cleanup', detached);
    END IF;
    mark := note::jsonb;
    IF mark->>'favorites_maintenance' IS DISTINCT FROM 'detached'
       OR mark->>'from' IS DISTINCT FROM {{table_literal}} THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: %s was not detached from %s', detached, {{table_literal}});
    END IF;
    IF (SELECT c.relispartition OR c.relkind <> 'r' FROM pg_class c WHERE c.oid = detached) THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: %s is a partition again', detached);
    END IF;
    IF keep_for IS NULL OR CAST(mark->>'at' AS timestamptz) + keep_for > now() THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: %s was detached less than %s ago', detached, keep_for);
    END IF;
    PERFORM set_config('lock_timeout', greatest(coalesce(lock_timeout_ms, 1), 1) || 'ms', true);
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', detached);
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE %s)', detached, {{kept_condition}})
       INTO found;
    IF found THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('kept: %s holds a row with %s NOT NULL', detached, {{guard_names}});
    END IF;
    EXECUTE format('SELECT count(*) FROM %s', detached) INTO rows_found;
    EXECUTE format('DROP TABLE %s', detached);
    RETURN rows_found;
END
$fn$;

REVOKE ALL ON FUNCTION {{detach_function}}(regclass, timestamptz, integer)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {{drop_function}}(regclass, interval, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{detach_function}}(regclass, timestamptz, integer)
    TO :"role";
GRANT EXECUTE ON FUNCTION {{drop_function}}(regclass, interval, integer)
    TO :"role";
