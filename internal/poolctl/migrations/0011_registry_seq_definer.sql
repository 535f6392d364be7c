-- shardkeeper registry schema, version 11: workers write
-- shardkeeper.registry_seq only through two functions that run as the
-- schema's owner, so the least-privilege worker role (README) can be
-- refused the table itself. With UPDATE on it a worker's DSN could clear
-- behind_reason, the gate that holds every write after a lossy failover
-- until the operator's Recover, or lower seq below what clients have
-- seen. The functions write only what the protocol lets any client
-- write: one raise of seq per committed transaction (bump_seq), and the
-- report that a client saw a later sequence than the registry has
-- (report_seen), which can only set the gate, never clear it.
ALTER FUNCTION shardkeeper.bump_seq() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- report_seen records that a client has seen sequence p_seen of
-- p_topology while the registry's is lower: every write is refused from
-- then on, until Recover. It returns the behind reason it left set (NULL
-- when the registry is not behind p_seen).
CREATE FUNCTION shardkeeper.report_seen(p_topology text, p_seen bigint) RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE shardkeeper.registry_seq r
       SET behind_reason = coalesce(r.behind_reason, 'a client has seen a later sequence'),
           behind_seen = greatest(r.behind_seen, p_seen)
     WHERE r.topology = p_topology AND r.seq < p_seen
    RETURNING r.behind_reason
$$;
