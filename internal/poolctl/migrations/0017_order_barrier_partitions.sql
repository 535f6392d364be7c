-- shardkeeper registry schema, version 17: the registry side of the order
-- barrier of a change of N (issue 24, design.md section 8). The operator
-- does not write such a barrier yet (admission refuses a change of N under
-- PerKey until the workers hold by it and the operator lifts by its marks).
--
-- With V fixed, a change N -> N' moves a key from unit (p, s) to (p', s).
-- Its barrier has a row per old unit whose keys move: partition is the old
-- partition, predecessor its shard, switch_seq S_p (the stream's last
-- sequence once every publisher acknowledged the new epoch: publishers
-- switch one by one, the transform does not move), before_seq 0. A barrier
-- of a change of V leaves from_partitions and to_partitions NULL, as every
-- row written before this version does.
--
-- 0012's check on to_shards said "V changes"; now N or V does. PostgreSQL
-- named it (it reads two columns, so not after its own), hence the lookup.
DO $$
DECLARE
    c text;
BEGIN
    SELECT conname INTO STRICT c FROM pg_constraint
     WHERE conrelid = 'shardkeeper.order_barriers'::regclass AND contype = 'c'
       AND pg_get_constraintdef(oid) LIKE '%(to_shards <> from_shards)%';
    EXECUTE format('ALTER TABLE shardkeeper.order_barriers DROP CONSTRAINT %I', c);
END
$$;

ALTER TABLE shardkeeper.order_barriers
    ADD COLUMN from_partitions int CHECK (from_partitions BETWEEN 1 AND 1024),
    ADD COLUMN to_partitions   int CHECK (to_partitions BETWEEN 1 AND 1024),
    ADD CONSTRAINT order_barriers_to_shards_range CHECK (to_shards BETWEEN 1 AND 1024),
    ADD CONSTRAINT order_barriers_one_change CHECK (
        (from_partitions IS NULL AND to_partitions IS NULL AND to_shards <> from_shards)
     OR (from_partitions IS NOT NULL AND to_partitions IS NOT NULL AND from_partitions <> to_partitions
         AND to_shards = from_shards AND partition < from_partitions));

-- The drained-to marks of a change of N. Rows of keys moving into a unit
-- arrive below its own S_p and wait in its holder, unacknowledged, so its
-- ack floor cannot pass S_p while it waits for a unit that may wait for
-- it. Between batches the holder reads its consumer: when the pending
-- acknowledgements are exactly its held rows, every row at or below the
-- last one delivered is acknowledged or held (natsops.MarkOf), and it
-- records that here. The write is guarded by the holder's claim token,
-- which makes the mark true for good: while the token is valid no other
-- holder acted since the measurement, and a stale holder's count proves
-- nothing. It only raises the mark. The operator lifts the unit when its
-- mark passes S_p as it does when its ack floor does.
CREATE TABLE shardkeeper.order_marks (
    topology    text   NOT NULL REFERENCES shardkeeper.topologies ON DELETE CASCADE,
    -- The barrier's epoch: held rows are that change's moved-in keys, so a
    -- mark counts for its barrier alone.
    epoch       bigint NOT NULL CHECK (epoch > 0),
    unit        text   NOT NULL CHECK (unit ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$'),
    drained_to  bigint NOT NULL CHECK (drained_to >= 0),
    -- Who measured it, under which claim epoch, and when (registry clock).
    member      text   NOT NULL,
    claim_epoch bigint NOT NULL CHECK (claim_epoch > 0),
    marked_at   timestamptz NOT NULL,
    PRIMARY KEY (topology, epoch, unit)
);
