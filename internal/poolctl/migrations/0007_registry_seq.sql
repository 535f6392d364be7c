-- The registry sequence (issue 22): a per-topology counter that every
-- committed write transaction raises by one, and the timeline of the server
-- that wrote it. A promoted standby that missed the last commits has a
-- lower sequence than the clients saw (they refuse it, ZooKeeper-style) and
-- writes on a new timeline (it refuses itself). Both are detected before
-- the registry issues anything, and stay detected until Recover.
CREATE TABLE shardkeeper.registry_seq (
    topology        text PRIMARY KEY REFERENCES shardkeeper.topologies ON DELETE CASCADE,
    seq             bigint NOT NULL,
    -- The WAL timeline of the last write; NULL where it cannot be read.
    timeline        bigint,
    -- Set when a client reported a sequence above seq, or the timeline
    -- changed: every write is refused until Recover clears it.
    behind_reason   text,
    behind_seen     bigint NOT NULL DEFAULT 0
);

-- Floors Recover sets: no epoch number at or below epoch_floor is created,
-- and a unit without a claim row gets a free row at token_floor when an
-- epoch that contains it is created (so its first token is above every
-- token a lost primary may have issued for it).
ALTER TABLE shardkeeper.topologies ADD COLUMN epoch_floor bigint NOT NULL DEFAULT 0;
ALTER TABLE shardkeeper.topologies ADD COLUMN token_floor bigint NOT NULL DEFAULT 0;

-- The server's current WAL timeline, read from the name of the current WAL
-- file (pg_walfile_name needs no privilege, unlike pg_control_checkpoint).
-- NULL where it is not readable (in recovery, or the function is revoked).
CREATE FUNCTION shardkeeper.current_timeline() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN NOT pg_is_in_recovery()
                 AND has_function_privilege('pg_walfile_name(pg_lsn)', 'execute')
                 AND has_function_privilege('pg_current_wal_lsn()', 'execute')
           THEN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END
$$;

-- Raises the topology's sequence once per transaction, at commit (a
-- deferred constraint trigger runs after every statement of the
-- transaction), and tells the client the new value in a NOTICE (sessions
-- with shardkeeper.report_seq on), which the client adopts as the highest
-- sequence it has seen. It refuses the commit
-- (SQLSTATE SKBHD) while the registry is known to be behind, or when the
-- timeline differs from the last write's: the server was promoted or
-- restored, and may have lost commits clients acted on.
CREATE FUNCTION shardkeeper.bump_seq() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_topology text;
    v_key      text;
    v_tl       bigint;
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
    INSERT INTO shardkeeper.registry_seq (topology, seq, timeline) VALUES (v_topology, 0, v_tl)
        ON CONFLICT (topology) DO NOTHING;
    SELECT * INTO r FROM shardkeeper.registry_seq WHERE topology = v_topology FOR UPDATE;
    IF r.behind_reason IS NULL AND r.timeline IS NOT NULL AND v_tl IS NOT NULL AND r.timeline <> v_tl THEN
        -- Recorded by the next statement that can commit (ReportBehind or
        -- Recover); this transaction is refused as a whole.
        RAISE EXCEPTION USING ERRCODE = 'SKBHD', MESSAGE = 'registry timeline changed',
            DETAIL = format('seq=%s seen=0 timeline=%s was=%s', r.seq, v_tl, r.timeline);
    END IF;
    IF r.behind_reason IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'SKBHD', MESSAGE = r.behind_reason,
            DETAIL = format('seq=%s seen=%s timeline=%s was=%s', r.seq, r.behind_seen, v_tl, r.timeline);
    END IF;
    UPDATE shardkeeper.registry_seq SET seq = seq + 1, timeline = coalesce(v_tl, timeline)
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

CREATE CONSTRAINT TRIGGER claims_seq AFTER INSERT OR UPDATE OR DELETE ON shardkeeper.claims
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION shardkeeper.bump_seq();
CREATE CONSTRAINT TRIGGER members_seq AFTER INSERT OR UPDATE OR DELETE ON shardkeeper.members
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION shardkeeper.bump_seq();
CREATE CONSTRAINT TRIGGER epochs_seq AFTER INSERT OR UPDATE OR DELETE ON shardkeeper.epochs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION shardkeeper.bump_seq();
CREATE CONSTRAINT TRIGGER freeze_acks_seq AFTER INSERT OR UPDATE OR DELETE ON shardkeeper.freeze_acks
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION shardkeeper.bump_seq();
CREATE CONSTRAINT TRIGGER retiring_units_seq AFTER INSERT OR UPDATE OR DELETE ON shardkeeper.retiring_units
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION shardkeeper.bump_seq();
CREATE CONSTRAINT TRIGGER reset_permissions_seq AFTER INSERT OR UPDATE OR DELETE ON shardkeeper.reset_permissions
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION shardkeeper.bump_seq();
