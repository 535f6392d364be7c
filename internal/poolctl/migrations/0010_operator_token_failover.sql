-- shardkeeper registry schema, version 10: operator tokens across a
-- failover (issue 21). A standby promoted before it received the newest
-- token take hands that token's number out again at the next take: the
-- leader that took it on the lost primary, if it was paused and resumes
-- after the new take and after Recover, writes as the new leader. And that
-- leader, if it is the live one, presents a token above the registry's
-- and was refused as superseded by its own Recover, so it stopped.
--
-- Two changes close both. A take while the registry may have lost commits
-- (it was found behind, or its timeline changed since the last write)
-- moves the token by a margin rather than by one, past any take the lost
-- primary made. And Recover, run by a leader, moves the token past every
-- take the lost primary may have made and binds it to that leader,
-- accepting a token above the registry's (its own lost take) but never one
-- below (a newer leader's take the registry kept).

-- True while the registry is known to be behind a client, or its timeline
-- changed since the last write (bump_seq refuses its writes then).
CREATE FUNCTION shardkeeper.registry_suspect(p_topology text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce((SELECT r.behind_reason IS NOT NULL
                         OR (r.timeline IS NOT NULL AND tl.now IS NOT NULL AND r.timeline <> tl.now)
                       FROM shardkeeper.registry_seq r, (SELECT shardkeeper.current_timeline() AS now) tl
                      WHERE r.topology = p_topology), false)
$$;

-- Recover's operator fence: refuses a token below the topology's latest
-- (SQLSTATE SKOPF, as operator_check), accepts the latest or one above it
-- (a take only the lost primary had), then moves the token p_margin past
-- both, binds it to p_holder and marks the transaction with it, so that
-- Recover's own writes pass the triggers' checks. Returns the new token.
CREATE FUNCTION shardkeeper.operator_recover_fence(p_topology text, p_epoch bigint, p_holder text, p_margin bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r       shardkeeper.operator_tokens%ROWTYPE;
    v_epoch bigint;
BEGIN
    SELECT * INTO r FROM shardkeeper.operator_tokens WHERE topology = p_topology FOR UPDATE;
    IF p_epoch <= 0 OR (FOUND AND r.epoch > p_epoch) THEN
        RAISE EXCEPTION USING ERRCODE = 'SKOPF',
            MESSAGE = 'operator token superseded',
            DETAIL = format('presented=%s current=%s', p_epoch, coalesce(r.epoch, 0)),
            HINT = coalesce(r.holder, '');
    END IF;
    v_epoch := greatest(coalesce(r.epoch, 0), p_epoch) + p_margin;
    INSERT INTO shardkeeper.operator_tokens AS o (topology, epoch, holder, taken_at)
    VALUES (p_topology, v_epoch, p_holder, clock_timestamp())
    ON CONFLICT (topology) DO UPDATE SET epoch = excluded.epoch, holder = excluded.holder, taken_at = excluded.taken_at;
    PERFORM set_config('shardkeeper.operator_token', v_epoch::text, true);
    RETURN v_epoch;
END
$$;
