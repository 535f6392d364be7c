package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Polling intervals. The registry and the pods are polled rather than
// watched: workers write the registry, and polling a roll's few pods is
// cheaper than caching every pod of the cluster.
const (
	// pollFast is how often a rollout step that waits on workers or pods
	// looks again (acks, claims, handovers, rejoins).
	pollFast = time.Second
	// pollSlow is how often a step waiting on rows to drain looks again.
	pollSlow = 5 * time.Second
	// pollIdle bounds how stale status.units gets in the steady state.
	pollIdle = 30 * time.Second
	// reprovisionEvery is how often the steady state re-runs Provision to
	// correct drift (it also runs after every operator start).
	reprovisionEvery = 10 * time.Minute
	// natsOpTimeout bounds one NATS operation (Provision, RetireConsumers).
	natsOpTimeout = time.Minute
)

// scope is what one reconcile knows: the object as read, the time it
// started, the connections it uses and what its steps found. Steps fill it
// in order; the pure status functions read it through observation.
type scope struct {
	topo *topologyv1.ShardTopology
	key  types.NamespacedName
	now  time.Time
	// events are the pass's step Events, sent at its end (flushEvents).
	events []stepEvent
	// durability is what the registry's replication settings promise
	// (nil: not read, or not a PostgreSQL registry).
	durability *poolctl.Durability

	// stall is set by a step that found something only a person can fix.
	stall *StallError
	// strayDrainsHeld: a drain request with no pod in flight was kept
	// because this leader's token is new (clearStrayDrains).
	strayDrainsHeld bool
	// failedStep names the step that returned an error.
	failedStep string

	secrets map[string]*corev1.Secret
	sts     *appsv1.StatefulSet
	params  poolctl.Params

	reg poolctl.Registry
	nc  *nats.Conn
	// sys is the system-account connection; nil without system credentials.
	sys *nats.Conn

	snap   *poolctl.Snapshot
	claims map[string]poolctl.ClaimInfo
	// activity is every member's latest activity report.
	activity []poolctl.ActivityReport
	// regOffset is the registry's clock minus the operator's, as seen at
	// the snapshot (its error is about one round trip).
	regOffset time.Duration
	// pending are the recent censuses' counts of pending rows per unit,
	// oldest first; none when this process has not counted them yet.
	pending []pendingRows
	// changed: a step wrote the registry, so it is read again for status.
	changed bool
	// flow is the units' flow as Report judged it from the registry as
	// last read and the censuses' counts (nil until judged; a new read
	// clears it). Status reuses it: at 4096 units a judgement is a
	// share of a reconcile.
	flow *unitFlow
	// nextEpoch is the registry's number for the next epoch, read when a
	// change is wanted (its plan's hash names it).
	nextEpoch int64

	census *censusReport
	// natsDown says why no NATS server is reachable (Report fills it).
	natsDown string
	change   changeReport
	// plan is the change's plan as status.plan shows it; nil when no
	// change is wanted this reconcile.
	plan        *topologyv1.PlanStatus
	rollWorld   *rollWorld
	roll        rollReport
	provisioned *topologyv1.TopologyShape
	// retireRan says retireUnits looked at the units that left this
	// reconcile; retiringLeft are those it kept (claimed or holding rows).
	retireRan    bool
	retiringLeft []ownership.Unit
	// stranded is the count of stranded rows taken this reconcile.
	stranded *topologyv1.StrandedRowsStatus
	// barrier is the order barrier of the active or pending epoch, read
	// with the snapshot (nil: none, or gone since), and barrierRep what
	// this reconcile read of its old units in NATS.
	barrier    *poolctl.OrderBarrier
	barrierRep *barrierReport
}

func newScope(t *topologyv1.ShardTopology, now time.Time) *scope {
	s := &scope{topo: t.DeepCopy(), key: types.NamespacedName{Namespace: t.Namespace, Name: t.Name}, now: now}
	if p := t.Status.Provisioned; p != nil {
		cp := *p
		s.provisioned = &cp
	}
	return s
}

