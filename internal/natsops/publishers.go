package natsops

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PublishersBucket is the key-value bucket where the publishers of a
// layout acknowledge the epoch they publish to (pkg/publish.Acknowledge
// writes it; the names must agree).
func (l Layout) PublishersBucket() string { return l.SubjectPrefix + "_publishers" }

// PublisherEpochs reads every live publisher's acknowledged epoch (the
// bucket's TTL forgets publishers that stopped). No bucket means no
// publisher ever acknowledged: an empty map. A value that is not a
// number counts as epoch 0, never as caught up.
func PublisherEpochs(ctx context.Context, nc *nats.Conn, l Layout) (map[string]int64, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open JetStream: %w", err)
	}
	rctx, cancel := requestContext(ctx)
	defer cancel()
	kv, err := js.KeyValue(rctx, l.PublishersBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", l.PublishersBucket(), err)
	}
	keys, err := kv.ListKeys(rctx)
	if err != nil {
		return nil, fmt.Errorf("list publishers in %s: %w", l.PublishersBucket(), err)
	}
	out := map[string]int64{}
	for k := range keys.Keys() {
		e, err := kv.Get(rctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or deleted since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("read publisher %s: %w", k, err)
		}
		n, _ := strconv.ParseInt(string(e.Value()), 10, 64)
		out[k] = n
	}
	return out, nil
}
