package controllers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Fencing between operator leaders (issue 21; design.md section 8).
//
// Replicas elect a leader with a Lease, but a leader paused past its lease
// (a long GC, a frozen node, a partition) resumes believing it leads until
// its next renewal fails, and may write what it decided from a reading
// that is no longer true. So the process takes an operator token in each
// topology's registry when it first opens it (Connections.Registry), and
// every registry write of the operator goes through a handle bound to it
// (poolctl.PG.AsOperator): once a newer leader took a token, the old one's
// writes are refused (*poolctl.OperatorFencedError), whatever they are.
//
// A process that meets that refusal has been superseded. It never takes a
// token again (two processes that kept taking them would fence each other
// in turn), writes nothing more for the topology (not even status, which
// the new leader owns), and calls OnSuperseded, which the operator's main
// wires to stopping the process: it then starts again as a follower and
// waits for the Lease.
//
// Pod deletes go to the API server, which knows nothing of the token, so
// they are fenced in two parts. The delete is decided on
// Registry.DrainedMember, one fenced transaction that sets the drain
// request and reads what the member holds: a superseded leader is refused
// there and deletes nothing. A leader paused between that check and the
// Delete is bounded by time instead: it sends the Delete only within
// deleteCheckValid of starting the check (after a longer pause it checks
// again), and a new leader lifts no drain request another leader may have
// set until strayDrainHold has passed since it took its token, so the
// drain request the old leader's check relied on still stands when the
// old leader's Delete is sent.

// deleteCheckValid is how long after starting the registry check a pod
// delete may be sent. It covers the check itself (bounded by the registry
// timeout) with room to spare.
func (r *ShardTopologyReconciler) deleteCheckValid() time.Duration {
	return r.registryTimeout() + 5*time.Second
}

// strayDrainHold is how long a new leader leaves drain requests it did not
// set alone after taking its token: twice deleteCheckValid, so that a
// paused predecessor's Delete, sent within deleteCheckValid of a check
// made before the token was taken, finds the drain request still set.
func (r *ShardTopologyReconciler) strayDrainHold() time.Duration {
	return 2 * r.deleteCheckValid()
}

// operatorIdentity is this process's name in operator tokens when
// Connections.Identity is empty.
var operatorIdentity = func() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}()

func (c *Connections) identity() string {
	if c.Identity != "" {
		return c.Identity
	}
	return operatorIdentity
}

// supersededErr returns why this process may no longer write the
// topology's registry, nil while it may.
func (c *Connections) supersededErr(key types.NamespacedName) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.superseded[key]
}

// markSuperseded records that a newer leader took the topology's token.
func (c *Connections) markSuperseded(key types.NamespacedName, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.superseded == nil {
		c.superseded = map[types.NamespacedName]error{}
	}
	if c.superseded[key] == nil {
		c.superseded[key] = err
	}
}

// tokenAge is how long ago this process took the topology's operator
// token; ok is false when it holds none.
func (c *Connections) tokenAge(key types.NamespacedName, now time.Time) (time.Duration, bool) {
	e := c.lookup(key)
	if e == nil {
		return 0, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.opReg == nil {
		return 0, false
	}
	return now.Sub(e.tokenTakenAt), true
}

// superseded reports whether err (or an earlier reconcile) says a newer
// operator leader took the topology's token, and if so records it, says
// so once in the log and an Event, and calls OnSuperseded.
func (r *ShardTopologyReconciler) superseded(ctx context.Context, s *scope, err error) bool {
	if prev := r.conns().supersededErr(s.key); prev != nil {
		return true
	}
	fe, ok := poolctl.OperatorFenced(err)
	if !ok || fe.Lost() {
		// A lost take is the registry's loss, not a newer leader: the
		// reconcile retries and recoverBehindRegistry binds it again.
		return false
	}
	r.conns().markSuperseded(s.key, err)
	log.FromContext(ctx).Error(err, "Another operator leader took this topology's registry token; this process writes nothing more for it",
		"presented", fe.Presented, "current", fe.Current, "holder", fe.Holder)
	r.event(s, "Warning", "OperatorSuperseded", "Fence",
		"operator %s was superseded in the registry by %q (token %d over %d); it stops writing", r.conns().identity(), fe.Holder, fe.Current, fe.Presented)
	if r.OnSuperseded != nil {
		r.OnSuperseded(err)
	}
	return true
}

// drainedMemberReader is the registry's fenced check before a pod delete.
type drainedMemberReader interface {
	DrainedMember(ctx context.Context, topology, member string) (poolctl.Member, error)
}

var errNoDrainedMember = errors.New("the registry cannot check a member under a drain request in one step")

// DrainedMember runs the inner registry's DrainedMember under the bound.
func (b *boundedRegistry) DrainedMember(ctx context.Context, topology, member string) (poolctl.Member, error) {
	d, ok := b.inner.(drainedMemberReader)
	if !ok {
		return poolctl.Member{}, errNoDrainedMember
	}
	return bounded(ctx, b, "DrainedMember", func(c context.Context) (poolctl.Member, error) { return d.DrainedMember(c, topology, member) })
}
