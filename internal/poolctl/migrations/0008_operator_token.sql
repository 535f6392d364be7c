-- shardkeeper registry schema, version 8: the operator's leader token
-- (issue 21). Operator replicas elect a leader with a Kubernetes Lease, but
-- a leader that was paused (a long GC, a stopped node, a partition) may
-- resume after another replica took over and still act on what it read
-- before. Each leader therefore takes a token in the registry, per
-- topology, before its first write, and every operator write carries it:
-- the registry refuses a write whose token is not the latest one taken
-- (SQLSTATE SKOPF). The token is kept per topology, not per registry, so
-- operators that watch different namespaces never fence each other.
CREATE TABLE shardkeeper.operator_tokens (
    -- No foreign key: the numbering survives the topology's deletion, so
    -- a topology created again under the same key never hands out a
    -- token an earlier leader held.
    topology  text PRIMARY KEY,
    epoch     bigint NOT NULL,
    -- The leader that took it (the operator's identity), for refusals.
    holder    text NOT NULL,
    taken_at  timestamptz NOT NULL
);

-- Refuses the calling transaction unless it carries the topology's latest
-- operator token (set by operator_fence). A transaction carrying none is
-- refused once any token was taken for the topology: an operator that
-- predates tokens (a paused leader of an older version) writes nothing
-- after its successor took over. The token row is read FOR SHARE, so a
-- concurrent take waits for this transaction and the new leader reads
-- whatever it wrote.
CREATE FUNCTION shardkeeper.operator_check(p_topology text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_set text := coalesce(current_setting('shardkeeper.operator_token', true), '');
    r     shardkeeper.operator_tokens%ROWTYPE;
BEGIN
    SELECT * INTO r FROM shardkeeper.operator_tokens WHERE topology = p_topology FOR SHARE;
    IF v_set = '' AND NOT FOUND THEN
        RETURN; -- no operator ever took a token: tests and tools
    END IF;
    IF v_set = '' OR NOT FOUND OR r.epoch <> v_set::bigint THEN
        RAISE EXCEPTION USING ERRCODE = 'SKOPF',
            MESSAGE = 'operator token superseded',
            DETAIL = format('presented=%s current=%s', CASE WHEN v_set = '' THEN '0' ELSE v_set END, coalesce(r.epoch, 0)),
            HINT = coalesce(r.holder, '');
    END IF;
END
$$;

-- Marks the transaction as the operator's under token p_epoch, and checks
-- it at once (a fenced read, and writes no trigger covers, rely on this).
CREATE FUNCTION shardkeeper.operator_fence(p_topology text, p_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('shardkeeper.operator_token', p_epoch::text, true);
    PERFORM shardkeeper.operator_check(p_topology);
END
$$;

-- The backstop: the rows only the operator writes are checked whoever
-- writes them, so a write that bypasses operator_fence is refused too.
-- Members are checked only when their drain request changes (workers
-- write the rest of the row).
CREATE FUNCTION shardkeeper.operator_write_check() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'members' THEN
        IF TG_OP = 'INSERT' AND NOT NEW.draining THEN
            RETURN NEW;
        END IF;
        IF TG_OP = 'UPDATE' AND NEW.draining IS NOT DISTINCT FROM OLD.draining THEN
            RETURN NEW;
        END IF;
    END IF;
    PERFORM shardkeeper.operator_check(NEW.topology);
    RETURN NEW;
END
$$;

CREATE TRIGGER members_operator BEFORE INSERT OR UPDATE ON shardkeeper.members
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.operator_write_check();
CREATE TRIGGER epochs_operator BEFORE INSERT OR UPDATE ON shardkeeper.epochs
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.operator_write_check();
CREATE TRIGGER retiring_units_operator BEFORE INSERT ON shardkeeper.retiring_units
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.operator_write_check();
CREATE TRIGGER reset_permissions_operator BEFORE INSERT OR UPDATE ON shardkeeper.reset_permissions
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.operator_write_check();
