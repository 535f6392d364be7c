package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types a ShardTopology reports. Ready, Reconciling and Stalled
// follow the kstatus convention so GitOps tools (Argo CD, Flux) can tell a
// finished rollout from one in progress or one that cannot proceed.
const (
	// ConditionReady is True when the active epoch equals the spec, every
	// unit is owned by exactly one member and nothing is in progress.
	ConditionReady = "Ready"
	// ConditionReconciling is True while the operator still has work to do
	// to make the world match the spec.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when the operator cannot make progress
	// without a change from a person: a bad spec, a missing secret, a
	// version floor that is not met.
	ConditionStalled = "Stalled"
	// ConditionVersionFloorMet is True when the latest census saw every NATS
	// server that matters at or above spec.nats.versionFloor.
	ConditionVersionFloorMet = "VersionFloorMet"
	// ConditionRolloutPaused is True while spec.rollout.paused or the
	// paused annotation holds the rollout between steps.
	ConditionRolloutPaused = "RolloutPaused"
	// ConditionRegistryDurable is True when the registry's PostgreSQL
	// waits for a synchronous standby before it acknowledges a commit, so
	// a failover loses nothing acknowledged. Its reasons are
	// SynchronousReplication, AsynchronousReplication, NoStandby and
	// SynchronousCommitLocal. False is not unsafe for ownership (a
	// registry that lost commits is detected and recovered, issue 22) but
	// costs a fleet-wide fence at a failover and the rows a sink in the
	// same database acknowledged during the lag.
	ConditionRegistryDurable = "RegistryDurable"
)

// Condition reasons. Each is CamelCase and says why a condition has its
// status; a dashboard can group on them.
const (
	// ReasonFirstSeen marks conditions set before the first reconcile did
	// any work, so a new object never reads as healthy.
	ReasonFirstSeen = "FirstSeen"
	// ReasonSpecValid means every check of the spec against the world passed.
	ReasonSpecValid = "SpecValid"
	// ReasonInvalidSpec means the spec breaks a rule the API server could not
	// check (the message names the field).
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonSecretNotFound means a referenced Secret does not exist.
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonSecretKeyMissing means a referenced Secret lacks the named key.
	ReasonSecretKeyMissing = "SecretKeyMissing"
	// ReasonWorkloadNotFound means spec.workload names no StatefulSet.
	ReasonWorkloadNotFound = "WorkloadNotFound"
	// ReasonWorkloadUpdateStrategy means the workload StatefulSet does not
	// use the OnDelete update strategy, so the operator cannot roll its pods
	// one at a time.
	ReasonWorkloadUpdateStrategy = "WorkloadUpdateStrategy"
	// ReasonReady means the active epoch equals the spec, nothing is
	// pending or rolling, and every unit is owned.
	ReasonReady = "Ready"
	// ReasonProvisioning means the first topology epoch is being
	// provisioned and activated.
	ReasonProvisioning = "Provisioning"
	// ReasonRollingOut means a topology change or a pod-by-pod roll is in
	// progress; the message says which step.
	ReasonRollingOut = "RollingOut"
	// ReasonWaitingForWorkers means the topology is in place but some units
	// of the active epoch have no owner.
	ReasonWaitingForWorkers = "WaitingForWorkers"
	// ReasonRolloutAborted means the abort annotation holds the spec's
	// topology change back; the active epoch stays.
	ReasonRolloutAborted = "RolloutAborted"
	// ReasonHandoverTimeout means a pod did not hand its units over within
	// spec.rollout.drainTimeout plus the lease; the roll waits for it.
	ReasonHandoverTimeout = "HandoverTimeout"
	// ReasonDeleting means the finalizer is cleaning up.
	ReasonDeleting = "Deleting"
	// ReasonPaused means the rollout is held by spec or annotation.
	ReasonPaused = "Paused"
	// ReasonNotPaused means nothing holds the rollout.
	ReasonNotPaused = "NotPaused"
	// ReasonCensusPending means no census has been taken yet.
	ReasonCensusPending = "CensusPending"
	// ReasonFloorMet means the latest census saw every server that matters
	// at or above the version floor.
	ReasonFloorMet = "FloorMet"
	// ReasonBelowFloor means the latest census saw a server that matters
	// below the floor, or could not see it (fail closed).
	ReasonBelowFloor = "BelowFloor"
	// ReasonNoSystemCredentials means spec.nats.systemCredentialsSecretRef
	// is not set, so no census can be taken and RESET is never allowed.
	ReasonNoSystemCredentials = "NoSystemCredentials"
	// ReasonCensusFailed means the census could not be taken; RESET is not
	// allowed until one succeeds.
	ReasonCensusFailed = "CensusFailed"
	// ReasonReconcileError means a step failed with an error that a retry
	// may fix; the message carries the error.
	ReasonReconcileError = "ReconcileError"
	// ReasonRegistryUnavailable means a registry operation got no answer
	// within the operator's bound (a partition, or a statement waiting on
	// locks); the message names the operation. Retried with backoff.
	ReasonRegistryUnavailable = "RegistryUnavailable"
	// ReasonAwaitingApproval means spec.rollout.approval is Manual and the
	// plan in status.plan waits for the approve annotation carrying its
	// hash; nothing has been frozen.
	ReasonAwaitingApproval = "AwaitingApproval"
	// ReasonOrderBarrier means every unit is owned, but a change of V
	// under spec.rollout.ordering PerKey still holds moved keys' rows in
	// their new units until their old units drain (status.orderBarrier).
	ReasonOrderBarrier = "OrderBarrier"
	// ReasonApprovalRefused means the approve annotation names a plan
	// hash other than the one in status.plan (the plan changed since it
	// was read, or the hash was mistyped); the change keeps waiting.
	ReasonApprovalRefused = "ApprovalRefused"
	// ReasonUnitsStalled means every unit is owned but some owned units do
	// not flow: the owner's activity report is stale or missing, or rows
	// wait in the unit's consumer and the owner received none within the
	// bound. The message names a few.
	ReasonUnitsStalled = "UnitsStalled"
	// ReasonInvalidRegistryDSN means the DSN in spec.registry.dsnSecretRef
	// does not parse as a PostgreSQL connection string.
	ReasonInvalidRegistryDSN = "InvalidRegistryDSN"
	// ReasonRegistryRefused means PostgreSQL refused the DSN's
	// credentials or database: a role that does not exist, a wrong
	// password, a database that does not exist, or a role without the
	// privileges the operator needs.
	ReasonRegistryRefused = "RegistryRefused"
	// ReasonForeignMember is the Event reason for a live member of the
	// registry that is not a pod of the workload StatefulSet.
	ReasonForeignMember = "ForeignMember"
	// ReasonNATSAuthorizationFailed means NATS refused the credentials in
	// spec.nats.credentialsSecretRef.
	ReasonNATSAuthorizationFailed = "NATSAuthorizationFailed"
	// ReasonNATSObjectsOwnedElsewhere (Stalled, Ready): streams or unit
	// consumers the topology would use carry another topology's owner
	// mark (NATS metadata); the operator neither adopts, changes nor
	// deletes them. The message names each object and its owner.
	ReasonNATSObjectsOwnedElsewhere = "NATSObjectsOwnedElsewhere"
	// ReasonUnsafeNATSConfig (Stalled, Ready): a stream can drop rows
	// nobody consumed (max_age, a limit with discard old, interest
	// retention, TTL or rollup headers, sealed) or a unit consumer
	// delivers outside its unit's claim (ack policy not explicit, push,
	// another filter). The message names the object, the field and what
	// is allowed.
	ReasonUnsafeNATSConfig = "UnsafeNATSConfig"
	// ReasonUnitsMultiplyOwned means two or more members report pulling
	// one unit within the flow window (a P1 signal); the message names a
	// few. Ready stays False until only one member pulls each unit.
	ReasonUnitsMultiplyOwned = "UnitsMultiplyOwned"
	// ReasonNATSUnavailable means the operator cannot reach any NATS
	// server: its connection is down and the census got no reply. Whether
	// units flow cannot be judged, so Ready is False.
	ReasonNATSUnavailable = "NATSUnavailable"
)

