package natsops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Op is a guarded consumer operation.
type Op string

const (
	// OpReset rewinds a consumer to its ack floor, so rows a dead owner
	// held come back at once instead of after ack_wait.
	OpReset Op = "RESET"
	// OpUnpin makes a consumer forget its pinned client.
	OpUnpin Op = "UNPIN"
)

// ErrRefused matches every *RefusedError with errors.Is.
var ErrRefused = errors.New("refused by the version guard")

// RefusedError says a guarded operation was not issued, and which servers
// stand in its way.
type RefusedError struct {
	Op       Op
	Consumer ConsumerRef
	// Servers block the operation: below the version it needs, unknown, or
	// not covered by the census. Empty when the census itself is unusable
	// (missing or too old) and no server is to blame.
	Servers []string
	Reason  string
}

// Error names the operation, the consumer and the blocking servers.
func (e *RefusedError) Error() string {
	s := fmt.Sprintf("refuse %s of consumer %s: %s", e.Op, e.Consumer, e.Reason)
	if len(e.Servers) > 0 {
		s += " (servers: " + strings.Join(e.Servers, ", ") + ")"
	}
	return s
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// RequiredVersion is the lowest version op needs on every server that
// matters under a census floor: RESET needs the floor and at least 2.14.0,
// UNPIN only 2.11.0, whatever the floor, so that graceful handover keeps
// working while a cluster is upgraded from 2.12.
func RequiredVersion(op Op, floor Version) Version {
	if op == OpReset {
		return maxVersion(floor, MinResetVersion)
	}
	return MinUnpinVersion
}

// AllowReset says whether the census allows a RESET of the consumer: it is
// younger than maxAge and shows the consumer's leader, every replica and
// every cluster member known and at or above RequiredVersion. It returns
// nil or a *RefusedError.
func (c *Census) AllowReset(stream, consumer string, maxAge time.Duration) error {
	return c.Allow(OpReset, ConsumerRef{Stream: stream, Name: consumer}, maxAge, time.Now())
}

// AllowUnpin is AllowReset for UNPIN.
func (c *Census) AllowUnpin(stream, consumer string, maxAge time.Duration) error {
	return c.Allow(OpUnpin, ConsumerRef{Stream: stream, Name: consumer}, maxAge, time.Now())
}

// Allow is the guard: it returns nil when the census, read at now, allows
// op on ref, and a *RefusedError otherwise.
func (c *Census) Allow(op Op, ref ConsumerRef, maxAge time.Duration, now time.Time) error {
	refuse := func(servers []string, format string, args ...any) error {
		sort.Strings(servers)
		return &RefusedError{Op: op, Consumer: ref, Servers: servers, Reason: fmt.Sprintf(format, args...)}
	}
	if c == nil {
		return refuse(nil, "no census")
	}
	if age := now.Sub(c.TakenAt); age > maxAge || age < -time.Minute {
		return refuse(nil, "census taken at %s is %s old, older than %s", c.TakenAt.Format(time.RFC3339), age.Round(time.Millisecond), maxAge)
	}
	floor, err := ParseVersion(c.Floor)
	if err != nil {
		return refuse(nil, "census floor: %v", err)
	}
	need := RequiredVersion(op, floor)
	p, ok := c.Consumer(ref.Stream, ref.Name)
	if !ok {
		return refuse(nil, "the census did not inspect the consumer")
	}
	if !p.Found {
		return refuse(c.BelowFloor, "the census did not find the consumer on any server that answered")
	}
	if p.Leader == "" {
		return refuse(p.Replicas, "the consumer has no leader")
	}

	var blocking []string
	check := func(name string) {
		if slices.Contains(blocking, name) {
			return
		}
		s, ok := c.Server(name)
		if !ok || !s.Answered || !versionAtLeast(s.Version, need) {
			blocking = append(blocking, name)
		}
	}
	for _, h := range p.Hosts() {
		check(h)
	}
	for _, s := range c.Servers {
		switch s.Role {
		case RoleMetaLeader, RoleMember, RoleUnknown:
			check(s.Name)
		}
	}
	if len(blocking) > 0 {
		return refuse(blocking, "%s needs every host of the consumer and every cluster member at %s or above; these are below, unknown or did not answer", op, need)
	}
	return nil
}

func versionAtLeast(s string, need Version) bool {
	v, err := ParseVersion(s)
	return err == nil && v.AtLeast(need)
}

// Reset issues a RESET of the consumer to its ack floor, only if the census
// allows it (see AllowReset) and the consumer's current leader and replicas,
// read just before, are all servers the census approved. nc is a
// connection to the account that owns the stream. It returns the stream
// sequence the consumer will deliver next.
func Reset(ctx context.Context, nc *nats.Conn, c *Census, stream, consumer string, maxAge time.Duration) (uint64, error) {
	ref := ConsumerRef{Stream: stream, Name: consumer}
	js, err := guardFresh(ctx, nc, c, OpReset, ref, maxAge)
	if err != nil {
		return 0, err
	}
	rctx, cancel := requestContext(ctx)
	defer cancel()
	resp, err := js.ResetConsumer(rctx, stream, consumer)
	if err != nil {
		return 0, fmt.Errorf("reset consumer %s: %w", ref, err)
	}
	return resp.ResetSeq, nil
}

// Unpin issues an UNPIN of the consumer's priority group, only if the
// census allows it (see AllowUnpin) and the consumer's current placement is
// covered by it.
func Unpin(ctx context.Context, nc *nats.Conn, c *Census, stream, consumer, group string, maxAge time.Duration) error {
	ref := ConsumerRef{Stream: stream, Name: consumer}
	if _, err := guardFresh(ctx, nc, c, OpUnpin, ref, maxAge); err != nil {
		return err
	}
	// jsm.go's Consumer.Unpin needs a loaded consumer and takes no context,
	// and nats.go has it only on a loaded stream: the request is one line.
	body, err := json.Marshal(api.JSApiConsumerUnpinRequest{Group: group})
	if err != nil {
		return err
	}
	rctx, cancel := requestContext(ctx)
	defer cancel()
	m, err := nc.RequestWithContext(rctx, fmt.Sprintf(api.JSApiConsumerUnpinT, stream, consumer), body)
	if err != nil {
		return fmt.Errorf("unpin consumer %s: %w", ref, err)
	}
	var resp api.JSApiConsumerUnpinResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("unpin consumer %s: decode reply: %w", ref, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("unpin consumer %s: %w", ref, resp.Error)
	}
	return nil
}

// guardFresh checks the census, then reads the consumer's placement now:
// a leader that moved, or a replica added since the census, must also be a
// server the census saw at the required version.
func guardFresh(ctx context.Context, nc *nats.Conn, c *Census, op Op, ref ConsumerRef, maxAge time.Duration) (jetstream.JetStream, error) {
	if err := c.Allow(op, ref, maxAge, time.Now()); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open JetStream: %w", err)
	}
	rctx, cancel := requestContext(ctx)
	defer cancel()
	cons, err := js.Consumer(rctx, ref.Stream, ref.Name)
	if err != nil {
		return nil, fmt.Errorf("read placement of consumer %s: %w", ref, err)
	}
	ci := cons.CachedInfo()
	if ci.Cluster == nil {
		return js, nil
	}
	floor, _ := ParseVersion(c.Floor) // Allow parsed it already.
	need := RequiredVersion(op, floor)
	hosts := []string{ci.Cluster.Leader}
	for _, p := range ci.Cluster.Replicas {
		hosts = append(hosts, p.Name)
	}
	var blocking []string
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if s, ok := c.Server(h); !ok || !s.Answered || !versionAtLeast(s.Version, need) {
			blocking = append(blocking, h)
		}
	}
	if ci.Cluster.Leader == "" {
		return nil, &RefusedError{Op: op, Consumer: ref, Servers: blocking, Reason: "the consumer has no leader now"}
	}
	if len(blocking) > 0 {
		sort.Strings(blocking)
		return nil, &RefusedError{Op: op, Consumer: ref, Servers: blocking, Reason: fmt.Sprintf("the consumer's placement changed since the census, onto servers not seen at %s or above", need)}
	}
	return js, nil
}
