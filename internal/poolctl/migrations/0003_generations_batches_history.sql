-- shardkeeper registry schema, version 3: fence generations, re-home grace,
-- the retiring set, activity reports, append-only history, RESET permission
-- detail, and a clock offset that only test databases can set.

-- Fence generations: a Fence of generation g applies only above the last
-- recorded generation, so one that arrives after the Unfence of g changes
-- nothing. A join starts the new incarnation at generation 0.
-- prev_lease_expires_at is the previous incarnation's lease expiry when it
-- had not left: until it plus the grace has passed, a second process under
-- the same name may still be delivering, so the new incarnation does not
-- re-home the earlier incarnation's units.
ALTER TABLE shardkeeper.members
    ADD COLUMN fence_gen bigint NOT NULL DEFAULT 0,
    ADD COLUMN prev_lease_expires_at timestamptz;

-- What the last transition of a claim was, so a repeat of a Claim whose
-- reply was lost reports the same decision (adopted_from, rehomed), and the
-- history trigger records what changed the row and under which topology
-- epoch it was decided.
ALTER TABLE shardkeeper.claims
    ADD COLUMN adopted_from text,
    ADD COLUMN rehomed boolean NOT NULL DEFAULT false,
    ADD COLUMN last_op text CHECK (last_op IN ('claim', 'adopt', 'rehome', 'settle', 'handover', 'release')),
    ADD COLUMN under_epoch bigint;