// Rollout kinds reported in status.rollout.kind.
const (
	// RolloutKindTopology is a change of N or V: a new topology epoch.
	RolloutKindTopology = "Topology"
	// RolloutKindPods is a pod-by-pod roll of the workload StatefulSet.
	RolloutKindPods = "Pods"
)

// Steps of a topology change, in order. They are the one vocabulary of
// the plan (status.plan, kubectl shardkeeper plan), of status.rollout.step
// and of the Events: internal/ownership names its plan steps with these
// constants.
const (
	// StepApprove waits for the approve annotation carrying the hash of
	// the plan in status.plan (spec.rollout.approval: Manual only).
	StepApprove = "Approve"
	// StepProvision creates the target's streams and unit consumers.
	StepProvision = "Provision"
	// StepFreeze writes the target epoch as pending and waits until every
	// live member acknowledged it (stopped taking claims).
	StepFreeze = "Freeze"
	// StepActivate makes the pending epoch the active one.
	StepActivate = "Activate"
	// StepHandOver: owners of units that move stop fetching, let
	// delivered rows settle, unpin and release them.
	StepHandOver = "HandOver"
	// StepClaim waits until every unit of the new epoch is owned: the new
	// owners claim the released and the added units.
	StepClaim = "Claim"
	// StepRetire deletes the consumers of units that left, once drained.
	StepRetire = "Retire"
	// StepAbort retires a pending epoch and keeps the active one.
	StepAbort = "Abort"
)

// TopologySteps lists the steps of a topology change in order (Approve
// only under spec.rollout.approval: Manual).
var TopologySteps = []string{StepApprove, StepProvision, StepFreeze, StepActivate, StepHandOver, StepClaim, StepRetire}

// Steps of one pod in a pod-by-pod roll, as reported in
// status.rollout.pods[].step.
const (
	// PodStepWaiting: the pod runs the old revision and waits its turn.
	PodStepWaiting = "Waiting"
	// PodStepHandingOver: the pod was asked to hand its units over; the
	// operator waits until the registry shows it holds nothing.
	PodStepHandingOver = "HandingOver"
	// PodStepDeleting: the pod holds nothing and is being deleted.
	PodStepDeleting = "Deleting"
	// PodStepRejoining: the replacement must be Ready, join the registry
	// and claim its placement.
	PodStepRejoining = "Rejoining"
	// PodStepDone: the pod runs the update revision and took its place.
	PodStepDone = "Done"
)

// Finalizer is set on every ShardTopology so the operator can retire what
// it provisioned, when that is safe, before the object goes away.
const Finalizer = "topology.shardkeeper.dev/finalizer"

// AbortAnnotation, set to "true", retires a pending topology epoch and keeps
// the active one; while it is set no new epoch is started. Remove it (or set
// the spec back to the active N and V) to go on.
const AbortAnnotation = "topology.shardkeeper.dev/abort"

// DeletionPolicyAnnotation set to DeletionPolicyOrphan makes the finalizer
// keep everything (streams, consumers, registry rows) and let the object go
// at once: the way out when the registry or NATS is gone for good.
const DeletionPolicyAnnotation = "topology.shardkeeper.dev/deletion-policy"

// DeletionPolicyOrphan is the value of DeletionPolicyAnnotation that keeps
// everything on deletion.
const DeletionPolicyOrphan = "Orphan"

// ApproveAnnotation approves the plan in status.plan under
// spec.rollout.approval: Manual. Its value must be the plan's hash
// (status.plan.hash), so a plan that changed since a person read it is
// not approved by mistake: an approval naming another hash is refused
// (Ready reason ApprovalRefused, Event ApprovalRefused).
const ApproveAnnotation = "topology.shardkeeper.dev/approve"

// PausedAnnotation pauses a rollout between steps when set to "true", like
// spec.rollout.paused but without a spec change (useful under GitOps).
const PausedAnnotation = "topology.shardkeeper.dev/paused"

// Phase is a one-word summary of where a ShardTopology stands.
// +kubebuilder:validation:Enum=Pending;Provisioning;AwaitingApproval;RollingOut;Ready;Paused;Stalled;Deleting
type Phase string

