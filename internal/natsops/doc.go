// Package natsops is everything the operator does to NATS: it provisions
// the JetStream streams and unit consumers of a topology, takes the
// cluster-wide version census, and guards the UNPIN and RESET operations
// with it.
//
// Provisioning (Provision, RetireConsumers) makes sure, idempotently, that
// the N partition streams <PREFIX>_INGEST_<p> and the N x V unit consumers
// <consumerName>_<p>_<s> of a Layout exist: durable pull consumers, ack
// explicit, deliver all, max_deliver -1, a pinned_client priority group
// (PriorityGroup) whose priority_timeout is the pinned TTL. Drift is
// reported as a Finding; what is safe to change (replicas, ack wait, the
// pinned TTL, the priority settings, a missing subject, the transform this
// package owns) is changed, and what would change which rows an object
// holds is only reported. Nothing is ever deleted by Provision, and
// RetireConsumers deletes a unit consumer only once it holds no rows.
// A Layout's Owner (the topology's namespace/name and UID) is written into
// the metadata of every stream and unit consumer (OwnerKey, OwnerUIDKey);
// Provision refuses a stream another topology's mark names before it writes
// anything, and neither Provision nor RetireConsumers changes or deletes a
// consumer another topology owns (*OwnedElsewhereError). Streams whose
// settings can drop rows before their unit's owner acknowledges them
// (max_age, a limit with discard old, interest retention, TTL or rollup
// headers, sealed) and unit consumers that deliver outside their unit's
// claim (ack policy other than explicit, push, another filter) are refused
// (*UnsafeConfigError), never silently kept. Inventory finds every unit
// consumer of a layout's naming on any of its partition streams, so what a
// topology ever provisioned can be retired without a record of it.
// Where publishers do not pick the shard (AssignByTransform), each stream
// owns a subject transform from <prefix>.rows.<p>.<key> to
// <prefix>.ingest.<p>.{{partition(V,1)}}.<key>, where V is the layout's
// TransformShards when set: a new shape's consumers are provisioned while
// rows are still routed over the active shape's V.
//
// The census (TakeCensus) reads every server's version through the system
// account: STATSZ pinged to all servers until as many answer as they say
// exist (active_servers), the meta leaders' JSZ (no account details) for
// their peers, and every server's LEAFZ for leafnode hubs and spokes. It
// places the unit consumers, with each consumer's pending and
// unacknowledged rows as its leader reports them, by listing their
// streams' consumers ($JS.API.CONSUMER.LIST.<stream>) through a connection
// in their account (CensusOptions.JetStream): it reads its own streams
// only, so a topology's census costs what its consumers cost, however many
// other consumers the NATS cluster holds (Census.Read counts what it
// read). Without that connection it falls back to every server's JSZ,
// which reads every consumer of the account or of every account. It fails
// closed: a server that should answer and does not (a meta or route peer,
// a consumer's leader or replica, a leafnode hub, a server counted by
// active_servers) is listed with version "unknown" and is below the
// floor, and so is a version that does not parse; a consumer whose stream
// could not be listed, or that the listing names missing, is not found.
// The connected server's version alone proves nothing. A leafnode spoke
// that does not bind the system account and hosts no inspected consumer
// is listed but not counted: it cannot take part in a RESET.
//
// The guard (Census.Allow) allows RESET or UNPIN of a consumer only when a
// census younger than a given age shows the consumer's leader, every
// replica and every cluster member known and at or above the version the
// operation needs (RESET: the floor and at least 2.14.0; UNPIN: 2.11.0). A
// refusal is a *RefusedError naming the blocking servers. The census's
// verdict travels to the workers as a ResetVerdict (Census.ResetVerdict:
// allowed or not, the floor, when the census's first reply came, and every
// server's version), and GuardedReset is the one way to issue a RESET: at
// the moment of the RESET it reads the consumer's leader and replicas
// afresh and issues nothing unless the verdict allows, is young enough,
// and lists each of them at the version RESET needs. This is promise P4 of
// design.md: a pre-2.14 replica does not know the raft operation RESET
// replicates, and a 2.12 server panics on it.
//
// natsops does not decide when to provision, retire, reset or unpin (the
// controllers and the worker SDK do), and it knows nothing of the
// ownership registry.
package natsops
