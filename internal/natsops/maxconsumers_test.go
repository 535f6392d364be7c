package natsops

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
)

// A stream's max_consumers is raised to StreamMaxConsumers when it is
// unset or lower, and left when it is already as high or higher.
func TestStreamDriftRaisesMaxConsumersThatAreUnsetOrTooLow(t *testing.T) {
	for _, tc := range []struct {
		got     int
		drifted bool
	}{
		{got: -1, drifted: true},
		{got: 0, drifted: true},
		{got: 1000, drifted: true},
		{got: StreamMaxConsumers - 1, drifted: true},
		{got: StreamMaxConsumers, drifted: false},
		{got: 10 * StreamMaxConsumers, drifted: false},
	} {
		t.Run(fmt.Sprint(tc.got), func(t *testing.T) {
			want := testLayout(1, MaxShards, 1).StreamConfig(0)
			got := want
			got.MaxConsumers = tc.got
			fs, next := streamDrift(want, got, false)
			if !tc.drifted {
				if next != nil || len(fs) != 0 {
					t.Fatalf("next %+v findings %v, want no drift", next, fs)
				}
				return
			}
			if next == nil || next.MaxConsumers != StreamMaxConsumers {
				t.Fatalf("next %+v, want max_consumers raised to %d", next, StreamMaxConsumers)
			}
			if len(fs) != 1 || fs[0].Field != "max_consumers" || !fs[0].Updated || fs[0].Unsafe ||
				fs[0].Want != fmt.Sprint(StreamMaxConsumers) || !strings.HasPrefix(fs[0].Got, fmt.Sprint(tc.got)) {
				t.Fatalf("findings %v, want one updated max_consumers finding", fs)
			}
			t.Log(fs[0])
		})
	}
}

// nats-server 2.15 refuses a stream's 1001st consumer unless the stream
// (or its account) sets a consumer limit; 2.14 sets none. Provision creates
// every stream with max_consumers StreamMaxConsumers and raises it on a
// stream created without one, so a stream of the largest V the API allows
// (1024) is provisioned on both. The API caps V at 1024, so 4096 units are
// four such streams.
func TestProvisionsMoreThanAThousandUnitsPerStreamOn215And214(t *testing.T) {
	for _, version := range []string{natstest.Version215, natstest.Version214} {
		t.Run(version, func(t *testing.T) {
			c := natstest.StartProcCluster(t, natstest.Binary(t, version))
			nc := c.Connect(0)
			if got := "v" + nc.ConnectedServerVersion(); got != version {
				t.Fatalf("connected to nats-server %s, want %s", got, version)
			}
			for _, tc := range []struct {
				name       string
				partitions int
				// unset creates the streams first as the layout did
				// before max_consumers: unlimited, which 2.15 reads as unset.
				unset bool
			}{
				{name: "1024 units on one stream", partitions: 1},
				{name: "4096 units on four streams of 1024", partitions: 4},
				{name: "1024 units on a stream created without max_consumers", partitions: 1, unset: true},
			} {
				t.Run(tc.name, func(t *testing.T) {
					l := testLayout(tc.partitions, MaxShards, 1)
					jsa := jsAPI{nc}
					if tc.unset {
						for p := range tc.partitions {
							cfg := l.StreamConfig(p)
							cfg.MaxConsumers = -1
							if err := jsa.createStream(testContext(t, 10*time.Second), cfg); err != nil {
								t.Fatalf("create stream %s without max_consumers: %v", cfg.Name, err)
							}
						}
					}

					start := time.Now()
					rep, err := Provision(testContext(t, 5*time.Minute), nc, l)
					took := time.Since(start)
					if err != nil {
						t.Fatalf("provision %d x %d on %s: %v", l.Partitions, l.Shards, version, err)
					}
					t.Logf("%s: provisioned %d units (%d per stream) in %s", version, l.Partitions*l.Shards, l.Shards, took.Round(time.Millisecond))

					wantCreated := l.Partitions + l.Partitions*l.Shards
					if tc.unset {
						wantCreated = l.Partitions * l.Shards
					}
					if len(rep.Created) != wantCreated {
						t.Fatalf("created %d objects, want %d", len(rep.Created), wantCreated)
					}
					var raised int
					for _, f := range rep.Findings {
						if f.Field == "max_consumers" && f.Updated {
							raised++
							continue
						}
						t.Errorf("unexpected finding: %s", f)
					}
					if tc.unset && raised != l.Partitions {
						t.Fatalf("%d max_consumers findings, want one per stream created without it (%d)", raised, l.Partitions)
					}
					if !tc.unset && raised != 0 {
						t.Fatalf("%d max_consumers findings on streams Provision created", raised)
					}
					assertStreamsHoldEveryUnit(t, jsa, l)
				})
			}
		})
	}
}