// Phases of a ShardTopology.
const (
	PhasePending      Phase = "Pending"
	PhaseProvisioning Phase = "Provisioning"
	// PhaseAwaitingApproval: a change's plan waits for a person's approval.
	PhaseAwaitingApproval Phase = "AwaitingApproval"
	PhaseRollingOut       Phase = "RollingOut"
	PhaseReady            Phase = "Ready"
	PhasePaused           Phase = "Paused"
	PhaseStalled          Phase = "Stalled"
	PhaseDeleting         Phase = "Deleting"
)

// ApprovalPolicy says whether a change of N or V waits for a person.
// +kubebuilder:validation:Enum=Automatic;Manual
type ApprovalPolicy string

const (
	// ApprovalAutomatic rolls a change out as soon as the plan is made.
	ApprovalAutomatic ApprovalPolicy = "Automatic"
	// ApprovalManual publishes the plan in status.plan and waits for the
	// approve annotation carrying its hash before freezing anything.
	ApprovalManual ApprovalPolicy = "Manual"
)

// Results of a finished rollout, in status.lastRollout.result.
const (
	// RolloutSucceeded: the rollout reached its target.
	RolloutSucceeded = "Succeeded"
	// RolloutAborted: a pending epoch was retired (abort annotation, or
	// the spec went back) and the active one kept.
	RolloutAborted = "Aborted"
)

// Plan states, in status.plan.state, after Strimzi's rebalance proposal:
// each state says which annotation it accepts.
const (
	// PlanProposalReady: the plan waits for approval; it accepts the
	// approve annotation with its hash (and abort).
	PlanProposalReady = "ProposalReady"
	// PlanApproved: the plan was approved (or approval is Automatic) and
	// is rolling out; it accepts pause and abort.
	PlanApproved = "Approved"
)

// ShardAssignment says who decides which shard a row belongs to.
// +kubebuilder:validation:Enum=Publisher;SubjectTransform
type ShardAssignment string

const (
	// ShardAssignmentPublisher means publishers put the shard in the subject
	// (<prefix>.ingest.<p>.<s>.>).
	ShardAssignmentPublisher ShardAssignment = "Publisher"
	// ShardAssignmentSubjectTransform means the operator owns a stream
	// subject transform that maps rows to shards with NATS's partition()
	// function.
	ShardAssignmentSubjectTransform ShardAssignment = "SubjectTransform"
)

// Ordering says whether a change of V or of N keeps each key's rows in
// order across the units the change moves the key between.
// +kubebuilder:validation:Enum=None;PerKey
type Ordering string

const (
	// OrderingNone moves keys at activation without waiting: a moved key's
	// new unit may deliver its new rows before its old unit delivered the
	// older ones.
	OrderingNone Ordering = "None"
	// OrderingPerKey holds a moved key's rows in its new unit until every
	// old unit that fed the key acknowledged all rows stored before the
	// switch to the new shape (the order barrier): for a change of V the
	// transform's switch, for a change of N the stream's last row once
	// every publisher acknowledged the new epoch (pkg/publish.Acknowledge;
	// rows of publishers that never acknowledge are not ordered). Needs
	// SubjectTransform assignment, and N and V changed one at a time.
	OrderingPerKey Ordering = "PerKey"
)

// ShardTopologySpec declares the shard topology of one ingest fleet: N
// partitions times V shards per partition, the NATS servers and registry that
// carry it, the worker pods that consume it, and how changes roll out.
//
// +kubebuilder:validation:XValidation:rule="self.partitions * self.shardsPerPartition <= 65536",message="partitions x shardsPerPartition must be at most 65536 units",fieldPath=".shardsPerPartition"
// +kubebuilder:validation:XValidation:rule="!has(self.rollout) || !has(self.rollout.ordering) || self.rollout.ordering != 'PerKey' || (has(self.nats.shardAssignment) && self.nats.shardAssignment == 'SubjectTransform')",message="spec.rollout.ordering PerKey needs spec.nats.shardAssignment SubjectTransform: under Publisher assignment publishers switch epochs one by one, so no stream sequence separates a key's old rows from its new ones; set spec.rollout.ordering None or use SubjectTransform",fieldPath=".rollout.ordering"
// +kubebuilder:validation:XValidation:rule="!has(self.rollout) || !has(self.rollout.ordering) || self.rollout.ordering != 'PerKey' || self.partitions == oldSelf.partitions || self.shardsPerPartition == oldSelf.shardsPerPartition",message="with spec.rollout.ordering PerKey, spec.partitions and spec.shardsPerPartition cannot change in one update: each keeps per-key order on its own; change one, let its rollout finish, then the other (or set spec.rollout.ordering None)",fieldPath=".partitions"
type ShardTopologySpec struct {
	// Partitions is N, the number of partition streams. Each partition is
	// one JetStream stream. Changing it rolls out a new topology epoch.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +required
	Partitions int32 `json:"partitions"`

	// ShardsPerPartition is V, the number of shards in every partition. Each
	// (partition, shard) pair is a unit with its own durable consumer and
	// exactly one owning worker. Changing it rolls out a new topology epoch.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +required
	ShardsPerPartition int32 `json:"shardsPerPartition"`

	// NATS says where the streams live and how to reach them.
	// +required
	NATS NATSSpec `json:"nats"`

	// Registry says where the PostgreSQL ownership registry lives.
	// +required
	Registry RegistrySpec `json:"registry"`

	// Workload names the worker pods that consume the units.
	// +required
	Workload WorkloadSpec `json:"workload"`

	// Rollout tunes how changes of the topology and of the worker pods are
	// rolled out.
	// +kubebuilder:default={}
	// +optional
	Rollout RolloutSpec `json:"rollout,omitempty"`
}

