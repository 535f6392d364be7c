package publish

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// PublisherTTL is how long a publisher's acknowledgement counts: a
// publisher that stopped is forgotten this long after its last one. Call
// Acknowledge at least every PublisherTTL/3 while publishing.
const PublisherTTL = time.Minute

// PublishersBucket is the JetStream key-value bucket where publishers of
// the topology with subject prefix prefix acknowledge the epoch they
// publish to: one key per publisher, its value the epoch number.
func PublishersBucket(prefix string) string { return prefix + "_publishers" }

// Acknowledge records that publisher now publishes to epoch (the number of
// the active epoch whose N and V it uses; FromStatus gives both). Call it
// only once every row published under an older epoch has its stream ack:
// the operator takes it as the end of the publisher's rows there. Under
// shardAssignment Publisher the operator retires the units a change
// removed only once every publisher acknowledged within PublisherTTL names
// the active epoch: a publisher still on the old one could send rows to a
// unit whose consumer is gone. Publishers that never acknowledge are not
// waited for. The publisher's user needs the JetStream API for the bucket
// (KV_<prefix>_publishers, subjects $KV.<prefix>_publishers.>).
func Acknowledge(ctx context.Context, js jetstream.JetStream, prefix, publisher string, epoch int64) error {
	if !validToken(publisher) {
		return fmt.Errorf("publisher name %q must be one subject token", publisher)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: PublishersBucket(prefix), TTL: PublisherTTL, History: 1,
		Description: "shardkeeper: the epoch each publisher of " + prefix + " publishes to",
	})
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", PublishersBucket(prefix), err)
	}
	if _, err := kv.Put(ctx, publisher, []byte(strconv.FormatInt(epoch, 10))); err != nil {
		return fmt.Errorf("acknowledge epoch %d as publisher %s: %w", epoch, publisher, err)
	}
	return nil
}
