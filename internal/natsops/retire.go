package natsops

import (
	"context"
	"fmt"
	"sort"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/nats.go"
)

// Holding is a unit consumer that still holds rows, and so was kept.
type Holding struct {
	Unit Unit
	// Pending rows match the consumer's filter and were never delivered.
	Pending uint64
	// AckPending rows were delivered and not yet acknowledged.
	AckPending int
}

// RetireConsumers deletes the consumers of units that left the topology,
// but only those that are drained: nothing pending, nothing waiting for an
// ack. A consumer that still holds rows is never deleted; it comes back in
// holding, and the caller retries once its owner has worked it off. A
// consumer that is already gone counts as retired.
//
// The check and the delete are two requests: callers retire only after the
// active topology routes no new rows to these units (the rollout's last
// step), so nothing can arrive in between.
func RetireConsumers(ctx context.Context, nc *nats.Conn, l Layout, units []Unit) (retired []Unit, holding []Holding, err error) {
	mgr, err := manager(ctx, nc)
	if err != nil {
		return nil, nil, err
	}
	for _, u := range units {
		if err := ctx.Err(); err != nil {
			return retired, holding, err
		}
		ref := l.ConsumerRef(u)
		c, err := mgr.LoadConsumer(ref.Stream, ref.Name)
		switch {
		case jsm.IsNatsError(err, errCodeConsumerNotFound), jsm.IsNatsError(err, errCodeStreamNotFound):
			retired = append(retired, u)
			continue
		case err != nil:
			return retired, holding, fmt.Errorf("load consumer %s: %w", ref, err)
		}
		st, err := c.LatestState()
		if err != nil {
			return retired, holding, fmt.Errorf("read state of consumer %s: %w", ref, err)
		}
		if st.NumPending > 0 || st.NumAckPending > 0 {
			holding = append(holding, Holding{Unit: u, Pending: st.NumPending, AckPending: st.NumAckPending})
			continue
		}
		if err := mgr.DeleteConsumer(ref.Stream, ref.Name); err != nil && !jsm.IsNatsError(err, errCodeConsumerNotFound) {
			return retired, holding, fmt.Errorf("delete consumer %s: %w", ref, err)
		}
		retired = append(retired, u)
	}
	return retired, holding, nil
}

func sortUnits(us []Unit) {
	sort.Slice(us, func(i, j int) bool {
		if us[i].Partition != us[j].Partition {
			return us[i].Partition < us[j].Partition
		}
		return us[i].Shard < us[j].Shard
	})
}
