package main

import (
	"math"
	"testing"
	"time"
)

// The reconcile p99 of row e is read from controller-runtime's histogram
// the way Prometheus's histogram_quantile reads it.
func TestQuantileInterpolatesWithinTheBucket(t *testing.T) {
	h := histogram{bounds: []float64{0.1, 0.2, 0.5, math.Inf(1)},
		counts: map[float64]float64{0.1: 50, 0.2: 90, 0.5: 100, math.Inf(1): 100}, count: 100}
	tests := []struct {
		q    float64
		want time.Duration
		over bool
	}{
		{0.5, 100 * time.Millisecond, false},
		{0.7, 150 * time.Millisecond, false},
		{0.99, 470 * time.Millisecond, false},
	}
	for _, tt := range tests {
		got, over := h.quantile(tt.q)
		if over != tt.over || (got-tt.want).Abs() > time.Millisecond {
			t.Errorf("quantile(%v) = %v (over %v), want %v", tt.q, got, over, tt.want)
		}
	}
	h.counts[0.5], h.counts[math.Inf(1)], h.count = 95, 100, 100
	if got, over := h.quantile(0.99); !over || got != 500*time.Millisecond {
		t.Errorf("a quantile in the +Inf bucket = %v (over %v), want the last bound, flagged", got, over)
	}
}

func TestReconcileHistogramLinesParse(t *testing.T) {
	le, n, err := parseBucket(`controller_runtime_reconcile_time_seconds_bucket{controller="shardtopology",le="0.25"} 17`)
	if err != nil || le != 0.25 || n != 17 {
		t.Fatalf("parseBucket = %v, %v, %v", le, n, err)
	}
	le, _, err = parseBucket(`controller_runtime_reconcile_time_seconds_bucket{controller="shardtopology",le="+Inf"} 17`)
	if err != nil || !math.IsInf(le, 1) {
		t.Fatalf("+Inf bucket: %v, %v", le, err)
	}
	line := `shardkeeper_reconcile_step_duration_seconds_bucket{step="Census",le="0.5"} 3`
	if got := labelValue(line, "step"); got != "Census" {
		t.Errorf("labelValue(step) = %q, want Census", got)
	}
	if got := labelValue(line, "controller"); got != "" {
		t.Errorf("labelValue of an absent label = %q, want empty", got)
	}
}

func TestHistogramDeltaCountsOnlyTheWindow(t *testing.T) {
	before := histogram{bounds: []float64{0.1, math.Inf(1)}, counts: map[float64]float64{0.1: 5, math.Inf(1): 8}, count: 8}
	after := histogram{bounds: []float64{0.1, math.Inf(1)}, counts: map[float64]float64{0.1: 15, math.Inf(1): 18}, count: 18}
	d := after.minus(before)
	if d.count != 10 || d.counts[0.1] != 10 {
		t.Fatalf("delta %+v", d)
	}
}

// Two runs' windows pooled: one slow reconcile among 120 is past p99's
// rank, where in its own run of 60 it set the p99.
func TestPooledRunsPlaceOneSlowReconcileBeyondTheP99(t *testing.T) {
	bounds := []float64{0.1, 0.2, 0.25, math.Inf(1)}
	quiet := histogram{bounds: bounds, counts: map[float64]float64{0.1: 55, 0.2: 60, 0.25: 60, math.Inf(1): 60}, count: 60}
	stalled := histogram{bounds: bounds, counts: map[float64]float64{0.1: 55, 0.2: 59, 0.25: 60, math.Inf(1): 60}, count: 60}
	if own, _ := stalled.quantile(0.99); own <= 200*time.Millisecond {
		t.Fatalf("the stalled run's own p99 %v, want past 200ms", own)
	}
	pooled := histogram{}.plus(quiet).plus(stalled)
	if pooled.count != 120 || pooled.counts[0.2] != 119 {
		t.Fatalf("pooled %+v", pooled)
	}
	if got, over := pooled.quantile(0.99); over || got > 200*time.Millisecond {
		t.Fatalf("pooled p99 %v (over %v), want within 200ms", got, over)
	}
}

func TestTheRatioIntervalNarrowsWithAgreeingRoundsAndIsGeometric(t *testing.T) {
	if _, _, _, ok := ratioInterval([]float64{1}); ok {
		t.Fatal("an interval from one round")
	}
	mean, lo, hi, ok := ratioInterval([]float64{0.5, 2})
	if !ok || math.Abs(mean-1) > 1e-9 || lo >= 1 || hi <= 1 || math.Abs(lo*hi-1) > 1e-9 {
		t.Fatalf("0.5 and 2: mean %v, interval [%v, %v]; want geometric mean 1, symmetric in log", mean, lo, hi)
	}
	wide := []float64{0.90, 1.00, 0.95}
	_, lo1, hi1, _ := ratioInterval(wide)
	tight := []float64{0.96, 0.97, 0.96, 0.97, 0.965, 0.965}
	m2, lo2, hi2, _ := ratioInterval(tight)
	if hi2-lo2 >= hi1-lo1 || !narrowEnough(m2, lo2, hi2) {
		t.Fatalf("agreeing rounds [%v, %v] not narrower than scattered ones [%v, %v], or not within 3%%", lo2, hi2, lo1, hi1)
	}
	if m, lo, hi, _ := ratioInterval(wide); narrowEnough(m, lo, hi) {
		t.Fatalf("0.90, 1.00, 0.95 judged narrow enough: [%v, %v]", lo, hi)
	}
}

// Row e2's first round starts with the operator that watches every
// topology, so each consumer exists before the baseline (10 of them) runs
// beside them; later rounds alternate.
func TestTheRowThatProvisionsEverythingRunsFirstThenRoundsAlternate(t *testing.T) {
	for _, sh := range []opShape{shapeE, shapeE2} {
		first := roundOrder(sh, 0)
		if first[0].name != sh.variants[sh.provisionFirst].name || first[0].watchesOnly != "" {
			t.Errorf("row %s: round 0 starts with %q, want the variant that watches every namespace", sh.row, first[0].name)
		}
		second := roundOrder(sh, 1)
		if second[0].name != first[len(first)-1].name || len(second) != len(sh.variants) {
			t.Errorf("row %s: round 1 is %v, want round 0 (%v) reversed", sh.row, second, first)
		}
	}
	inBase := 0
	for i := range shapeE2.topologies {
		if shapeE2.namespaceOf(i) == shapeE2.variants[0].watchesOnly {
			inBase++
		}
	}
	if inBase != shapeE2.watched {
		t.Errorf("row e2's baseline watches %d topologies, want %d", inBase, shapeE2.watched)
	}
}

// Row c's pairs take turns at which side drains first, and over two
// rounds each side goes first as often, so a drift in the machine's load
// or the stream's state after a publish weighs on both sides alike.
func TestRowCPairsTakeTurnsAtWhichSideDrainsFirst(t *testing.T) {
	first := 0
	for i := range 2 {
		for k := range pairsPerRound {
			if k > 0 && sdkFirst(i, k) == sdkFirst(i, k-1) {
				t.Errorf("round %d: pairs %d and %d start with the same side", i, k-1, k)
			}
			if sdkFirst(i, k) {
				first++
			}
		}
	}
	if first != pairsPerRound {
		t.Errorf("over two rounds the SDK went first in %d of %d pairs, want half", first, 2*pairsPerRound)
	}
}