// assertStreamsHoldEveryUnit checks every stream of l carries
// StreamMaxConsumers and holds its V unit consumers.
func assertStreamsHoldEveryUnit(t *testing.T, jsa jsAPI, l Layout) {
	t.Helper()
	ctx := testContext(t, 30*time.Second)
	for p := range l.Partitions {
		st, err := jsa.streamInfo(ctx, l.StreamName(p))
		if err != nil {
			t.Fatal(err)
		}
		if st.Config.MaxConsumers != StreamMaxConsumers {
			t.Fatalf("stream %s: max_consumers %d, want %d", st.Config.Name, st.Config.MaxConsumers, StreamMaxConsumers)
		}
		names, err := jsa.consumerNames(ctx, l.StreamName(p))
		if err != nil {
			t.Fatal(err)
		}
		have := make(map[string]bool, len(names))
		for _, n := range names {
			have[n] = true
		}
		for s := range l.Shards {
			if !have[l.ConsumerDurable(p, s)] {
				t.Fatalf("stream %s has %d consumers and not unit %d.%d's", st.Config.Name, len(names), p, s)
			}
		}
	}
}

// Where the account's own JetStream consumer limit is below
// StreamMaxConsumers, the server refuses a stream whose max_consumers is
// above it: Provision gives new streams the account's limit and raises an
// unset one only that far, so such an account provisions as before.
func TestProvisionKeepsMaxConsumersWithinTheAccountsLimit(t *testing.T) {
	const accountLimit = 1500
	c := natstest.StartClusterWith(t, 1, func(_ int, cfg *natstest.ServerConfig) {
		cfg.AppJetStream = fmt.Sprintf("{ max_consumers: %d }", accountLimit)
	})
	nc := c.Connect(0)
	jsa := jsAPI{nc}
	l := testLayout(2, 4, 1)
	// Partition 1's stream exists already, made without max_consumers.
	old := l.StreamConfig(1)
	old.MaxConsumers = -1
	if err := jsa.createStream(testContext(t, 10*time.Second), old); err != nil {
		t.Fatal(err)
	}

	rep, err := Provision(testContext(t, time.Minute), nc, l)
	if err != nil {
		t.Fatalf("provision in an account limited to %d consumers: %v", accountLimit, err)
	}
	if len(rep.Findings) != 1 || rep.Findings[0].Field != "max_consumers" || rep.Findings[0].Want != fmt.Sprint(accountLimit) || !rep.Findings[0].Updated {
		t.Fatalf("findings %v, want partition 1's max_consumers raised to %d", rep.Findings, accountLimit)
	}
	for p := range l.Partitions {
		st, err := jsa.streamInfo(testContext(t, 10*time.Second), l.StreamName(p))
		if err != nil {
			t.Fatal(err)
		}
		if st.Config.MaxConsumers != accountLimit {
			t.Fatalf("stream %s: max_consumers %d, want the account's %d", st.Config.Name, st.Config.MaxConsumers, accountLimit)
		}
	}
	if again := mustProvision(t, nc, l); len(again.Findings)+len(again.Created)+len(again.Updated) != 0 {
		t.Fatalf("second provision was not a no-op: %+v", again)
	}
}