// firstSight reports whether no reconcile has written status yet.
func (s *scope) firstSight() bool { return len(s.topo.Status.Conditions) == 0 }

// registryKey is the topology's key in the registry.
func (s *scope) registryKey() string { return s.topo.RegistryKey() }

// target is the topology the spec asks for.
func (s *scope) target() ownership.Topology {
	return ownership.Topology{Partitions: int(s.topo.Spec.Partitions), Shards: int(s.topo.Spec.ShardsPerPartition)}
}

// observation condenses what the steps found for the pure status functions.
func (s *scope) observation(err error) observation {
	o := observation{
		stall:       s.stall,
		paused:      s.topo.IsPaused(),
		census:      s.census,
		change:      s.change,
		plan:        s.plan,
		roll:        s.roll,
		provisioned: s.provisioned,
		spec:        s.topo.Spec.Shape(),
		workload:    workloadOf(s.sts),
		stranded:    s.stranded,
		natsDown:    s.natsDown,
	}
	o.retiring = len(s.retiringSet())
	var stall *StallError
	if err != nil && !errors.As(err, &stall) {
		o.err = err
	}
	o.durability = s.durability
	o.barrier = orderBarrierStatus(s.activeBarrier(), s.barrierRep)
	if s.snap != nil {
		o.registry = &registryView{snap: *s.snap, claims: s.claims, activity: s.activity, pending: s.pending, judged: s.flow}
	}
	return o
}

// StallError says why the spec cannot be acted on and which field to fix.
// It becomes the Stalled condition; retrying will not help until the spec or
// the object it names changes (a watch brings the reconcile back then).
type StallError struct {
	// Reason is the CamelCase condition reason.
	Reason string
	// Field is the spec path at fault, e.g. spec.registry.dsnSecretRef.
	Field string
	// Detail says what is wrong and what is allowed.
	Detail string
	// Poll, when set, is how soon to look again: for stalls the world may
	// end on its own (a pod that hands over late), not only a spec change.
	Poll time.Duration
}

func (e *StallError) Error() string { return e.Field + ": " + e.Detail }

// step is one named, idempotent piece of a reconcile. Every step has this
// signature; a step that waits returns RequeueAfter, one that cannot go on
// sets s.stall, one that failed returns an error.
type step struct {
	name string
	run  func(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error)
}

// reconcileSteps run in order; a step that stalls or fails ends the pass.
var reconcileSteps = []step{
	{"CheckSecrets", checkSecrets},
	{"CheckWorkload", checkWorkload},
	{"CheckLeaseParams", checkLeaseParams},
	{"Connect", connect},
	{"ObserveRegistry", observeRegistry},
	{"Census", takeCensus},
	{"ObservePods", observePods},
	{"RollOutTopology", rollOutTopology},
	{"OrderBarrier", orderBarrier},
	{"RollPods", rollPods},
	{"PublishRetiring", publishRetiring},
	{"PruneHistory", pruneHistory},
	{"Report", report},
}

// runSteps runs steps in order and keeps the shortest requeue any asked for.
func runSteps(ctx context.Context, r *ShardTopologyReconciler, s *scope, steps []step) (ctrl.Result, error) {
	var result ctrl.Result
	for _, st := range steps {
		began := time.Now()
		res, err := st.run(ctx, r, s)
		reconcileStepSeconds.WithLabelValues(st.name).Observe(time.Since(began).Seconds())
		if stall := (*StallError)(nil); err != nil && s.stall != nil && errors.As(err, &stall) {
			// A step deep in an action stalled (a NATS refusal): the
			// stall below ends the pass, not an error's backoff.
			err = nil
		}
		if err != nil {
			s.failedStep = st.name
			return ctrl.Result{}, fmt.Errorf("%s: %w", st.name, err)
		}
		result.RequeueAfter = shortestRequeue(result.RequeueAfter, res.RequeueAfter)
		if s.stall != nil {
			if s.stall.Poll > 0 {
				return ctrl.Result{RequeueAfter: shortestRequeue(result.RequeueAfter, s.stall.Poll)}, nil
			}
			return ctrl.Result{}, ctrl.TerminalError(s.stall)
		}
	}
	return result, nil
}

