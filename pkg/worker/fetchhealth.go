package worker

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A held unit whose pulls keep failing delivers nothing while the worker
// otherwise looks healthy (lease renewed, not fenced). Its failures are
// counted (shardkeeper_worker_fetch_errors_total), logged at the default
// level at a bounded rate, and turn Ready false once they have lasted
// FetchFailureBound without a successful pull in between.

// Reasons of shardkeeper_worker_fetch_errors_total: a fixed set, so the
// series stay few whatever the unit count.
const (
	fetchConsumerMissing = "consumer_missing"
	fetchPinned          = "pinned"
	fetchLookup          = "lookup"
	fetchUnpin           = "unpin"
	fetchOther           = "fetch"
)

var fetchErrorReasons = []string{fetchConsumerMissing, fetchPinned, fetchLookup, fetchUnpin, fetchOther}

// pullStep is the request of a puller's that failed: the UNPIN before
// its first pull, the consumer's lookup, or a pull.
type pullStep int

const (
	stepPull pullStep = iota
	stepLookup
	stepUnpin
)

// failedStep names a pullStep's failure in the log and its counter
// reason when the consumer is there.
var failedStep = map[pullStep]struct{ msg, reason string }{
	stepPull:   {"Fetch failed", fetchOther},
	stepLookup: {"Consumer lookup failed", fetchLookup},
	stepUnpin:  {"UNPIN before the first pull failed", fetchUnpin},
}

const (
	// fetchLogEvery bounds a failing unit's log lines at the default
	// level to one per this interval: a deleted consumer fails every
	// pull (every 2s at the backoff's cap), for as long as it is gone.
	fetchLogEvery = 30 * time.Second
	// fetchQuietFor is how long a run of failures other than a missing
	// consumer stays at V(1): a pin another client still holds, or a
	// leader election, passes within it during an ordinary handover.
	fetchQuietFor = 5 * time.Second
)

// fetchErrorReason names err of step for the counter.
func fetchErrorReason(err error, step pullStep) string {
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrConsumerDeleted),
		errors.Is(err, jetstream.ErrConsumerDoesNotExist), errors.Is(err, nats.ErrNoResponders):
		return fetchConsumerMissing
	case errors.Is(err, jetstream.ErrPinIDMismatch):
		return fetchPinned
	}
	return failedStep[step].reason
}

// fetchFailed counts and (rate-limited) logs one failed UNPIN, lookup or
// pull, and starts the failing run Ready judges. It reports whether the
// consumer handle should be looked up again (the consumer is gone, and
// may come back).
func (p *puller) fetchFailed(err error, step pullStep) (relookup bool) {
	reason := fetchErrorReason(err, step)
	p.w.metrics.fetchErrs[reason].Inc()
	now := sinceStart()
	if p.failingSince.Load() == 0 {
		p.failingSince.Store(int64(now))
		p.failures = 0
		p.loggedAt = 0
		p.w.failing.Store(p.id, p)
	}
	p.failures++
	p.lastReason.Store(&reason)
	failingFor := now - time.Duration(p.failingSince.Load())
	msg := failedStep[step].msg
	loud := reason == fetchConsumerMissing || failingFor >= fetchQuietFor
	if loud && (p.loggedAt == 0 || now-p.loggedAt >= fetchLogEvery) {
		p.loggedAt = now
		p.w.log.Info(msg, "unit", p.unit.String(), "consumer", p.ref.Name, "stream", p.ref.Stream, "reason", reason,
			"failures", p.failures, "failingFor", failingFor.Round(time.Millisecond).String(), "error", err.Error())
	} else {
		p.w.log.V(1).Info(msg, "unit", p.unit.String(), "reason", reason, "error", err.Error())
	}
	return reason == fetchConsumerMissing
}

// fetchOK ends a failing run at a successful pull.
func (p *puller) fetchOK() {
	since := p.failingSince.Load()
	if since == 0 {
		return
	}
	p.endFailing()
	if p.loggedAt != 0 {
		p.w.log.Info("Fetch recovered", "unit", p.unit.String(), "failures", p.failures,
			"failedFor", (sinceStart() - time.Duration(since)).Round(time.Millisecond).String())
	}
}

// endFailing forgets the puller's failing run (a pull succeeded, or the
// puller stopped).
func (p *puller) endFailing() {
	p.failingSince.Store(0)
	p.w.failing.Delete(p.id)
}

// Readiness returns nil when the worker is ready: it holds a lease, is
// not fenced, and no unit it delivers has failed every pull for longer
// than FetchFailureBound. Otherwise the error says why, naming the units.
func (w *Worker) Readiness() error {
	p := w.perm.Load()
	now := sinceStart()
	switch {
	case p == nil || !p.Lease:
		return errors.New("no lease")
	case p.FencedAt(now):
		return errors.New("fenced")
	}
	var stuck []string
	w.failing.Range(func(_, v any) bool {
		pl := v.(*puller)
		since := pl.failingSince.Load()
		if since == 0 || now-time.Duration(since) <= w.opts.FetchFailureBound {
			return true
		}
		// Only a unit still delivered under the puller's own token: a
		// puller the core is stopping is not the unit's health.
		if tok, ok := p.Units[pl.unit]; !ok || tok != pl.token {
			return true
		}
		reason := ""
		if r := pl.lastReason.Load(); r != nil {
			reason = *r
		}
		stuck = append(stuck, fmt.Sprintf("%s (%s for %s)", pl.unit, reason,
			(now-time.Duration(since)).Round(time.Second)))
		return true
	})
	if len(stuck) > 0 {
		sort.Strings(stuck)
		return fmt.Errorf("every pull failed for longer than %s: %v", w.opts.FetchFailureBound, stuck)
	}
	return nil
}
