-- shardkeeper registry schema, version 15: a member's activity report is
-- one row (issue 23). A report of a member's 1024 units rewrote 1024 rows
-- of unit_activity, about 20 ms each (BenchmarkReportActivity): with every
-- worker reporting at each renewal that was the registry's heaviest
-- steady load in bench row e (sampled pg_stat_activity), and it slowed the
-- operator's registry reads. Now it rewrites one row whose arrays hold the
-- units, in report order; times are microseconds before reported_at, -1
-- for never.
--
-- unit_activity stays: workers of the previous release keep writing it
-- until they are rolled (README, Upgrade). Readers take each member's
-- newer report of the two tables; a report into member_activity deletes
-- the member's rows in unit_activity.
CREATE TABLE shardkeeper.member_activity (
    topology     text NOT NULL,
    member       text NOT NULL,
    incarnation  bigint NOT NULL,
    reported_at  timestamptz NOT NULL,
    units        text[] NOT NULL,
    epochs       bigint[] NOT NULL,
    since_fetch  bigint[] NOT NULL,
    since_rows   bigint[] NOT NULL,
    since_pull   bigint[] NOT NULL,
    PRIMARY KEY (topology, member),
    FOREIGN KEY (topology, member) REFERENCES shardkeeper.members ON DELETE CASCADE,
    CHECK (cardinality(epochs) = cardinality(units) AND cardinality(since_fetch) = cardinality(units)
       AND cardinality(since_rows) = cardinality(units) AND cardinality(since_pull) = cardinality(units))
);
