-- shardkeeper registry schema, version 12: the order barrier of a change of
-- V under spec.rollout.ordering PerKey (issue 24). A change V -> V' moves
-- keys between the shards of each partition; a moved key's older rows
-- still sit in its old unit while its newer ones arrive in the new one.
-- The operator writes, before it activates the epoch, one row per
-- (partition, old shard that feeds some other new shard): the
-- predecessors. It records on them each partition stream's switch
-- sequence (the last row the old transform routed) once the transform
-- moved, and lifts a predecessor once its consumer acknowledged every row
-- at or below it. Workers hold a moved key's rows in its new unit while the
-- key's predecessor is not lifted. Only the operator writes these rows: a
-- worker needs SELECT alone, and README's worker role REVOKEs the rest
-- (the operator check below refuses a worker's write in any case).
CREATE TABLE shardkeeper.order_barriers (
    topology     text   NOT NULL REFERENCES shardkeeper.topologies ON DELETE CASCADE,
    -- The epoch whose activation moves the keys: a barrier is read only
    -- with its epoch, so a later change never reads an earlier barrier.
    epoch        bigint NOT NULL CHECK (epoch > 0),
    from_shards  int    NOT NULL CHECK (from_shards BETWEEN 1 AND 1024),
    to_shards    int    NOT NULL CHECK (to_shards BETWEEN 1 AND 1024 AND to_shards <> from_shards),
    partition    int    NOT NULL CHECK (partition BETWEEN 0 AND 1023),
    predecessor  int    NOT NULL CHECK (predecessor >= 0 AND predecessor < from_shards),
    -- A stream sequence read before the transform moved: every row at or
    -- below it was routed over from_shards.
    before_seq   bigint NOT NULL CHECK (before_seq >= 0),
    -- The switch: the last row routed over from_shards (NULL until the
    -- operator found it after moving the transform).
    switch_seq   bigint CHECK (switch_seq >= before_seq),
    -- When the operator found the predecessor's consumer had acknowledged
    -- every row at or below switch_seq (or was retired, drained).
    lifted_at    timestamptz,
    CHECK (lifted_at IS NULL OR switch_seq IS NOT NULL),
    PRIMARY KEY (topology, epoch, partition, predecessor)
);

-- Operator rows: checked against the operator token whoever writes them,
-- deletes included (a worker's role may delete from every table).
CREATE FUNCTION shardkeeper.order_barrier_write_check() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM shardkeeper.operator_check(OLD.topology);
        RETURN OLD;
    END IF;
    PERFORM shardkeeper.operator_check(NEW.topology);
    RETURN NEW;
END
$$;

CREATE TRIGGER order_barriers_operator BEFORE INSERT OR UPDATE OR DELETE ON shardkeeper.order_barriers
    FOR EACH ROW EXECUTE FUNCTION shardkeeper.order_barrier_write_check();
-- An ownership table: a registry that lost a lift must be found behind.
CREATE CONSTRAINT TRIGGER order_barriers_seq AFTER INSERT OR UPDATE OR DELETE ON shardkeeper.order_barriers
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION shardkeeper.bump_seq();