// NATSSpec says where the JetStream streams live, how to reach them, and the
// lowest server version that may take part in RESET-based takeover.
//
// +kubebuilder:validation:XValidation:rule="has(self.subjectPrefix) == has(oldSelf.subjectPrefix) && (!has(self.subjectPrefix) || self.subjectPrefix == oldSelf.subjectPrefix)",message="subjectPrefix is immutable, and may not be set or removed after creation: changing it would orphan every stream and consumer (an object created before the per-topology default keeps its stored value; write it into your manifest)",fieldPath=".subjectPrefix"
// +kubebuilder:validation:XValidation:rule="self.consumerName == oldSelf.consumerName",message="consumerName is immutable: changing it would orphan every unit consumer and its ack floor",fieldPath=".consumerName"
// +kubebuilder:validation:XValidation:rule="self.shardAssignment == oldSelf.shardAssignment",message="shardAssignment is immutable: rows already stored were routed under the old rule",fieldPath=".shardAssignment"
type NATSSpec struct {
	// URLs of NATS servers to connect to, as nats://, tls://, ws:// or
	// wss:// URLs. One is enough; the client learns the rest of the cluster.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.all(u, isURL(u) && url(u).getScheme() in ['nats', 'tls', 'ws', 'wss'] && url(u).getHostname() != '')",message="every URL must be nats://, tls://, ws:// or wss:// with a host, e.g. nats://nats.ingest.svc:4222"
	// +listType=atomic
	// +required
	URLs []string `json:"urls"`

	// CredentialsSecretRef names the Secret key holding the NATS credentials
	// of the account that owns the streams. The value is one of: the
	// contents of a NATS .creds file (a user JWT and nkey seed, recognised
	// by "-----BEGIN NATS USER JWT-----"); "user:password" (split at the
	// first colon); or a bare token. Omit it for a server without
	// authentication.
	// +optional
	CredentialsSecretRef *SecretKeyRef `json:"credentialsSecretRef,omitempty"`

	// SystemCredentialsSecretRef names the Secret key holding credentials of
	// a system-account user, in the same forms as credentialsSecretRef (a
	// .creds file, "user:password" or a token). The census needs them to ask
	// every server for its version; without them no server can be seen, the
	// census fails closed, and RESET-based takeover is never allowed.
	// +optional
	SystemCredentialsSecretRef *SecretKeyRef `json:"systemCredentialsSecretRef,omitempty"`

	// TLSSecretRef names a Secret with ca.crt and, for mutual TLS, tls.crt
	// and tls.key.
	// +optional
	TLSSecretRef *SecretRef `json:"tlsSecretRef,omitempty"`

	// SubjectPrefix starts every subject and, upper-cased, every stream name:
	// stream <PREFIX>_INGEST_<p> holds subjects <prefix>.ingest.<p>.>.
	// Unset, the operator uses a prefix of this topology's own derived
	// from its namespace and name ("<namespace>_<name>", or a shortened
	// form with a hash when that is longer than 32 characters or the name
	// has dots; status.subjectPrefix shows it), so two topologies on one
	// NATS account never share a stream. Immutable: it cannot be set,
	// changed or removed after creation.
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9_-]{0,31}$`
	// +optional
	SubjectPrefix string `json:"subjectPrefix,omitempty"`

	// ConsumerName starts the durable name of every unit consumer:
	// <consumerName>_<p>_<s>. Immutable.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$`
	// +kubebuilder:default=ingest
	// +optional
	ConsumerName string `json:"consumerName,omitempty"`

	// Replicas is the number of JetStream replicas of every stream and unit
	// consumer. It cannot exceed the number of servers in the cluster.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5
	// +kubebuilder:default=3
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// PinnedTTL is how long a unit consumer keeps its pinned client without
	// hearing from it (the priority group's priority_timeout).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a duration such as 30s, 1m30s or 500ms"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || (duration(self) > duration('0s') && duration(self) <= duration('24h'))",message="must be a duration above 0s and at most 24h, e.g. 30s"
	// +kubebuilder:default="2m"
	// +optional
	PinnedTTL *metav1.Duration `json:"pinnedTTL,omitempty"`

	// AckWait is how long a delivered row may stay unacknowledged before
	// NATS redelivers it. Takeover without RESET waits this long.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a duration such as 30s, 1m30s or 500ms"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || (duration(self) > duration('0s') && duration(self) <= duration('24h'))",message="must be a duration above 0s and at most 24h, e.g. 30s"
	// +kubebuilder:default="30s"
	// +optional
	AckWait *metav1.Duration `json:"ackWait,omitempty"`

	// MaxAckPending is how many rows a unit consumer may have delivered and
	// not yet acknowledged (each unit consumer's max_ack_pending). A worker
	// fetches a batch at a time, so it bounds only rows that wait: under
	// rollout.ordering PerKey a new unit holds the rows of keys whose old
	// unit has not drained, and once it holds this many it receives
	// nothing more, unmoved keys included, until the barrier lifts. Each
	// held row stays in its worker's memory. NATS's own default is 1000;
	// a server or account limit on max_ack_pending below this value makes
	// provisioning fail with NATS's error in status.
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=1000000
	// +kubebuilder:default=10000
	// +optional
	MaxAckPending int32 `json:"maxAckPending,omitempty"`

	// VersionFloor is the lowest NATS server version allowed to host a unit
	// consumer or belong to the cluster when RESET-based takeover is used.
	// RESET additionally needs 2.14.0 on every server, whatever the floor.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="isSemver(self.startsWith('v') ? self.substring(1) : self)",message="must be a semantic version such as 2.14.0 (a leading v is allowed)"
	// +kubebuilder:validation:XValidation:rule="!isSemver(self.startsWith('v') ? self.substring(1) : self) || semver(self.startsWith('v') ? self.substring(1) : self).compareTo(semver('2.11.0')) >= 0",message="must be at least 2.11.0: pinned priority groups and UNPIN need it"
	// +kubebuilder:default="2.14.0"
	// +optional
	VersionFloor string `json:"versionFloor,omitempty"`

	// ShardAssignment says who picks a row's shard: the Publisher puts it in
	// the subject, or the operator owns a SubjectTransform using NATS's
	// partition() function. Immutable.
	// +kubebuilder:default=Publisher
	// +optional
	ShardAssignment ShardAssignment `json:"shardAssignment,omitempty"`
}

