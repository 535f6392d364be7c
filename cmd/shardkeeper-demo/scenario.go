package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/fleettest"
	"github.com/shardkeeper/shardkeeper/internal/historycheck"
	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/pkg/publish"
)

// Under --ordering PerKey the demo leaves a backlog in the old units just
// before the change: every sink waits barrierSinkDelay a row while
// barrierBurst rows are published at once.
const (
	barrierSinkDelay = 100 * time.Millisecond
	barrierBurst     = 3000
)

// runScenario applies the sample, publishes rows, changes V and shows the
// rollout as it happens.
func runScenario(ctx context.Context, p *parts, o options) error {
	topo, err := loadSample()
	if err != nil {
		return err
	}
	topo.Spec.NATS.URLs = p.nats.URLs()
	perKey := o.ordering == topologyv1.OrderingPerKey
	if perKey {
		topo.Spec.NATS.ShardAssignment = topologyv1.ShardAssignmentSubjectTransform
		topo.Spec.Rollout.Ordering = topologyv1.OrderingPerKey
	}
	if err := createWorkload(ctx, p, topo); err != nil {
		return err
	}
	say("applying config/samples/topology_v1alpha1_shardtopology.yaml (N=%d, V=%d) with a local NATS URL%s",
		topo.Spec.Partitions, topo.Spec.ShardsPerPartition, map[bool]string{true: ", shardAssignment SubjectTransform and ordering PerKey"}[perKey])
	if err := p.k.Create(ctx, topo); err != nil {
		return wrap("apply sample", err)
	}
	key := client.ObjectKeyFromObject(topo)
	if _, err := watchUntilReady(ctx, p, key); err != nil {
		return err
	}

	from := ownership.Topology{Partitions: int(topo.Spec.Partitions), Shards: int(topo.Spec.ShardsPerPartition)}
	to := ownership.Topology{Partitions: from.Partitions, Shards: o.toShards}
	if o.toPartitions > 0 {
		to = ownership.Topology{Partitions: o.toPartitions, Shards: from.Shards}
	}
	pub, err := startPublisher(p, topo, from, perKey)
	if err != nil {
		return err
	}
	if perKey {
		// A keyed publisher picks each key's partition: it follows the
		// active epoch and acknowledges it, which a change of N's order
		// barrier waits for.
		pub.follow(ctx, p, key)
		say("keyed rows through the subject transform; slowing every sink to %s a row and publishing %d rows at once, so the old units still hold a backlog when the new shape is activated", barrierSinkDelay, barrierBurst)
		if err := os.WriteFile(p.sinkDelayFile(), []byte(barrierSinkDelay.String()), 0o644); err != nil {
			return err
		}
		pub.burst(barrierBurst)
	}
	if err := p.k.Get(ctx, key, topo); err != nil {
		return err
	}
	if to.Partitions != from.Partitions {
		say("publishing rows with unique ids; changing partitions %d -> %d", from.Partitions, to.Partitions)
	} else {
		say("publishing rows with unique ids; changing shardsPerPartition %d -> %d", from.Shards, to.Shards)
	}
	topo.Spec.Partitions, topo.Spec.ShardsPerPartition = int32(to.Partitions), int32(to.Shards)
	if err := p.k.Update(ctx, topo); err != nil {
		return wrap("change "+to.String(), err)
	}
	final, err := watchUntilReady(ctx, p, key)
	if err != nil {
		pub.stop()
		return err
	}
	if perKey {
		if err := os.Remove(p.sinkDelayFile()); err != nil {
			return err
		}
	}
	pub.setTopology(to)
	time.Sleep(time.Second) // a few rows to the new units too
	rows := pub.stop()
	say("rollout done; checking that every published row reached the workers' sink")
	if err := checkSink(ctx, p, rows); err != nil {
		return err
	}
	say("judging what the workers did (their delivery histories, the registry's claim history, every sink write%s)", map[bool]string{true: ", per-key order"}[perKey])
	if err := judge(ctx, p, rows, final.RegistryKey(), o.ordering); err != nil {
		return err
	}
	say("final status of shardtopology/%s:", final.Name)
	printConditions(final)
	return nil
}