func shortestRequeue(a, b time.Duration) time.Duration {
	switch {
	case a == 0:
		return b
	case b == 0 || a < b:
		return a
	default:
		return b
	}
}

// secretRef is one Secret key the spec needs, with the field that names it.
type secretRef struct {
	field string
	name  string
	key   string // empty: the Secret must exist, no key is checked
}

// secretRefs lists every Secret the spec references.
func secretRefs(spec *topologyv1.ShardTopologySpec) []secretRef {
	refs := []secretRef{{"spec.registry.dsnSecretRef", spec.Registry.DSNSecretRef.Name, spec.Registry.DSNSecretRef.Key}}
	if r := spec.NATS.CredentialsSecretRef; r != nil {
		refs = append(refs, secretRef{"spec.nats.credentialsSecretRef", r.Name, r.Key})
	}
	if r := spec.NATS.SystemCredentialsSecretRef; r != nil {
		refs = append(refs, secretRef{"spec.nats.systemCredentialsSecretRef", r.Name, r.Key})
	}
	if r := spec.NATS.TLSSecretRef; r != nil {
		refs = append(refs, secretRef{"spec.nats.tlsSecretRef", r.Name, ""})
	}
	return refs
}

// referencedSecrets is the index function behind the Secret watch.
func referencedSecrets(spec *topologyv1.ShardTopologySpec) []string {
	var names []string
	for _, r := range secretRefs(spec) {
		names = append(names, r.name)
	}
	return names
}

// checkSecrets stalls when a referenced Secret or key is missing, and keeps
// the Secrets for Connect. Secret values are never written to logs, status
// or events.
func checkSecrets(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	t := s.topo
	s.secrets = map[string]*corev1.Secret{}
	for _, ref := range secretRefs(&t.Spec) {
		sec := s.secrets[ref.name]
		if sec == nil {
			var err error
			sec, err = r.readSecret(ctx, s.key, types.NamespacedName{Namespace: t.Namespace, Name: ref.name})
			switch {
			case apierrors.IsNotFound(err):
				s.stall = &StallError{Reason: topologyv1.ReasonSecretNotFound, Field: ref.field,
					Detail: fmt.Sprintf("Secret %q not found in namespace %q", ref.name, t.Namespace)}
				return ctrl.Result{}, nil
			case err != nil:
				return ctrl.Result{}, fmt.Errorf("get Secret %s for %s: %w", ref.name, ref.field, err)
			}
			s.secrets[ref.name] = sec
		}
		if _, ok := sec.Data[ref.key]; ref.key != "" && !ok {
			s.stall = &StallError{Reason: topologyv1.ReasonSecretKeyMissing, Field: ref.field,
				Detail: fmt.Sprintf("Secret %q has no key %q", ref.name, ref.key)}
			return ctrl.Result{}, nil
		}
	}
	return ctrl.Result{}, nil
}

// checkWorkload stalls when the worker StatefulSet does not exist or does
// not let the operator roll its pods (update strategy OnDelete).
func checkWorkload(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	t := s.topo
	name := t.Spec.Workload.StatefulSetName
	sts := &appsv1.StatefulSet{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: t.Namespace, Name: name}, sts)
	switch {
	case apierrors.IsNotFound(err):
		s.stall = &StallError{Reason: topologyv1.ReasonWorkloadNotFound, Field: "spec.workload.statefulSetName",
			Detail: fmt.Sprintf("StatefulSet %q not found in namespace %q", name, t.Namespace)}
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("get StatefulSet %s: %w", name, err)
	}
	if typ := sts.Spec.UpdateStrategy.Type; typ != appsv1.OnDeleteStatefulSetStrategyType {
		if typ == "" {
			typ = appsv1.RollingUpdateStatefulSetStrategyType
		}
		s.stall = &StallError{Reason: topologyv1.ReasonWorkloadUpdateStrategy, Field: "spec.workload.statefulSetName",
			Detail: fmt.Sprintf("StatefulSet %q uses update strategy %s; set its spec.updateStrategy.type to OnDelete so the operator rolls its pods one at a time, each handing its units over before it is deleted",
				name, typ)}
		return ctrl.Result{}, nil
	}
	s.sts = sts
	return ctrl.Result{}, nil
}