// RegistrySpec says where the PostgreSQL ownership registry lives.
type RegistrySpec struct {
	// DSNSecretRef names the Secret key holding the PostgreSQL connection
	// string (postgres://user:password@host:5432/db?sslmode=require). The
	// operator migrates the schema at start.
	// +required
	DSNSecretRef SecretKeyRef `json:"dsnSecretRef"`
}

// WorkloadSpec names the worker pods.
type WorkloadSpec struct {
	// StatefulSetName is the StatefulSet, in the ShardTopology's namespace,
	// whose pods are the workers. The operator rolls its pods one at a time,
	// so its update strategy should be OnDelete.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +required
	StatefulSetName string `json:"statefulSetName"`
}

// RolloutSpec tunes rollouts.
//
// The rule spells out the field defaults because the API server checks the
// schema's own default ({}) before nested defaults are filled in.
//
// +kubebuilder:validation:XValidation:rule="![has(self.renewInterval) ? self.renewInterval : '5s', has(self.leaseTTL) ? self.leaseTTL : '15s'].all(d, d.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')) || duration(has(self.renewInterval) ? self.renewInterval : '5s') + duration(has(self.renewInterval) ? self.renewInterval : '5s') <= duration(has(self.leaseTTL) ? self.leaseTTL : '15s')",message="renewInterval must be at most half of leaseTTL, so one late renewal does not lose the lease",fieldPath=".renewInterval"
type RolloutSpec struct {
	// Paused holds the rollout before its next step. Units keep flowing;
	// nothing new is started. The annotation topology.shardkeeper.dev/paused
	// set to "true" does the same.
	// +kubebuilder:default=false
	// +optional
	Paused bool `json:"paused,omitempty"`

	// DrainTimeout is how long a worker's handover waits for delivered
	// rows to settle before it nak's the rest and releases the unit (they
	// are then redelivered to the next owner at once). The operator writes
	// it into the registry, where every worker reads it with its lease, so
	// a change reaches running workers without a restart. The operator also
	// uses it to judge a pod roll: a pod that still holds units
	// drainTimeout + leaseTTL + grace after it was asked to hand over makes
	// the rollout Stalled (HandoverTimeout).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a duration such as 30s, 1m30s or 500ms"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || (duration(self) > duration('0s') && duration(self) <= duration('1h'))",message="must be a duration above 0s and at most 1h, e.g. 30s"
	// +kubebuilder:default="30s"
	// +optional
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`

	// LeaseTTL is how long a worker's lease lasts without renewal. After it
	// lapses (plus a grace) another worker may adopt the units.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a duration such as 30s, 1m30s or 500ms"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || (duration(self) >= duration('1s') && duration(self) <= duration('10m'))",message="must be a duration from 1s to 10m, e.g. 15s"
	// +kubebuilder:default="15s"
	// +optional
	LeaseTTL *metav1.Duration `json:"leaseTTL,omitempty"`

	// RenewInterval is how often a worker renews its lease. It must be at
	// most half of leaseTTL.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$')",message="must be a duration such as 30s, 1m30s or 500ms"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^-?([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || (duration(self) >= duration('100ms') && duration(self) <= duration('5m'))",message="must be a duration from 100ms to 5m, e.g. 5s"
	// +kubebuilder:default="5s"
	// +optional
	RenewInterval *metav1.Duration `json:"renewInterval,omitempty"`

	// MaxPodsAtOnce is how many worker pods a pod-by-pod roll restarts at
	// once.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +kubebuilder:default=1
	// +optional
	MaxPodsAtOnce int32 `json:"maxPodsAtOnce,omitempty"`

	// Approval says whether a change of N or V waits for a person.
	// Automatic rolls it out at once. Manual publishes the plan in
	// status.plan (units added, removed and moved, pods affected, an
	// estimated duration and a hash) and freezes nothing until the
	// annotation topology.shardkeeper.dev/approve carries that hash
	// (kubectl shardkeeper approve NAME). The first epoch and pod rolls
	// need no approval.
	// +kubebuilder:default=Automatic
	// +optional
	Approval ApprovalPolicy `json:"approval,omitempty"`

	// Ordering says whether a change of shardsPerPartition or of
	// partitions keeps per-key order. None (the default) moves keys at
	// activation. PerKey records each partition stream's switch (a
	// change of V: the sequence where the transform moved; a change of
	// N: the stream's last row once every publisher acknowledged the new
	// epoch), and a moved key's new unit holds the key's rows until every
	// old unit that fed it settled its rows up to that sequence; keys
	// that did not move never wait. PerKey needs
	// spec.nats.shardAssignment SubjectTransform, and refuses an update
	// that changes both partitions and shardsPerPartition.
	// +kubebuilder:default=None
	// +optional
	Ordering Ordering `json:"ordering,omitempty"`
}

// SecretKeyRef names one key of a Secret in the ShardTopology's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +required
	Name string `json:"name"`

	// Key within the Secret's data.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +required
	Key string `json:"key"`
}

// SecretRef names a Secret in the ShardTopology's namespace.
type SecretRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +required
	Name string `json:"name"`
}

// TopologyEpoch is one numbered version of (N, V).
type TopologyEpoch struct {
	// Number grows by one with every topology change.
	Number int64 `json:"number"`
	// Partitions is N under this epoch.
	Partitions int32 `json:"partitions"`
	// ShardsPerPartition is V under this epoch.
	ShardsPerPartition int32 `json:"shardsPerPartition"`
}

// UnitCounts counts the units of the active epoch by ownership.
type UnitCounts struct {
	// Total is N x V of the active epoch.
	Total int32 `json:"total"`
	// Owned units have exactly one valid claim.
	Owned int32 `json:"owned"`
	// Unowned units have no valid claim.
	Unowned int32 `json:"unowned"`
	// MultiplyOwned units were pulled under two or more claim tokens at
	// once, as the workers' activity reports show: two fresh reports (made
	// within two renew intervals) whose pull windows under different
	// tokens overlap by more than the query bound plus one second. A
	// handover's windows are sequential and never count. The registry
	// cannot record two valid claims on one unit, so this is measured from
	// what workers did. Anything but 0 is a broken promise (P1) and a bug.
	MultiplyOwned int32 `json:"multiplyOwned"`
	// Stalled counts owned units that do not flow: the owner's activity
	// report is stale or missing, or the unit's consumer had rows pending
	// at the last census and the owner received none within the stall
	// bound after it. Owned counts them too; Ready is False while any is
	// stalled.
	// +optional
	Stalled int32 `json:"stalled,omitempty"`
	// Retiring counts units that left the topology whose consumers still
	// exist: they are deleted once drained, never before.
	// +optional
	Retiring int32 `json:"retiring,omitempty"`
}

// MemberStatus counts the registry's live members of the topology.
type MemberStatus struct {
	// Live counts members holding a live lease.
	Live int32 `json:"live"`
	// Foreign counts live members whose name is not one of the workload
	// StatefulSet's pods (<statefulSetName>-<ordinal> within its
	// replicas): a worker started by hand, on a laptop, or by another
	// workload with the same DSN. Placement gives them units like any
	// member; the pod roll never restarts them.
	// +optional
	Foreign int32 `json:"foreign,omitempty"`
	// ForeignNames names up to 16 of them, sorted.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	ForeignNames []string `json:"foreignNames,omitempty"`
	// ForeignUnits counts the active epoch's units they hold.
	// +optional
	ForeignUnits int32 `json:"foreignUnits,omitempty"`
}

// TopologyShape is an N x V without an epoch number.
type TopologyShape struct {
	// Partitions is N.
	Partitions int32 `json:"partitions"`
	// ShardsPerPartition is V.
	ShardsPerPartition int32 `json:"shardsPerPartition"`
}

// PodRollStatus is one pod of a pod-by-pod roll.
type PodRollStatus struct {
	// Name of the pod (and of its registry member).
	Name string `json:"name"`
	// Step is Waiting, HandingOver, Deleting, Rejoining or Done.
	Step string `json:"step"`
	// UID of the pod being replaced, while it is in flight. A pod of
	// that name with another UID is its replacement.
	// +optional
	UID string `json:"uid,omitempty"`
	// Incarnation is the member's registry incarnation when it was asked
	// to hand over; its replacement must join with a later one.
	// +optional
	Incarnation int64 `json:"incarnation,omitempty"`
	// Holds is how many units the member held at the last look.
	// +optional
	Holds int32 `json:"holds,omitempty"`
	// Since is when the pod entered its step.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// CensusStatus is the operator's latest reading of NATS server versions.
type CensusStatus struct {
	// ObservedAt is when the census was taken (its first reply, so its
	// age is never understated).
	// +optional
	ObservedAt *metav1.Time `json:"observedAt,omitempty"`
	// ServerCount is how many servers the census counted: those that
	// must be at the floor for RESET (cluster members and the consumers'
	// hosts).
	ServerCount int32 `json:"serverCount"`
	// Servers lists every server the census saw or expected, with its
	// version, so a person can read the versions without NATS
	// credentials (kubectl shardkeeper census NAME).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	Servers []CensusServer `json:"servers,omitempty"`
	// MinVersion is the lowest version seen ("unknown" when a server that
	// should have answered did not).
	// +optional
	MinVersion string `json:"minVersion,omitempty"`
	// BelowFloor names the servers below spec.nats.versionFloor, unknown
	// ones included.
	// +optional
	// +listType=atomic
	BelowFloor []string `json:"belowFloor,omitempty"`
}

// CensusServer is one NATS server as the last census saw it.
type CensusServer struct {
	// Name is the server's name.
	Name string `json:"name"`
	// Version is the version it reported; "unknown" when it should have
	// answered and did not.
	Version string `json:"version"`
	// Cluster is the cluster it belongs to, when it has one.
	// +optional
	Cluster string `json:"cluster,omitempty"`
	// Role says why the census looked at it, e.g. member, meta-leader,
	// leafnode or consumer replica.
	// +optional
	Role string `json:"role,omitempty"`
	// BelowFloor is true when it is below spec.nats.versionFloor or
	// unknown (fail closed).
	// +optional
	BelowFloor bool `json:"belowFloor,omitempty"`
}

// PlanStatus is the change of N or V the operator proposes (under
// spec.rollout.approval: Manual) or is rolling out, computed from the
// live members and their claims before anything is frozen.
type PlanStatus struct {
	// Hash identifies the plan: the active epoch, the target shape and
	// every unit's move. The approve annotation must carry it.
	Hash string `json:"hash"`
	// State is ProposalReady (waiting for approval) or Approved.
	State string `json:"state"`
	// From is the active epoch the plan starts from.
	// +optional
	From *TopologyEpoch `json:"from,omitempty"`
	// To is the shape the plan rolls out.
	To TopologyShape `json:"to"`
	// UnitsAdded are units of To that do not exist yet.
	UnitsAdded int32 `json:"unitsAdded"`
	// UnitsRemoved are units that leave; retired once drained.
	UnitsRemoved int32 `json:"unitsRemoved"`
	// UnitsMoved are kept units whose owner changes (handed over, then
	// claimed by the new owner).
	UnitsMoved int32 `json:"unitsMoved"`
	// UnitsKept are kept units whose owner stays: they never stop.
	UnitsKept int32 `json:"unitsKept"`
	// Pods lists, per live member, what the plan does to it.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1024
	Pods []PodPlan `json:"pods,omitempty"`
	// EstimatedDuration is how long the change should take up to its
	// Retire step: a renew interval for the freeze acknowledgements,
	// spec.rollout.drainTimeout when units move, and a renew interval
	// for the claims. Retire waits for rows to drain and is not counted.
	// +optional
	EstimatedDuration *metav1.Duration `json:"estimatedDuration,omitempty"`
	// ProposedAt is when this plan (this hash) was first published.
	// +optional
	ProposedAt *metav1.Time `json:"proposedAt,omitempty"`
	// Message says what the plan waits for, in words.
	// +optional
	Message string `json:"message,omitempty"`
}

// PodPlan is what a plan does to one worker pod.
type PodPlan struct {
	// Name of the pod (its registry member).
	Name string `json:"name"`
	// Before is how many units it holds now.
	Before int32 `json:"before"`
	// After is how many units it will hold.
	After int32 `json:"after"`
	// MovedIn are kept units it takes over from another pod.
	MovedIn int32 `json:"movedIn"`
	// MovedOut are kept units it hands over to another pod.
	MovedOut int32 `json:"movedOut"`
	// Added are new units it claims.
	Added int32 `json:"added"`
	// Removed are units it holds that leave the topology.
	Removed int32 `json:"removed"`
}

// LastRolloutStatus records the rollout that finished last, so a finished
// rollout leaves a trace instead of status.rollout just going away.
type LastRolloutStatus struct {
	// Kind is Topology or Pods.
	Kind string `json:"kind"`
	// From is where it started: "epoch 1 (4x8)" for a topology change,
	// empty for the first epoch and for pod rolls.
	// +optional
	From string `json:"from,omitempty"`
	// To is where it ended: "epoch 2 (4x16)", or for a pod roll the
	// StatefulSet's update revision.
	// +optional
	To string `json:"to,omitempty"`
	// StartedAt is when it began.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// FinishedAt is when the operator saw it end.
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
	// Result is Succeeded or Aborted.
	Result string `json:"result"`
	// Duration is FinishedAt - StartedAt.
	// +optional
	Duration *metav1.Duration `json:"duration,omitempty"`
	// PlanHash is the hash of the plan it rolled out, when it had one;
	// an approve annotation still carrying it is not a stale approval.
	// +optional
	PlanHash string `json:"planHash,omitempty"`
}

// RolloutStatus says how far the current rollout has come.
type RolloutStatus struct {
	// Kind is what is rolling: a Topology change or a Pods roll.
	// +optional
	Kind string `json:"kind,omitempty"`
	// FromEpoch is the epoch that was active when a topology change
	// started; absent for the first epoch and for pod rolls.
	// +optional
	FromEpoch *TopologyEpoch `json:"fromEpoch,omitempty"`
	// Step is the step in progress, e.g. Freeze, Activate, Retire.
	// +optional
	Step string `json:"step,omitempty"`
	// PodsDone is how many pods the roll has finished.
	PodsDone int32 `json:"podsDone"`
	// PodsTotal is how many pods the roll covers.
	PodsTotal int32 `json:"podsTotal"`
	// UnitsMoved is how many units have changed owner so far.
	UnitsMoved int32 `json:"unitsMoved"`
	// UnitsToMove is how many units the rollout moves in all.
	UnitsToMove int32 `json:"unitsToMove"`
	// StartedAt is when the rollout began.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// Message says what the step waits for, in words.
	// +optional
	Message string `json:"message,omitempty"`
	// Pods lists every pod of a pod-by-pod roll in the order it is rolled
	// (highest ordinal first) with its step. An operator restart resumes
	// from the pods in flight here, checked against the cluster.
	// +optional
	// +listType=atomic
	Pods []PodRollStatus `json:"pods,omitempty"`
}

// StrandedRowsStatus is what the topology's streams hold where no unit
// consumer will deliver it: rows sent to <prefix>.ingest.<p>.<s> with no
// token after the shard, and rows of a unit that a change removed,
// published after its consumer was retired. The operator checks after
// every provisioning of the active shape (each operator start and every
// 10 minutes).
type StrandedRowsStatus struct {
	// Rows is how many rows are stranded.
	Rows int64 `json:"rows"`
	// Where names up to five places holding some, largest first.
	// +optional
	// +listType=atomic
	Where []string `json:"where,omitempty"`
	// CheckedAt is when the operator counted them.
	CheckedAt metav1.Time `json:"checkedAt"`
}

// OrderBarrierStatus is the order barrier of the latest change of V under
// spec.rollout.ordering PerKey, as the registry records it and NATS was
// last read: which new units hold moved keys' rows for which old units.
type OrderBarrierStatus struct {
	// Epoch is the epoch whose activation moved the keys.
	Epoch int64 `json:"epoch"`
	// FromShards and ToShards are V before and after the change (equal
	// for a change of N).
	FromShards int32 `json:"fromShards"`
	ToShards   int32 `json:"toShards"`
	// FromPartitions and ToPartitions are N before and after a change of
	// N; absent for a change of V.
	// +optional
	FromPartitions int32 `json:"fromPartitions,omitempty"`
	// +optional
	ToPartitions int32 `json:"toPartitions,omitempty"`
	// Partitions is how many partition streams the barrier covers (for a
	// change of N, the old partitions whose keys move), and Switched how
	// many of them have their switch sequence recorded: the last row the
	// old shape routed (a change of V: the old transform's; a change of
	// N: the stream's last row once every publisher acknowledged the new
	// epoch).
	Partitions int32 `json:"partitions"`
	Switched   int32 `json:"switched"`
	// PublishersBehind names up to 16 publishers (pkg/publish.Acknowledge)
	// whose acknowledged epoch is older than Epoch, under a change of N:
	// until each names the new epoch its old-N rows may still arrive, so
	// no switch is recorded.
	// +optional
	// +listType=atomic
	PublishersBehind []string `json:"publishersBehind,omitempty"`
	// Predecessors counts the old units whose keys moved, and Lifted
	// those that acknowledged every row up to their stream's switch.
	Predecessors int32 `json:"predecessors"`
	Lifted       int32 `json:"lifted"`
	// UnitsWaiting counts the new units that hold moved keys' rows for a
	// predecessor not lifted yet (their unmoved keys flow).
	UnitsWaiting int32 `json:"unitsWaiting"`
	// Waiting names up to 16 of them, with the old units they wait for.
	// +optional
	// +listType=atomic
	Waiting []BarrierWait `json:"waiting,omitempty"`
	// Draining describes up to 16 old units not lifted yet, as NATS
	// showed them at CheckedAt.
	// +optional
	// +listType=atomic
	Draining []BarrierDrain `json:"draining,omitempty"`
	// Unread names up to 16 old units (or partitions, for a switch not
	// found yet) NATS did not answer for this time, with the error: they
	// stay unlifted and are read again.
	// +optional
	// +listType=atomic
	Unread []string `json:"unread,omitempty"`
	// AtAckLimit names up to 16 old units of a change of N whose
	// unacknowledged rows reached spec.nats.maxAckPending as last read:
	// rows of keys moving in, held there, may fill it, and then the unit
	// receives nothing more, so it cannot settle its rows up to the
	// switch and the barrier waits. Raise spec.nats.maxAckPending.
	// +optional
	// +listType=atomic
	AtAckLimit []string `json:"atAckLimit,omitempty"`
	// CheckedAt is when the operator last read the barrier's old units
	// in NATS; absent when it did not this time.
	// +optional
	CheckedAt *metav1.Time `json:"checkedAt,omitempty"`
}

// BarrierWait is one new unit waiting for old ones.
type BarrierWait struct {
	// Unit is the new unit, p.s.
	Unit string `json:"unit"`
	// For are the old units (p.s) not lifted yet that feed it.
	// +listType=atomic
	For []string `json:"for"`
}

// BarrierDrain is one old unit of the barrier not lifted yet.
type BarrierDrain struct {
	// Unit is the old unit, p.s.
	Unit string `json:"unit"`
	// SwitchSeq is its stream's switch sequence; absent while not
	// recorded.
	// +optional
	SwitchSeq *int64 `json:"switchSeq,omitempty"`
	// AckFloor is its consumer's ack floor (a stream sequence).
	AckFloor int64 `json:"ackFloor"`
	// FirstOpen is its first row above the ack floor not known to be
	// acknowledged; 0 when none was read.
	// +optional
	FirstOpen int64 `json:"firstOpen,omitempty"`
	// Pending and AckPending are its undelivered and unacknowledged rows.
	Pending    int64 `json:"pending"`
	AckPending int64 `json:"ackPending"`
	// Mark is the drained-to mark its holder recorded under a change of
	// N (every row at or below it acknowledged, or a moved-in key's row
	// the holder holds); absent when none was recorded.
	// +optional
	Mark int64 `json:"mark,omitempty"`
}

// ShardTopologyStatus is what the operator observed, as of
// observedGeneration.
type ShardTopologyStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase is a one-word summary: Pending, Provisioning,
	// AwaitingApproval, RollingOut, Ready, Paused, Stalled or Deleting.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// Progress is a short human-readable account of where the topology
	// stands, e.g. "epoch 2 (4x16): units 64/64 owned; pods 2/3". It is the
	// Progress column of kubectl get.
	// +optional
	Progress string `json:"progress,omitempty"`

	// ActiveEpoch is the topology epoch workers place units under.
	// +optional
	ActiveEpoch *TopologyEpoch `json:"activeEpoch,omitempty"`

	// TargetEpoch is the epoch being rolled out, when one is.
	// +optional
	TargetEpoch *TopologyEpoch `json:"targetEpoch,omitempty"`

	// Units counts the active epoch's units by ownership.
	// +optional
	Units *UnitCounts `json:"units,omitempty"`

	// Members counts the registry's live members and names those that are
	// not pods of the workload StatefulSet: anyone with the registry DSN
	// can join and take units (README, "What a DSN holder can do").
	// +optional
	Members *MemberStatus `json:"members,omitempty"`
	// SubjectPrefix is the subject prefix the topology's streams and
	// subjects use: spec.nats.subjectPrefix, or the default the operator
	// derived from the namespace and name when it is unset.
	// +optional
	SubjectPrefix string `json:"subjectPrefix,omitempty"`

	// StrandedRows counts the rows the topology's streams hold where no
	// unit consumer will ever deliver them, as of its last check.
	// +optional
	StrandedRows *StrandedRowsStatus `json:"strandedRows,omitempty"`

	// OrderBarrier is the order barrier of the latest change of V under
	// spec.rollout.ordering PerKey while it is up, and once lifted until
	// the next change; absent when no change was ordered.
	// +optional
	OrderBarrier *OrderBarrierStatus `json:"orderBarrier,omitempty"`

	// Provisioned is the smallest N x V covering every unit consumer the
	// operator created and has not retired yet. Units inside it but outside
	// the active epoch are retired once drained; the finalizer retires
	// what it covers.
	// +optional
	Provisioned *TopologyShape `json:"provisioned,omitempty"`

	// Census is the latest reading of NATS server versions.
	// +optional
	Census *CensusStatus `json:"census,omitempty"`

	// Plan is the change of N or V proposed or rolling out, when there is
	// one.
	// +optional
	Plan *PlanStatus `json:"plan,omitempty"`

	// Rollout is the progress of the current rollout, when one runs.
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`

	// LastRollout is the rollout that finished last.
	// +optional
	LastRollout *LastRolloutStatus `json:"lastRollout,omitempty"`

	// ApprovedPlanHash is the hash of the plan the approve annotation
	// last started (under spec.rollout.approval: Manual). An annotation
	// still carrying it once that change finished, succeeded or aborted,
	// approves nothing new and is not refused as stale, even after a pod
	// roll replaced status.lastRollout.
	// +optional
	ApprovedPlanHash string `json:"approvedPlanHash,omitempty"`

	// Conditions: Ready, Reconciling, Stalled, VersionFloorMet,
	// RolloutPaused.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// The short name is stopo, not st: st is one typo away from sts
// (StatefulSets), the other object a person handles beside a topology.

// ShardTopology declares the shard topology of one ingest fleet reading NATS
// JetStream, and reports how far the operator has brought the world to it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=stopo;shardtopo,categories=shardkeeper
// +kubebuilder:printcolumn:name="Partitions",type=integer,JSONPath=`.spec.partitions`,description="N, partitions"
// +kubebuilder:printcolumn:name="Shards",type=integer,JSONPath=`.spec.shardsPerPartition`,description="V, shards per partition"
// +kubebuilder:printcolumn:name="Epoch",type=integer,JSONPath=`.status.activeEpoch.number`,description="Active topology epoch"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Reason",type=string,priority=1,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="Why Ready is what it is"
type ShardTopology struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired topology.
	// +required
	Spec ShardTopologySpec `json:"spec"`

	// Status is the observed state.
	// +optional
	Status ShardTopologyStatus `json:"status,omitempty"`
}

// ShardTopologyList is a list of ShardTopology.
//
// +kubebuilder:object:root=true
type ShardTopologyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ShardTopology `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ShardTopology{}, &ShardTopologyList{})
}