func loadSample() (*topologyv1.ShardTopology, error) {
	root, err := testbed.RepoRoot()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(root + "/config/samples/topology_v1alpha1_shardtopology.yaml")
	if err != nil {
		return nil, err
	}
	t := &topologyv1.ShardTopology{}
	if err := yaml.UnmarshalStrict(b, t); err != nil {
		return nil, wrap("decode sample", err)
	}
	t.Namespace = namespace
	return t, nil
}

// createWorkload creates the namespace, the Secrets the sample names and
// a StatefulSet of three reference workers.
func createWorkload(ctx context.Context, p *parts, t *topologyv1.ShardTopology) error {
	if err := p.k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}
	secrets := map[string]map[string]string{}
	put := func(ref *topologyv1.SecretKeyRef, value string) {
		if secrets[ref.Name] == nil {
			secrets[ref.Name] = map[string]string{}
		}
		secrets[ref.Name][ref.Key] = value
	}
	put(&t.Spec.Registry.DSNSecretRef, p.dsn)
	put(t.Spec.NATS.CredentialsSecretRef, natstest.AppUser+":"+natstest.AppPassword)
	put(t.Spec.NATS.SystemCredentialsSecretRef, natstest.SysUser+":"+natstest.SysPassword)
	for name, data := range secrets {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, StringData: data}
		if err := p.k.Create(ctx, s); err != nil {
			return wrap("create Secret "+name, err)
		}
	}
	labels := map[string]string{"app": t.Spec.Workload.StatefulSetName}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: t.Spec.Workload.StatefulSetName, Namespace: namespace},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       ptr.To[int32](3),
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "worker", Image: "shardkeeper-worker", Args: []string{"--drain-timeout", "5s"},
					Env: []corev1.EnvVar{{Name: "WORKER_HANDLER_DELAY_FILE", Value: p.sinkDelayFile()}},
				}}},
			},
		},
	}
	say("creating Secrets and StatefulSet %s (3 reference workers)", sts.Name)
	return wrap("create StatefulSet", p.k.Create(ctx, sts))
}