// leaseParams are the registry lease parameters of a spec: the spec's lease
// TTL and renew interval, a query bound of a quarter of the lease (at most
// 2s), and the smallest grace P5 allows (renew interval plus query bound).
func leaseParams(r *topologyv1.RolloutSpec) poolctl.Params {
	ttl, renew := r.LeaseTTLOrDefault(), r.RenewIntervalOrDefault()
	qb := min(2*time.Second, ttl/4)
	return poolctl.Params{LeaseTTL: ttl, RenewInterval: renew, QueryBound: qb, Grace: renew + qb}
}

// registryParams are the parameters the registry holds for the spec's
// workers: the lease parameters, and the naming and drain timeout they
// read beside their lease.
func registryParams(t *topologyv1.ShardTopology) poolctl.Params {
	spec := &t.Spec
	p := leaseParams(&spec.Rollout)
	p.Worker = poolctl.WorkerSettings{SubjectPrefix: t.SubjectPrefix(), ConsumerName: spec.NATS.ConsumerNameOrDefault(),
		DrainTimeout: spec.Rollout.DrainTimeoutOrDefault()}
	return p
}

// checkLeaseParams stalls on lease parameters the registry would refuse.
// The CRD's rules make this unreachable through the API server; objects
// stored before a rule existed still get a clear answer.
func checkLeaseParams(_ context.Context, _ *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	p := registryParams(s.topo)
	if err := p.Validate(); err != nil {
		s.stall = &StallError{Reason: topologyv1.ReasonInvalidSpec, Field: "spec.rollout.leaseTTL/spec.rollout.renewInterval",
			Detail: fmt.Sprintf("lease TTL %s with renew interval %s gives lease parameters the registry refuses: %v; keep renewInterval at most half of leaseTTL",
				p.LeaseTTL, p.RenewInterval, err)}
		return ctrl.Result{}, nil
	}
	s.params = p
	return ctrl.Result{}, nil
}

// secretValue is one key of a Secret that checkSecrets found.
func (s *scope) secretValue(ref *topologyv1.SecretKeyRef) []byte {
	if ref == nil {
		return nil
	}
	if sec := s.secrets[ref.Name]; sec != nil {
		return sec.Data[ref.Key]
	}
	return nil
}

// natsConfig is how to reach NATS with the credentials at ref.
func (s *scope) natsConfig(ref *topologyv1.SecretKeyRef, role string) NATSConfig {
	cfg := NATSConfig{
		Name:        fmt.Sprintf("shardkeeper-operator %s (%s)", s.registryKey(), role),
		URLs:        s.topo.Spec.NATS.URLs,
		Credentials: s.secretValue(ref),
	}
	if ref := s.topo.Spec.NATS.TLSSecretRef; ref != nil {
		if sec := s.secrets[ref.Name]; sec != nil {
			cfg.TLS = sec.Data
		}
	}
	return cfg
}

