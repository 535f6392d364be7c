package controllers_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// A member that is not a pod of the workload (anyone with the DSN: here
// a worker started by hand as laptop-debug) shows in status.members with
// the units it holds, in a Warning Event and in
// shardkeeper_members{state="foreign"}. It took 16 of 64 units unseen:
// status said 64/64 owned and nothing was logged.
//
// checks P7
func TestAMemberThatIsNotAPodOfTheWorkloadShowsInStatus(t *testing.T) {
	f := newFleet(t, fleetInput{partitions: 2, shards: 4})
	f.withStatefulSet(1, "w")
	startOperator(t, f.ns)
	f.create()
	startSimWorker(t, f.reg, f.key(), "ingest-0", false)
	st := f.waitReady(60 * time.Second)
	if m := st.Status.Members; m == nil || m.Live != 1 || m.Foreign != 0 || len(m.ForeignNames) != 0 {
		t.Fatalf("members %+v with only the workload's pod ingest-0 live, want 1 live, none foreign", m)
	}

	startSimWorker(t, f.reg, f.key(), "laptop-debug", false)
	st = f.waitStatus(30*time.Second, func(o *topologyv1.ShardTopology) error {
		m := o.Status.Members
		if m == nil || m.Live != 2 || m.Foreign != 1 || !slices.Equal(m.ForeignNames, []string{"laptop-debug"}) || m.ForeignUnits == 0 {
			return fmt.Errorf("members %+v, want 2 live, laptop-debug foreign and holding units", m)
		}
		return nil
	})
	t.Logf("members %+v, progress %q", *st.Status.Members, st.Status.Progress)
	waitEvent(t, f.ns, topologyv1.ReasonForeignMember, "laptop-debug")
	labels := map[string]string{"namespace": f.ns, "name": "ingest", "state": "foreign"}
	eventually(t, 10*time.Second, func() error {
		if v, ok := metricValue(t, "shardkeeper_members", labels); !ok || v != 1 {
			return fmt.Errorf("shardkeeper_members{state=foreign} = %v (present %v), want 1", v, ok)
		}
		return nil
	})
}
