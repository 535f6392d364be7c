-- shardkeeper registry schema, version 13: the server's system identifier
-- beside the WAL timeline (issue 22). A physical standby shares its
-- primary's identifier, so a failover shows in the timeline; a registry
-- loaded from a logical dump into another cluster (pg_dump/pg_restore, a
-- managed service's "restore to a new instance") may start on timeline 1
-- again, the one recorded, and only its identifier tells it apart. Such a
-- registry has lost whatever was written after the dump: its first write
-- is refused, before any client has to notice, exactly like a changed
-- timeline, until Recover.
--
-- Stock PostgreSQL lets any role run pg_control_system(). Where a managed
-- service revokes it from the schema's owner, the identifier is NULL and
-- not compared:
-- the clients' marks still find a registry that went back in time, within
-- a renew interval.
ALTER TABLE shardkeeper.registry_seq ADD COLUMN system_id bigint;

-- The server's system identifier, or NULL where the schema's owner may not
-- read it. PL/pgSQL plans the query only when it runs, so a role without
-- the privilege never plans (and is never refused) the call.
CREATE FUNCTION shardkeeper.current_system_id() RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v bigint;
BEGIN
    IF has_function_privilege('pg_catalog.pg_control_system()', 'execute') THEN
        EXECUTE 'SELECT system_identifier FROM pg_catalog.pg_control_system()' INTO v;
    END IF;
    RETURN v;
END
$$;

-- True while the registry is known to be behind a client, or its timeline
-- or system identifier changed since the last write (bump_seq refuses its
-- writes then).
CREATE OR REPLACE FUNCTION shardkeeper.registry_suspect(p_topology text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce((SELECT r.behind_reason IS NOT NULL
                         OR (r.timeline IS NOT NULL AND cur.tl IS NOT NULL AND r.timeline <> cur.tl)
                         OR (r.system_id IS NOT NULL AND cur.sys IS NOT NULL AND r.system_id <> cur.sys)
                       FROM shardkeeper.registry_seq r,
                            (SELECT shardkeeper.current_timeline() AS tl, shardkeeper.current_system_id() AS sys) cur
                      WHERE r.topology = p_topology), false)
$$;

-- bump_seq as in version 7 (and 11: it runs as the schema's owner), and
-- now also refusing a commit on another system than the last write's.
CREATE OR REPLACE FUNCTION shardkeeper.bump_seq() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_topology text;
    v_key      text;
    v_tl       bigint;
    v_sys      bigint;
    r          shardkeeper.registry_seq%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN v_topology := OLD.topology; ELSE v_topology := NEW.topology; END IF;
    v_key := txid_current()::text || '/' || v_topology; -- txid_current: PostgreSQL 11 has no pg_current_xact_id
    IF current_setting('shardkeeper.bumped', true) = v_key THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM shardkeeper.topologies WHERE topology = v_topology) THEN
        RETURN NULL; -- the topology is being deleted
    END IF;
    PERFORM set_config('shardkeeper.bumped', v_key, true);
    v_tl := shardkeeper.current_timeline();
    v_sys := shardkeeper.current_system_id();
    INSERT INTO shardkeeper.registry_seq (topology, seq, timeline, system_id) VALUES (v_topology, 0, v_tl, v_sys)
        ON CONFLICT (topology) DO NOTHING;
    SELECT * INTO r FROM shardkeeper.registry_seq WHERE topology = v_topology FOR UPDATE;
    IF r.behind_reason IS NULL AND r.timeline IS NOT NULL AND v_tl IS NOT NULL AND r.timeline <> v_tl THEN
        -- Recorded by the next statement that can commit (ReportBehind or
        -- Recover); this transaction is refused as a whole.
        RAISE EXCEPTION USING ERRCODE = 'SKBHD', MESSAGE = 'registry timeline changed',
            DETAIL = format('seq=%s seen=0 timeline=%s was=%s', r.seq, v_tl, r.timeline);
    END IF;
    IF r.behind_reason IS NULL AND r.system_id IS NOT NULL AND v_sys IS NOT NULL AND r.system_id <> v_sys THEN
        RAISE EXCEPTION USING ERRCODE = 'SKBHD', MESSAGE = 'registry system identifier changed',
            DETAIL = format('seq=%s seen=0 timeline=%s was=%s', r.seq, v_tl, r.timeline);
    END IF;
    IF r.behind_reason IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SKBHD', MESSAGE = r.behind_reason,
            DETAIL = format('seq=%s seen=%s timeline=%s was=%s', r.seq, r.behind_seen, v_tl, r.timeline);
    END IF;
    UPDATE shardkeeper.registry_seq SET seq = seq + 1, timeline = coalesce(v_tl, timeline), system_id = coalesce(v_sys, system_id)
     WHERE topology = v_topology RETURNING seq INTO r.seq;
    -- Only sessions that asked (Open sets shardkeeper.report_seq): a
    -- notice is flushed to the client at once, before the commit is done,
    -- so a client that does not read it should not get it.
    IF current_setting('shardkeeper.report_seq', true) = 'on' THEN
        RAISE NOTICE USING MESSAGE = 'shardkeeper registry seq', DETAIL = v_topology, HINT = r.seq::text;
    END IF;
    RETURN NULL;
END
$$;