// connect opens (or reuses) the registry and NATS connections and writes
// the lease parameters. Unreachable servers are errors a retry may fix;
// credentials that cannot be parsed stall, naming the field.
func connect(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	spec := &s.topo.Spec
	reg, err := r.openRegistry(ctx, s, string(s.secretValue(&spec.Registry.DSNSecretRef)))
	if st := registryConfigStall(err, spec.Registry.DSNSecretRef); st != nil {
		s.stall = st
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, retryAfter(fmt.Errorf("open registry from spec.registry.dsnSecretRef: %w", err), registryRetry)
	}
	if err := r.conns().EnsureTopology(ctx, s.key, reg, s.registryKey(), s.params); err != nil {
		return ctrl.Result{}, retryAfter(fmt.Errorf("write lease parameters: %w", err), registryRetry)
	}
	s.reg = reg

	nc, err := r.conns().NATS(s.key, s.natsConfig(spec.NATS.CredentialsSecretRef, "streams"))
	if errors.Is(err, ErrBadCredentials) {
		s.stall = &StallError{Reason: topologyv1.ReasonInvalidSpec, Field: "spec.nats.credentialsSecretRef", Detail: err.Error()}
		return ctrl.Result{}, nil
	}
	if st := natsConfigStall(err, "spec.nats.credentialsSecretRef"); st != nil {
		s.stall = st
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	s.nc = nc
	if ref := spec.NATS.SystemCredentialsSecretRef; ref != nil {
		sys, err := r.conns().SystemNATS(s.key, s.natsConfig(ref, "system"))
		if errors.Is(err, ErrBadCredentials) {
			s.stall = &StallError{Reason: topologyv1.ReasonInvalidSpec, Field: "spec.nats.systemCredentialsSecretRef", Detail: err.Error()}
			return ctrl.Result{}, nil
		}
		if err != nil {
			// The census fails closed without it; the rollout does not
			// need it, so this is not an error of the reconcile.
			log.FromContext(ctx).Info("System account connection failed; census fails closed", "error", err.Error())
			s.census = &censusReport{failed: fmt.Sprintf("connect with spec.nats.systemCredentialsSecretRef: %v", err)}
		}
		s.sys = sys
	}
	return ctrl.Result{}, nil
}

// observeRegistry reads the topology's registry state: epochs, members,
// the RESET permission, every claim and every activity report, and what
// the last census counted pending.
func observeRegistry(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	s.pending, _ = r.conns().pendingRows(s.key)
	if err := recoverBehindRegistry(ctx, r, s); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, retryAfter(s.readRegistry(ctx), registryRetry)
}

func (s *scope) readRegistry(ctx context.Context) error {
	// One consistent read: claims and activity judged against the members
	// of the same instant.
	sent := time.Now()
	obs, err := s.reg.Observe(ctx, s.registryKey())
	if err != nil {
		return fmt.Errorf("read registry: %w", err)
	}
	s.regOffset = obs.Snapshot.Now.Sub(sent.Add(time.Since(sent) / 2))
	s.snap = &obs.Snapshot
	s.claims = make(map[string]poolctl.ClaimInfo, len(obs.Claims))
	for _, c := range obs.Claims {
		s.claims[c.Unit] = c
	}
	s.activity = obs.Activity
	s.barrier = obs.Snapshot.Barrier
	if obs.Durability != nil {
		// The RegistryDurable condition; a registry without replication
		// settings (the twin) leaves it as it was.
		s.durability = obs.Durability
	}
	s.changed = false
	s.flow = nil
	return nil
}

// refreshRegistry reads the registry again when a step changed it, so what
// follows sees the world after this reconcile's actions.
func (s *scope) refreshRegistry(ctx context.Context) error {
	if !s.changed {
		return nil
	}
	return s.readRegistry(ctx)
}

// report reads the registry again when a step changed it, so status
// describes the world after this reconcile's actions. While an owned unit
// is stalled it looks again soon, so Ready follows the units' flow.
func report(ctx context.Context, r *ShardTopologyReconciler, s *scope) (ctrl.Result, error) {
	if err := s.refreshRegistry(ctx); err != nil {
		return ctrl.Result{}, err
	}
	s.natsDown = natsUnreachable(s.nc)
	if s.natsDown != "" {
		// Servers that come back may have lost streams or consumers:
		// provision again at the first reconcile that reaches them,
		// rather than up to reprovisionEvery later.
		r.conns().forgetProvisioned(s.key)
	}
	f := assessFlow(s.snap, s.claims, s.activity, s.pending)
	s.flow = &f
	if len(f.stalled) > 0 || f.multiplyOwned > 0 || s.natsDown != "" {
		return ctrl.Result{RequeueAfter: 2 * pollFast}, nil
	}
	return ctrl.Result{RequeueAfter: pollIdle}, nil
}

// natsUnreachable says why the stream account's connection reaches no
// server, or "" when it is connected. It is the operator's own evidence
// that NATS is down: workers that cannot pull still renew their leases,
// and a census that got no reply says nothing about flow (P7).
func natsUnreachable(nc *nats.Conn) string {
	if nc == nil || nc.IsConnected() {
		return ""
	}
	msg := fmt.Sprintf("the operator's connection to NATS is %s", natsStatusText(nc.Status()))
	if err := nc.LastError(); err != nil {
		msg += " (last error: " + err.Error() + ")"
	}
	return msg + "; no server it knows answers"
}

// natsStatusText names a connection status in words.
func natsStatusText(st nats.Status) string {
	switch st {
	case nats.RECONNECTING:
		return "reconnecting"
	case nats.DISCONNECTED:
		return "disconnected"
	case nats.CLOSED:
		return "closed"
	case nats.CONNECTING:
		return "connecting"
	}
	return st.String()
}

// layoutFor is what the topology asks of NATS for an N x V shape: its
// names, and its identity as the owner every stream and consumer is marked
// with.
func layoutFor(topo *topologyv1.ShardTopology, t ownership.Topology) natsops.Layout {
	n := &topo.Spec.NATS
	return natsops.Layout{
		Owner:         natsops.Owner{Name: topo.RegistryKey(), UID: string(topo.UID)},
		SubjectPrefix: topo.SubjectPrefix(),
		ConsumerName:  n.ConsumerNameOrDefault(),
		Partitions:    t.Partitions,
		Shards:        t.Shards,
		Replicas:      n.ReplicasOrDefault(),
		PinnedTTL:     n.PinnedTTLOrDefault(),
		AckWait:       n.AckWaitOrDefault(),
		MaxAckPending: n.MaxAckPendingOrDefault(),
		Assignment:    natsops.ShardAssignment(n.ShardAssignment),
	}
}

// epochTopology is an epoch's N x V.
func epochTopology(e *poolctl.Epoch) ownership.Topology {
	return ownership.Topology{Partitions: e.Partitions, Shards: e.Shards}
}

// ownedBy maps each unit held by a live member to that member. A held row
// whose owner's lease lapsed is not a valid claim: its unit is unowned
// until someone adopts it.
func ownedBy(snap *poolctl.Snapshot, claims map[string]poolctl.ClaimInfo) map[string]string {
	live := make(map[string]bool, len(snap.Members))
	for _, m := range snap.LiveMembers() {
		live[m.Name] = true
	}
	out := make(map[string]string, len(claims))
	for u, c := range claims {
		if c.State != poolctl.StateFree && live[c.Owner] {
			out[u] = c.Owner
		}
	}
	return out
}

// unitCounts counts the active epoch's units by ownership (valid claims).
// Whether owned units flow, and whether two members pull one unit, is
// judged from evidence by assessFlow.
func unitCounts(snap *poolctl.Snapshot, claims map[string]poolctl.ClaimInfo) (total, owned int) {
	if snap == nil || snap.Active == nil {
		return 0, 0
	}
	owners := ownedBy(snap, claims)
	for _, u := range epochTopology(snap.Active).Units() {
		if owners[u.String()] != "" {
			owned++
		}
	}
	return epochTopology(snap.Active).Len(), owned
}

// placementOwners is who placement gives each unit of t over the live
// members' slots, the way workers compute it. Members being drained for a
// pod roll are left out when excluded says so.
func placementOwners(t ownership.Topology, live []poolctl.Member, excluded func(poolctl.Member) bool) map[string]string {
	bySlot := map[ownership.Slot]string{}
	var slots []ownership.Slot
	for _, m := range live {
		if m.Slot < 0 || (excluded != nil && excluded(m)) {
			continue
		}
		bySlot[ownership.Slot(m.Slot)] = m.Name
		slots = append(slots, ownership.Slot(m.Slot))
	}
	pl := ownership.Place(t.Units(), slots)
	out := make(map[string]string, t.Len())
	for _, u := range t.Units() {
		if s, ok := pl.Owner(u); ok {
			out[u.String()] = bySlot[s]
		}
	}
	return out
}
