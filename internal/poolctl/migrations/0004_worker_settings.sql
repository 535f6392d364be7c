-- What workers read from the registry beside their lease: the naming of
-- streams and consumers and the drain timeout, from the ShardTopology's
-- spec. Empty or zero means "not set": a worker keeps its own default.
ALTER TABLE shardkeeper.topologies
    ADD COLUMN subject_prefix text NOT NULL DEFAULT '',
    ADD COLUMN consumer_name  text NOT NULL DEFAULT '',
    ADD COLUMN drain_timeout  interval NOT NULL DEFAULT '0' CHECK (drain_timeout >= '0');
