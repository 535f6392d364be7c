package worker

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the worker's Prometheus series, all prefixed
// shardkeeper_worker_.
type metrics struct {
	unitsHeld     prometheus.Gauge
	fenced        prometheus.Gauge
	fences        prometheus.Counter
	fencedSeconds prometheus.Counter
	joins         prometheus.Counter
	renewFailures prometheus.Counter
	rowsSettled   *prometheus.CounterVec
	// settled holds rowsSettled's child per Settlement, looked up once:
	// hashing the label on every row is a per-row cost plain consumers
	// do not pay.
	settled      [Abandon + 1]prometheus.Counter
	rowsWithheld prometheus.Counter
	rowsHeld     prometheus.Counter
	drainNaks    prometheus.Counter
	pendingRows  prometheus.Gauge
	redeliveries prometheus.Counter
	takeovers    *prometheus.CounterVec
	fetchErrors  *prometheus.CounterVec
	// fetchErrs holds fetchErrors' child per reason, looked up once.
	fetchErrs       map[string]prometheus.Counter
	handoverSeconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		unitsHeld: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardkeeper_worker_units_held",
			Help: "Units this member holds a claim on."}),
		fenced: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardkeeper_worker_fenced",
			Help: "1 while the member is fenced and delivers nothing."}),
		fences: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_fences_total",
			Help: "Times the member fenced itself."}),
		fencedSeconds: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_fenced_seconds_total",
			Help: "Seconds spent fenced after having held a lease."}),
		joins: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_joins_total",
			Help: "Incarnations started (the first join and every rejoin)."}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_renew_failures_total",
			Help: "Lease renewals that failed without losing the lease."}),
		rowsSettled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardkeeper_worker_rows_settled_total",
			Help: "Rows settled, by settlement (ack, nak, term, abandon)."}, []string{"settlement"}),
		rowsWithheld: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_rows_withheld_total",
			Help: "Rows neither delivered nor settled because the claim was lost or the member fenced."}),
		rowsHeld: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_rows_held_total",
			Help: "Rows of moved keys the order barrier held back until their old unit drained (spec.rollout.ordering PerKey)."}),
		drainNaks: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_drain_timeout_naks_total",
			Help: "Rows nak'd unhandled, for the next owner, because a handover's drain timed out."}),
		pendingRows: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardkeeper_worker_pending_rows",
			Help: "Rows waiting in the consumers of the units this member pulls, as NATS reported with each unit's latest delivery (0 after a pull that brought none): the member's lag."}),
		redeliveries: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardkeeper_worker_redeliveries_total",
			Help: "Rows NATS delivered more than once (reset by a consumer RESET)."}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardkeeper_worker_takeovers_total",
			Help: "Units taken over from a dead, fenced or earlier process, by outcome: reset (unacked rows back at once) or ackwait (they return after ack wait), with the reason RESET was not used (no_census, refused, reset_failed)."}, []string{"outcome", "reason"}),
		fetchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardkeeper_worker_fetch_errors_total",
			Help: "Failed pulls of held units, by reason: consumer_missing (the unit's consumer does not exist), pinned (another client holds the consumer's pin), lookup (the consumer could not be read), fetch (any other failed pull)."},
			[]string{"reason"}),
		handoverSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardkeeper_worker_handover_seconds",
			Help:    "Time from the decision to hand a unit over to its release.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
	}
	m.fenced.Set(1) // until the first lease
	m.fetchErrs = map[string]prometheus.Counter{}
	for _, r := range fetchErrorReasons {
		m.fetchErrs[r] = m.fetchErrors.WithLabelValues(r)
	}
	for v := Ack; v <= Abandon; v++ {
		m.settled[v] = m.rowsSettled.WithLabelValues(v.String())
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.unitsHeld, m.fenced, m.fences, m.fencedSeconds, m.joins, m.renewFailures, m.rowsSettled,
		m.rowsWithheld, m.rowsHeld, m.drainNaks, m.pendingRows, m.redeliveries, m.takeovers, m.fetchErrors, m.handoverSeconds} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("%w: Metrics: a worker's metrics are already registered there", ErrBadOption)
			}
			return nil, fmt.Errorf("register worker metrics: %w", err)
		}
	}
	return m, nil
}

// settledCounter is rowsSettled's child for v; a value outside the
// Settlement constants counts as abandon, as settle treats it.
func (m *metrics) settledCounter(v Settlement) prometheus.Counter {
	return m.settled[v.known()]
}