-- Units that left the active epoch and still hold rows: their claims may be
-- taken (free, absent or adoptable) so someone drains them.
CREATE TABLE shardkeeper.retiring_units (
    topology text NOT NULL REFERENCES shardkeeper.topologies ON DELETE CASCADE,
    unit     text NOT NULL CHECK (unit ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$'),
    PRIMARY KEY (topology, unit)
);

-- Each member's latest activity report, one row per unit it reported, on
-- the registry's clock. Two members may report one unit: that is what the
-- operator looks for.
CREATE TABLE shardkeeper.unit_activity (
    topology      text NOT NULL,
    unit          text NOT NULL CHECK (unit ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$'),
    member        text NOT NULL,
    incarnation   bigint NOT NULL,
    epoch         bigint NOT NULL,
    reported_at   timestamptz NOT NULL,
    last_fetch_at timestamptz,
    last_rows_at  timestamptz,
    PRIMARY KEY (topology, member, unit),
    FOREIGN KEY (topology, member) REFERENCES shardkeeper.members ON DELETE CASCADE
);

-- The census detail workers check at the moment they would RESET.
ALTER TABLE shardkeeper.reset_permissions
    ADD COLUMN floor text NOT NULL DEFAULT '',
    ADD COLUMN servers jsonb NOT NULL DEFAULT '{}';

-- The test clock. shardkeeper.clock adds a topology's clock_offset only in
-- sessions where shardkeeper.test_clock is on (pgtest turns it on for test
-- databases with ALTER DATABASE ... SET), and the offset cannot change
-- anywhere else, so production's clock is the primary's clock_timestamp().
CREATE FUNCTION shardkeeper.clock_offset(p_topology text) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_setting('shardkeeper.test_clock', true) = 'on' THEN clock_offset ELSE interval '0' END
      FROM shardkeeper.topologies WHERE topology = p_topology
$$;

CREATE OR REPLACE FUNCTION shardkeeper.clock(p_topology text) RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$
    SELECT clock_timestamp() + shardkeeper.clock_offset(p_topology)
$$;

CREATE FUNCTION shardkeeper.guard_clock_offset() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    changed boolean;
BEGIN
    IF TG_OP = 'INSERT' THEN
        changed := NEW.clock_offset <> interval '0';
    ELSE
        changed := NEW.clock_offset IS DISTINCT FROM OLD.clock_offset;
    END IF;
    IF changed AND current_setting('shardkeeper.test_clock', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'the registry clock offset of topology % is a test hook: it can change only where shardkeeper.test_clock is on', NEW.topology
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER topologies_guard_clock BEFORE INSERT OR UPDATE ON shardkeeper.topologies
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.guard_clock_offset();

-- Append-only history, the evidence the history checker judges deliveries
-- against. Times are clock_timestamp(), the database's wall clock without
-- the test offset, so they compare with other processes' clocks; an event's
-- time is when the change was made inside its transaction, which commits
-- right after.
CREATE TABLE shardkeeper.claim_history (
    id          bigserial PRIMARY KEY,
    topology    text NOT NULL,
    unit        text NOT NULL,
    owner       text,
    incarnation bigint,
    epoch       bigint NOT NULL,
    state       text NOT NULL,
    under_epoch bigint,
    op          text,
    at          timestamptz NOT NULL
);
CREATE INDEX claim_history_topology ON shardkeeper.claim_history (topology, id);
CREATE INDEX claim_history_at ON shardkeeper.claim_history (topology, at);

CREATE TABLE shardkeeper.lease_history (
    id          bigserial PRIMARY KEY,
    topology    text NOT NULL,
    member      text NOT NULL,
    incarnation bigint NOT NULL,
    at          timestamptz NOT NULL,
    -- expires_at is the lease expiry moved onto the same wall clock as at.
    expires_at  timestamptz NOT NULL,
    "left"      boolean NOT NULL
);
CREATE INDEX lease_history_topology ON shardkeeper.lease_history (topology, id);
CREATE INDEX lease_history_at ON shardkeeper.lease_history (topology, at);

CREATE FUNCTION shardkeeper.record_claim_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shardkeeper.claim_history (topology, unit, owner, incarnation, epoch, state, under_epoch, op, at)
    VALUES (NEW.topology, NEW.unit, NEW.owner, NEW.owner_incarnation, NEW.fencing_epoch, NEW.state,
            NEW.under_epoch, NEW.last_op, clock_timestamp());
    RETURN NULL;
END
$$;
CREATE TRIGGER claims_history_insert AFTER INSERT ON shardkeeper.claims
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.record_claim_change();
-- Checkpoints change none of these columns and record nothing.
CREATE TRIGGER claims_history_update AFTER UPDATE ON shardkeeper.claims
    FOR EACH ROW
    WHEN (OLD.owner IS DISTINCT FROM NEW.owner OR OLD.owner_incarnation IS DISTINCT FROM NEW.owner_incarnation
          OR OLD.fencing_epoch <> NEW.fencing_epoch OR OLD.state <> NEW.state)
    EXECUTE FUNCTION shardkeeper.record_claim_change();

CREATE FUNCTION shardkeeper.record_lease_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO shardkeeper.lease_history (topology, member, incarnation, at, expires_at, "left")
    VALUES (NEW.topology, NEW.member, NEW.incarnation, clock_timestamp(),
            NEW.lease_expires_at - shardkeeper.clock_offset(NEW.topology), NEW.left_at IS NOT NULL);
    RETURN NULL;
END
$$;
CREATE TRIGGER members_history_insert AFTER INSERT ON shardkeeper.members
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.record_lease_change();
-- Fences, drain requests and slot moves record nothing.
CREATE TRIGGER members_history_update AFTER UPDATE ON shardkeeper.members
    FOR EACH ROW
    WHEN (OLD.incarnation <> NEW.incarnation OR OLD.lease_expires_at <> NEW.lease_expires_at
          OR OLD.left_at IS DISTINCT FROM NEW.left_at)
    EXECUTE FUNCTION shardkeeper.record_lease_change();

-- When each epoch became active and was retired, on the same wall clock as
-- the history (activated_at and retired_at stay on the registry's clock).
ALTER TABLE shardkeeper.epochs
    ADD COLUMN activated_wall_at timestamptz,
    ADD COLUMN retired_wall_at timestamptz;
UPDATE shardkeeper.epochs SET activated_wall_at = activated_at, retired_wall_at = retired_at;

CREATE FUNCTION shardkeeper.record_epoch_times() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'active' AND (TG_OP = 'INSERT' OR OLD.state <> 'active') THEN
        NEW.activated_wall_at := clock_timestamp();
    END IF;
    IF NEW.state = 'retired' AND (TG_OP = 'INSERT' OR OLD.state <> 'retired') THEN
        NEW.retired_wall_at := clock_timestamp();
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER epochs_wall_times BEFORE INSERT OR UPDATE OF state ON shardkeeper.epochs
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.record_epoch_times();
