-- shardkeeper registry schema, version 1.
-- Every table is keyed by topology (a ShardTopology's namespace/name).

CREATE TABLE shardkeeper.topologies (
    topology         text PRIMARY KEY,
    lease_ttl        interval NOT NULL,
    renew_interval   interval NOT NULL,
    query_bound      interval NOT NULL,
    grace            interval NOT NULL,
    -- Test hook: shifts this topology's registry clock. Production leaves
    -- it at zero, so the clock is the database's.
    clock_offset     interval NOT NULL DEFAULT '0',
    next_incarnation bigint NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CHECK (lease_ttl > renew_interval + query_bound),
    CHECK (grace >= renew_interval + query_bound)
);

-- The registry's clock for one topology: the database's, plus the test
-- offset. NULL for an unknown topology.
CREATE FUNCTION shardkeeper.clock(p_topology text) RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$
    SELECT clock_timestamp() + clock_offset FROM shardkeeper.topologies WHERE topology = p_topology
$$;

CREATE TABLE shardkeeper.epochs (
    topology     text NOT NULL REFERENCES shardkeeper.topologies ON DELETE CASCADE,
    epoch        bigint NOT NULL CHECK (epoch > 0),
    partitions   int NOT NULL CHECK (partitions BETWEEN 1 AND 1024),
    shards       int NOT NULL CHECK (shards BETWEEN 1 AND 1024),
    state        text NOT NULL CHECK (state IN ('pending', 'active', 'retired')),
    created_at   timestamptz NOT NULL,
    activated_at timestamptz,
    retired_at   timestamptz,
    PRIMARY KEY (topology, epoch),
    CHECK (partitions * shards <= 65536)
);
CREATE UNIQUE INDEX epochs_one_active ON shardkeeper.epochs (topology) WHERE state = 'active';
CREATE UNIQUE INDEX epochs_one_pending ON shardkeeper.epochs (topology) WHERE state = 'pending';

-- One row per member (pod name), kept after it leaves so claims can name
-- it. Each join raises incarnation.
CREATE TABLE shardkeeper.members (
    topology         text NOT NULL REFERENCES shardkeeper.topologies ON DELETE CASCADE,
    member           text NOT NULL CHECK (member <> ''),
    slot             int CHECK (slot >= 0),
    incarnation      bigint NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    fenced           boolean NOT NULL DEFAULT false,
    fence_lifted_at  timestamptz,
    joined_at        timestamptz NOT NULL,
    left_at          timestamptz,
    PRIMARY KEY (topology, member)
);
CREATE UNIQUE INDEX members_slot ON shardkeeper.members (topology, slot) WHERE slot IS NOT NULL;

CREATE TABLE shardkeeper.freeze_acks (
    topology    text NOT NULL,
    epoch       bigint NOT NULL,
    member      text NOT NULL,
    incarnation bigint NOT NULL,
    acked_at    timestamptz NOT NULL,
    PRIMARY KEY (topology, epoch, member),
    FOREIGN KEY (topology, epoch) REFERENCES shardkeeper.epochs ON DELETE CASCADE,
    FOREIGN KEY (topology, member) REFERENCES shardkeeper.members ON DELETE CASCADE
);

-- One row per unit ever claimed. An absent row means never claimed; a free
-- row means cleanly released and keeps the fencing epoch, which therefore
-- never goes back (P6). A held row always names an existing member.
CREATE TABLE shardkeeper.claims (
    topology          text NOT NULL REFERENCES shardkeeper.topologies ON DELETE CASCADE,
    unit              text NOT NULL CHECK (unit ~ '^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$'),
    owner             text,
    owner_incarnation bigint,
    fencing_epoch     bigint NOT NULL CHECK (fencing_epoch > 0),
    state             text NOT NULL CHECK (state IN ('held', 'handover', 'free')),
    handover_to       text,
    checkpoint_seq    bigint NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL,
    PRIMARY KEY (topology, unit),
    FOREIGN KEY (topology, owner) REFERENCES shardkeeper.members (topology, member),
    CHECK ((state = 'free') = (owner IS NULL)),
    CHECK ((owner IS NULL) = (owner_incarnation IS NULL)),
    CHECK (state = 'handover' OR handover_to IS NULL)
);
CREATE INDEX claims_owner ON shardkeeper.claims (topology, owner) WHERE owner IS NOT NULL;

-- The operator's census verdict on consumer RESET, read by workers (P4).
CREATE TABLE shardkeeper.reset_permissions (
    topology        text PRIMARY KEY REFERENCES shardkeeper.topologies ON DELETE CASCADE,
    allowed         boolean NOT NULL,
    census_taken_at timestamptz NOT NULL,
    reason          text NOT NULL,
    published_at    timestamptz NOT NULL
);

-- The write guard for sinks in this database (see GuardedExec). True when
-- the claim is held at p_epoch by p_member, whose current incarnation owns
-- it and whose lease is live. It locks the claim row FOR SHARE, so an
-- adoption waits until the caller's transaction ends: a guarded write
-- either commits before the owner changes or is refused.
CREATE FUNCTION shardkeeper.claim_valid(p_topology text, p_unit text, p_member text, p_epoch bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM 1
      FROM shardkeeper.claims c
      JOIN shardkeeper.members m ON m.topology = c.topology AND m.member = c.owner
     WHERE c.topology = p_topology AND c.unit = p_unit
       AND c.owner = p_member AND c.fencing_epoch = p_epoch AND c.state <> 'free'
       AND m.incarnation = c.owner_incarnation AND m.left_at IS NULL
       AND m.lease_expires_at > shardkeeper.clock(p_topology)
       FOR SHARE OF c;
    RETURN FOUND;
END
$$;
