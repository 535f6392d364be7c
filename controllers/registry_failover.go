package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// seqRegistry is a registry that keeps a sequence and can be recovered
// after it went back in time (the PostgreSQL one; issue 22).
type seqRegistry interface {
	CheckSeq(ctx context.Context, topology string) (int64, error)
	Recover(ctx context.Context, topology string, seen poolctl.RecoverFloor, margin int64) (poolctl.Recovered, error)
}

// recoverBehindRegistry checks, every reconcile, that the registry has not
// gone back in time (a failover to a standby that missed commits, or a
// restore). When it has, it waits one renew interval plus the query bound
// from the first sight, so that every live worker has renewed, been
// refused and recorded the highest sequence it saw, and then runs
// Recover: counters move past everything reported, every lease ends, a
// pending epoch is abandoned. The steps after it then run again from the
// recovered state (the rollout creates its epoch again under a new
// number). Until then the reconcile fails: nothing the registry answers
// may be acted on.
func recoverBehindRegistry(ctx context.Context, r *ShardTopologyReconciler, s *scope) error {
	sr, ok := seqRegistryOf(s.reg)
	if !ok {
		return nil
	}
	key := s.registryKey()
	_, err := sr.CheckSeq(ctx, key)
	be, behind := poolctl.RegistryBehind(err)
	switch {
	case err != nil && !behind:
		return retryAfter(fmt.Errorf("check the registry's sequence: %w", err), registryRetry)
	case !behind:
		r.conns().setBehindSince(s.key, time.Time{})
		return nil
	}
	now := r.now()
	since := r.conns().noteBehind(s.key, now)
	// Observe, not Snapshot: a registry behind this client refuses a
	// snapshot (what a worker acts on), and the wait needs its parameters.
	obs, err := s.reg.Observe(ctx, key)
	if err != nil {
		return retryAfter(fmt.Errorf("registry is behind (%v); read its parameters: %w", be, err), registryRetry)
	}
	wait := obs.Snapshot.Params.RenewInterval + obs.Snapshot.Params.QueryBound
	if now.Sub(since) < wait {
		if since.Equal(now) {
			r.event(s, "Warning", "RegistryBehind", "Detect", "%s; recovering once every worker has renewed", be.Error())
		}
		// A set requeue, not the rate limiter's backoff: the fenced
		// workers wait for this Recover.
		left := wait - now.Sub(since)
		return retryAfter(fmt.Errorf("%w; recovering in %v, once every worker has renewed and reported what it saw",
			be, left.Round(time.Millisecond)), left)
	}
	rec, err := sr.Recover(ctx, key, poolctl.RecoverFloor{}, 0)
	if err != nil {
		return retryAfter(fmt.Errorf("recover the registry (%v): %w", be, err), registryRetry)
	}
	log.FromContext(ctx).Info("Registry recovered after going back in time", "lost", rec.Lost,
		"tokenFloor", rec.TokenFloor, "epochFloor", rec.EpochFloor, "seq", rec.Seq)
	r.event(s, "Warning", "RegistryRecovered", "Recover",
		"registry recovered: up to %d transactions lost; tokens from %d, epochs from %d", rec.Lost, rec.TokenFloor, rec.EpochFloor)
	r.conns().setBehindSince(s.key, time.Time{})
	r.conns().setCensusDue(s.key, true)
	return nil
}

// noteBehind records now as when the registry was first found behind,
// unless it already was, and returns that time.
func (c *Connections) noteBehind(key types.NamespacedName, now time.Time) time.Time {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.behindSince.IsZero() {
		e.behindSince = now
	}
	return e.behindSince
}

// setBehindSince sets (zero: clears) when the registry was found behind.
func (c *Connections) setBehindSince(key types.NamespacedName, t time.Time) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.behindSince = t
}

// seqRegistryOf is reg as a seqRegistry, looking through the deadline
// wrapper every reconcile's registry has (boundRegistry): asserting on the
// wrapper itself found nothing, so the operator never checked the sequence
// nor recovered (chaos scenario 14 found it). The calls keep the wrapper's
// deadline.
func seqRegistryOf(reg poolctl.Registry) (seqRegistry, bool) {
	b, ok := reg.(*boundedRegistry)
	if !ok {
		sr, ok := reg.(seqRegistry)
		return sr, ok
	}
	if _, ok := b.inner.(seqRegistry); !ok {
		return nil, false
	}
	return boundedSeq{b}, true
}

// boundedSeq runs the sequence calls of a bounded registry's inner
// registry under its deadline.
type boundedSeq struct{ b *boundedRegistry }

func (s boundedSeq) CheckSeq(ctx context.Context, topology string) (int64, error) {
	return bounded(ctx, s.b, "CheckSeq", func(ctx context.Context) (int64, error) {
		return s.b.inner.(seqRegistry).CheckSeq(ctx, topology)
	})
}

func (s boundedSeq) Recover(ctx context.Context, topology string, seen poolctl.RecoverFloor, margin int64) (poolctl.Recovered, error) {
	return bounded(ctx, s.b, "Recover", func(ctx context.Context) (poolctl.Recovered, error) {
		return s.b.inner.(seqRegistry).Recover(ctx, topology, seen, margin)
	})
}
