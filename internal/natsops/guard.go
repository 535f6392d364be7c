package natsops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

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
	need, err := c.usable(op, ref, maxAge, now)
	if err != nil {
		return err
	}
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

// usable checks what Allow checks before looking at any server: a census
// exists, is younger than maxAge at now (and not from the future), and has
// a floor that parses. It returns the version op needs.
func (c *Census) usable(op Op, ref ConsumerRef, maxAge time.Duration, now time.Time) (Version, error) {
	refuse := func(format string, args ...any) error {
		return &RefusedError{Op: op, Consumer: ref, Reason: fmt.Sprintf(format, args...)}
	}
	if c == nil {
		return Version{}, refuse("no census")
	}
	if age := now.Sub(c.TakenAt); age > maxAge || age < -time.Minute {
		return Version{}, refuse("census taken at %s is %s old, older than %s", c.TakenAt.Format(time.RFC3339), age.Round(time.Millisecond), maxAge)
	}
	floor, err := ParseVersion(c.Floor)
	if err != nil {
		return Version{}, refuse("census floor: %v", err)
	}
	return RequiredVersion(op, floor), nil
}

func versionAtLeast(s string, need Version) bool {
	v, err := ParseVersion(s)
	return err == nil && v.AtLeast(need)
}

// ResetVerdict is a census's verdict on RESET in a form that travels: the
// operator publishes it (through the registry) and a worker checks it, with
// GuardedReset, at the moment it would RESET a consumer. The verdict alone
// is topology-wide and may be minutes old; Servers lets the worker check
// the consumer's hosts as they are then (P4).
type ResetVerdict struct {
	// Allowed says the census met the floor and allowed RESET of every
	// consumer it inspected.
	Allowed bool `json:"allowed"`
	// Floor is the version floor the census judged against.
	Floor string `json:"floor"`
	// TakenAt is the census's TakenAt: when its first reply arrived.
	TakenAt time.Time `json:"takenAt"`
	// Servers maps every server the census listed to its version, "" when
	// it did not answer. A server missing here counts as below the floor.
	Servers map[string]string `json:"servers"`
	// Reason says why RESET is allowed or refused.
	Reason string `json:"reason"`
}

// ResetVerdict is the census's verdict on RESET: allowed when every
// counted server is known and at or above the floor and RESET of every
// inspected consumer is allowed (Allow at the census's own time), with the
// version of every server listed.
func (c *Census) ResetVerdict() ResetVerdict {
	if c == nil {
		return ResetVerdict{Reason: "no census"}
	}
	v := ResetVerdict{Floor: c.Floor, TakenAt: c.TakenAt, Servers: make(map[string]string, len(c.Servers))}
	for _, s := range c.Servers {
		if s.Answered {
			v.Servers[s.Name] = s.Version
		} else {
			v.Servers[s.Name] = ""
		}
	}
	if !c.FloorMet() {
		v.Reason = fmt.Sprintf("servers below the floor %s: %s", c.Floor, strings.Join(c.BelowFloor, ", "))
		if len(c.BelowFloor) == 0 {
			v.Reason = fmt.Sprintf("a server's version is unknown (floor %s)", c.Floor)
		}
		return v
	}
	for _, p := range c.Consumers {
		// The age is the reader's business; judged at TakenAt it is 0.
		if err := c.Allow(OpReset, p.ConsumerRef, time.Hour, c.TakenAt); err != nil {
			v.Reason = err.Error()
			return v
		}
	}
	v.Allowed = true
	counted := 0
	for _, s := range c.Servers {
		if s.Counted {
			counted++
		}
	}
	v.Reason = fmt.Sprintf("%d servers at or above %s", counted, c.Floor)
	return v
}

// census turns the verdict back into a census of one consumer, placed as
// read now, so Census.Allow judges it. Every listed server counts only as
// a possible host: the cluster-wide check is what Allowed records.
func (v ResetVerdict) census(p ConsumerPlacement) *Census {
	c := &Census{TakenAt: v.TakenAt, Floor: v.Floor, Consumers: []ConsumerPlacement{p}}
	for name, ver := range v.Servers {
		s := ServerInfo{Name: name, Version: ver, Role: RoleServer, Answered: ver != "", Counted: true}
		if ver == "" {
			s.Version = UnknownVersion
		}
		c.Servers = append(c.Servers, s)
	}
	sort.Slice(c.Servers, func(i, j int) bool { return c.Servers[i].Name < c.Servers[j].Name })
	return c
}

// GuardedReset issues a RESET of the consumer to its ack floor only when the
// verdict allows it: v.Allowed, v younger than maxAge at now, and the
// consumer's leader and every replica, read from the consumer's info just
// before, listed in v.Servers at or above RequiredVersion(OpReset, floor).
// A server not listed, or listed as not answering, counts as below. A
// refusal is a *RefusedError and issues nothing; otherwise it returns the
// RESET's own error. js must reach the account that owns the stream.
//
// The placement is read here, not taken from the census: a leader that
// moved, or a replica added since, must also be a server the census saw at
// the version RESET needs. This is P4's last line: RESET is a raft
// operation a pre-2.14 replica does not know, and a 2.12 replica panics on.
func GuardedReset(ctx context.Context, js jetstream.JetStream, ref ConsumerRef, v ResetVerdict, maxAge time.Duration, now time.Time) error {
	if !v.Allowed {
		reason := v.Reason
		if reason == "" {
			reason = "the census verdict does not allow it"
		}
		return &RefusedError{Op: OpReset, Consumer: ref, Reason: "census verdict refuses RESET: " + reason}
	}
	// Too old, or a floor that does not parse: refuse before asking the
	// servers anything.
	if _, err := v.census(ConsumerPlacement{}).usable(OpReset, ref, maxAge, now); err != nil {
		return err
	}
	p, err := currentPlacement(ctx, js, ref)
	if err != nil {
		return err
	}
	if err := v.census(p).Allow(OpReset, ref, maxAge, now); err != nil {
		return err
	}
	rctx, cancel := requestContext(ctx)
	defer cancel()
	if _, err := js.ResetConsumer(rctx, ref.Stream, ref.Name); err != nil {
		return fmt.Errorf("reset consumer %s: %w", ref, err)
	}
	return nil
}

// currentPlacement reads the consumer's leader and replicas now.
func currentPlacement(ctx context.Context, js jetstream.JetStream, ref ConsumerRef) (ConsumerPlacement, error) {
	rctx, cancel := requestContext(ctx)
	defer cancel()
	cons, err := js.Consumer(rctx, ref.Stream, ref.Name)
	if err != nil {
		return ConsumerPlacement{}, fmt.Errorf("read placement of consumer %s: %w", ref, err)
	}
	p := ConsumerPlacement{ConsumerRef: ref, Found: true}
	if cl := cons.CachedInfo().Cluster; cl != nil {
		// A server without clustering names itself as the leader; no
		// cluster info at all leaves no leader, which refuses.
		p.Leader = cl.Leader
		for _, r := range cl.Replicas {
			if r.Name != "" && r.Name != p.Leader && !slices.Contains(p.Replicas, r.Name) {
				p.Replicas = append(p.Replicas, r.Name)
			}
		}
		sort.Strings(p.Replicas)
	}
	return p, nil
}
