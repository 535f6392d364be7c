-- shardkeeper registry schema, version 6: the lease history records fences.
-- P5 says a member never adopts while fenced nor within the grace after its
-- fence lifts; the history checker judges that from the registry's own
-- history, so every change of a member's fence (and of when it last lifted)
-- is recorded beside its lease. fence_lifted_at is moved onto the history's
-- wall clock like expires_at.
ALTER TABLE shardkeeper.lease_history
    ADD COLUMN fenced boolean NOT NULL DEFAULT false,
    ADD COLUMN fence_lifted_at timestamptz;

CREATE OR REPLACE FUNCTION shardkeeper.record_lease_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shardkeeper.lease_history (topology, member, incarnation, at, expires_at, "left", fenced, fence_lifted_at)
    VALUES (NEW.topology, NEW.member, NEW.incarnation, clock_timestamp(),
            NEW.lease_expires_at - shardkeeper.clock_offset(NEW.topology), NEW.left_at IS NOT NULL,
            NEW.fenced, NEW.fence_lifted_at - shardkeeper.clock_offset(NEW.topology));
    RETURN NULL;
END
$$;

-- Drain requests and slot moves still record nothing.
DROP TRIGGER members_history_update ON shardkeeper.members;
CREATE TRIGGER members_history_update AFTER UPDATE ON shardkeeper.members
    FOR EACH ROW
    WHEN (OLD.incarnation <> NEW.incarnation OR OLD.lease_expires_at <> NEW.lease_expires_at
          OR OLD.left_at IS DISTINCT FROM NEW.left_at OR OLD.fenced <> NEW.fenced
          OR OLD.fence_lifted_at IS DISTINCT FROM NEW.fence_lifted_at)
    EXECUTE FUNCTION shardkeeper.record_lease_change();