// watchUntilReady prints a line whenever the topology's status changes,
// until it is Ready at its current generation.
func watchUntilReady(ctx context.Context, p *parts, key client.ObjectKey) (*topologyv1.ShardTopology, error) {
	last := ""
	for {
		t := &topologyv1.ShardTopology{}
		if err := p.k.Get(ctx, key, t); err != nil {
			return nil, err
		}
		if line := summary(t); line != last {
			fmt.Printf("    %s  %s\n", time.Now().Format("15:04:05.0"), line)
			last = line
		}
		if t.Status.ObservedGeneration == t.Generation && meta.IsStatusConditionTrue(t.Status.Conditions, topologyv1.ConditionReady) {
			return t, nil
		}
		if c := meta.FindStatusCondition(t.Status.Conditions, topologyv1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue {
			return nil, fmt.Errorf("shardtopology/%s stalled: %s: %s", key.Name, c.Reason, c.Message)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for shardtopology/%s: %w", key.Name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// summary is one line in the spirit of `kubectl get shardtopology`.
func summary(t *topologyv1.ShardTopology) string {
	ready := "Unknown"
	if c := meta.FindStatusCondition(t.Status.Conditions, topologyv1.ConditionReady); c != nil {
		ready = string(c.Status) + "(" + c.Reason + ")"
	}
	line := fmt.Sprintf("N=%d V=%d phase=%-12s ready=%-28s %s", t.Spec.Partitions, t.Spec.ShardsPerPartition,
		t.Status.Phase, ready, t.Status.Progress)
	if b := t.Status.OrderBarrier; b != nil && b.Lifted < b.Predecessors {
		line += fmt.Sprintf(" | order barrier: %d of %d old units drained to the switch, %d new units holding moved keys",
			b.Lifted, b.Predecessors, b.UnitsWaiting)
	}
	return line
}

func printConditions(t *topologyv1.ShardTopology) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "    TYPE\tSTATUS\tREASON\tMESSAGE")
	for _, c := range t.Status.Conditions {
		fmt.Fprintf(w, "    %s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	w.Flush()
}

// publisher sends rows with unique ids, 100 a second: round robin over a
// topology's units (publisher assignment), or, keyed, round robin over
// demoKeys keys through pkg/publish's subjects (the transform picks the
// shard), each key's rows numbered in order. One goroutine publishes, so
// a key's rows reach the stream in the order of their numbers.
type publisher struct {
	mu    sync.Mutex
	addr  publish.Topology
	topo  ownership.Topology
	keyed bool
	rows  []publishedRow
	seqs  map[string]int64
	more  int // rows to publish without waiting (a burst)
	// next is the active epoch follow saw last and the publishing
	// goroutine has not moved to yet.
	next *activeShape
	nc   *nats.Conn
	quit chan struct{}
	done chan struct{}
	// epoch is the epoch the publisher acknowledged, ackedAt when: the
	// publishing goroutine's alone.
	epoch   int64
	ackedAt time.Time
}

// activeShape is an active epoch as status shows it.
type activeShape struct {
	number int64
	topo   ownership.Topology
}

// publishedRow is a row the stream acknowledged, with its key and the
// key's sequence number when keyed.
type publishedRow struct {
	id  string
	key historycheck.KeyedRow
}

const demoKeys = 256

func startPublisher(p *parts, st *topologyv1.ShardTopology, topo ownership.Topology, keyed bool) (*publisher, error) {
	nc, err := nats.Connect(strings.Join(p.nats.URLs(), ","), nats.UserInfo(natstest.AppUser, natstest.AppPassword))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	// The sample sets no subject prefix: the topology's own default.
	addr := publish.Topology{Prefix: st.SubjectPrefix(), Assignment: publish.Assignment(st.Spec.NATS.ShardAssignment)}
	pub := &publisher{addr: addr, keyed: keyed, seqs: map[string]int64{}, nc: nc, quit: make(chan struct{}), done: make(chan struct{})}
	pub.setTopology(topo)
	go func() {
		defer close(pub.done)
		for n := 0; ; n++ {
			pub.mu.Lock()
			burst := pub.more > 0
			if burst {
				pub.more--
			}
			pub.mu.Unlock()
			if !burst {
				select {
				case <-pub.quit:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
			pub.acknowledge(js)
			pub.publishOne(js, n)
		}
	}()
	return pub, nil
}

// follow reads status.activeEpoch every 100ms and hands each new one to
// the publishing goroutine, as a publisher that watches the topology does.
func (pub *publisher) follow(ctx context.Context, p *parts, key client.ObjectKey) {
	go func() {
		var seen int64
		for {
			t := &topologyv1.ShardTopology{}
			if err := p.k.Get(ctx, key, t); err == nil {
				if a := t.Status.ActiveEpoch; a != nil && a.Number != seen {
					seen = a.Number
					pub.mu.Lock()
					pub.next = &activeShape{number: a.Number, topo: ownership.Topology{Partitions: int(a.Partitions), Shards: int(a.ShardsPerPartition)}}
					pub.mu.Unlock()
				}
			}
			select {
			case <-pub.quit:
				return
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

// acknowledge moves the publisher to the active epoch follow saw, and
// acknowledges it (pkg/publish.Acknowledge) then and every
// PublisherTTL/3. It runs in the publishing goroutine between two rows,
// so every row published under the older epoch has its stream ack.
func (pub *publisher) acknowledge(js jetstream.JetStream) {
	pub.mu.Lock()
	next := pub.next
	pub.next = nil
	pub.mu.Unlock()
	if next != nil {
		pub.setTopology(next.topo)
		pub.epoch, pub.ackedAt = next.number, time.Time{} // due now
	}
	if pub.epoch == 0 || time.Since(pub.ackedAt) < publish.PublisherTTL/3 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := publish.Acknowledge(ctx, js, pub.addr.Prefix, "demo", pub.epoch); err == nil {
		pub.ackedAt = time.Now()
	}
}

// publishOne publishes the n-th row and records it once the stream
// acknowledged it.
func (pub *publisher) publishOne(js jetstream.JetStream, n int) {
	id := fmt.Sprintf("demo-%07d", n)
	pub.mu.Lock()
	row := publishedRow{id: id}
	var subject string
	if pub.keyed {
		row.key.Key = fmt.Sprintf("k%d", n%demoKeys)
		row.key.Seq = pub.seqs[row.key.Key] + 1
		subject, _ = pub.addr.Subject(row.key.Key)
	} else {
		units := pub.topo.Units()
		u := units[n%len(units)]
		subject = natsops.Layout{SubjectPrefix: pub.addr.Prefix}.ShardSubject(u.Partition, u.Shard, id)
	}
	pub.mu.Unlock()
	msg := &nats.Msg{Subject: subject, Header: nats.Header{nats.MsgIdHdr: {id}}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	pub.rows = append(pub.rows, row)
	if pub.keyed {
		pub.seqs[row.key.Key] = row.key.Seq
	}
}

// burst publishes n rows as fast as the stream acknowledges them.
func (pub *publisher) burst(n int) {
	pub.mu.Lock()
	pub.more += n
	pub.mu.Unlock()
	for {
		pub.mu.Lock()
		left := pub.more
		pub.mu.Unlock()
		if left == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (pub *publisher) setTopology(t ownership.Topology) {
	pub.mu.Lock()
	defer pub.mu.Unlock()
	pub.topo = t
	pub.addr.Partitions, pub.addr.Shards = t.Partitions, t.Shards
}

func (pub *publisher) stop() []publishedRow {
	close(pub.quit)
	<-pub.done
	pub.nc.Close()
	pub.mu.Lock()
	defer pub.mu.Unlock()
	return pub.rows
}

// checkSink waits until every published id is in the sink and reports
// duplicates (rows written more than once).
func checkSink(ctx context.Context, p *parts, rows []publishedRow) error {
	deadline := time.Now().Add(time.Minute)
	for {
		sink, err := fleettest.ReadSink(ctx, p.dsn)
		if err != nil {
			return wrap("read sink", err)
		}
		writes := map[string]int{}
		for _, w := range sink {
			writes[w.ID]++
		}
		found, dups := 0, 0
		for _, r := range rows {
			if n := writes[r.id]; n > 0 {
				found++
				dups += n - 1
			}
		}
		if found == len(rows) {
			say("%d rows published, %d in the sink, %d written more than once, 0 lost", len(rows), found, dups)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d published rows never reached the sink", len(rows)-found, len(rows))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// judge runs the history checker over the demo's evidence and prints its
// verdict; a verdict that is not clean fails the demo. Under PerKey a
// cross-unit per-key inversion is a violation too.
func judge(ctx context.Context, p *parts, rows []publishedRow, topology string, ordering topologyv1.Ordering) error {
	reg, err := poolctl.Open(ctx, poolctl.Config{DSN: p.dsn, SkipMigrate: true})
	if err != nil {
		return wrap("open registry", err)
	}
	defer reg.Close()
	published := make(map[string]string, len(rows))
	keys := map[string]historycheck.KeyedRow{}
	for _, r := range rows {
		published[r.id] = ""
		if r.key.Key != "" {
			keys[r.id] = r.key
		}
	}
	in, err := fleettest.Gather(ctx, fleettest.Source{HistoryDir: p.historyDir(), DSN: p.dsn, Registry: reg, Topology: topology,
		Expected: fleettest.KubeletProcesses(p.kubelet)(), Keys: keys}, published)
	if err != nil {
		return err
	}
	in.Ordering = historycheck.Ordering(ordering)
	v := historycheck.Check(in)
	fmt.Println(indent(v.Table()))
	if !v.Clean() {
		return fmt.Errorf("the delivery history breaks a promise: %s", v.FirstViolation)
	}
	return nil
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}
