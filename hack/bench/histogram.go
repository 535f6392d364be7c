package main

import (
	"bufio"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// histogram is one Prometheus histogram as scraped: cumulative counts by
// upper bound, and the sum of the observations.
type histogram struct {
	bounds []float64 // sorted, +Inf last
	counts map[float64]float64
	count  float64
	sum    float64
}

// reconcileHistogram scrapes the operator's controller_runtime_reconcile_
// time_seconds for the ShardTopology controller.
func (p *operatorProc) reconcileHistogram() (histogram, error) {
	hs, err := p.histograms("controller_runtime_reconcile_time_seconds", "controller")
	if err != nil {
		return histogram{}, err
	}
	h, ok := hs["shardtopology"]
	if !ok {
		return histogram{}, fmt.Errorf("no controller_runtime_reconcile_time_seconds for the shardtopology controller")
	}
	return h, nil
}

// stepHistograms scrapes the operator's shardkeeper_reconcile_step_
// duration_seconds, by step.
func (p *operatorProc) stepHistograms() (map[string]histogram, error) {
	return p.histograms("shardkeeper_reconcile_step_duration_seconds", "step")
}

// histograms scrapes the histogram name from the operator's /metrics, one
// per value of the label by.
func (p *operatorProc) histograms(name, by string) (map[string]histogram, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + p.metricsAddr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape the operator's metrics: %w", err)
	}
	defer resp.Body.Close()
	hs := map[string]histogram{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	prefix, sumPrefix := name+"_bucket{", name+"_sum{"
	for sc.Scan() {
		l := sc.Text()
		isSum := strings.HasPrefix(l, sumPrefix)
		if !isSum && !strings.HasPrefix(l, prefix) {
			continue
		}
		key := labelValue(l, by)
		h, ok := hs[key]
		if !ok {
			h = histogram{counts: map[float64]float64{}}
		}
		if isSum {
			fields := strings.Fields(l)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if err != nil {
				return nil, fmt.Errorf("parse %q: %w", l, err)
			}
			h.sum = v
		} else {
			le, n, err := parseBucket(l)
			if err != nil {
				return nil, err
			}
			h.counts[le] = n
			h.bounds = append(h.bounds, le)
		}
		hs[key] = h
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for k, h := range hs {
		sort.Float64s(h.bounds)
		h.count = h.counts[math.Inf(1)]
		hs[k] = h
	}
	return hs, nil
}

// labelValue reads label's value from a series line, "" when absent.
func labelValue(line, label string) string {
	_, rest, ok := strings.Cut(line, label+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// parseBucket reads `..._bucket{controller="x",le="0.2"} 12`.
func parseBucket(line string) (le, n float64, err error) {
	_, rest, ok := strings.Cut(line, `le="`)
	if !ok {
		return 0, 0, fmt.Errorf("bucket without le: %q", line)
	}
	bound, rest, _ := strings.Cut(rest, `"`)
	if le, err = strconv.ParseFloat(bound, 64); err != nil {
		return 0, 0, err
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return 0, 0, fmt.Errorf("bucket without value: %q", line)
	}
	n, err = strconv.ParseFloat(fields[len(fields)-1], 64)
	return le, n, err
}

// minus is h's observations since earlier.
func (h histogram) minus(earlier histogram) histogram {
	d := histogram{bounds: h.bounds, counts: map[float64]float64{}, count: h.count - earlier.count, sum: h.sum - earlier.sum}
	for _, b := range h.bounds {
		d.counts[b] = h.counts[b] - earlier.counts[b]
	}
	return d
}

// plus is the observations of h and other together (the same buckets;
// the zero histogram adds nothing).
func (h histogram) plus(other histogram) histogram {
	if h.counts == nil {
		return other
	}
	sum := histogram{bounds: h.bounds, counts: map[float64]float64{}, count: h.count + other.count, sum: h.sum + other.sum}
	for _, b := range h.bounds {
		sum.counts[b] = h.counts[b] + other.counts[b]
	}
	return sum
}

// quantile interpolates linearly within the bucket holding q, as
// Prometheus's histogram_quantile does. over reports a quantile in the
// +Inf bucket, where the last finite bound is returned.
func (h histogram) quantile(q float64) (d time.Duration, over bool) {
	if h.count == 0 {
		return 0, false
	}
	target := q * h.count
	prevBound, prevCount := 0.0, 0.0
	for _, b := range h.bounds {
		c := h.counts[b]
		if c >= target {
			if math.IsInf(b, 1) {
				return seconds(prevBound), true
			}
			frac := 1.0
			if c > prevCount {
				frac = (target - prevCount) / (c - prevCount)
			}
			return seconds(prevBound + (b-prevBound)*frac), false
		}
		prevBound, prevCount = b, c
	}
	return seconds(prevBound), true
}

// mean is the observations' mean, from their sum: exact where a
// quantile is interpolated within a bucket.
func (h histogram) mean() time.Duration {
	if h.count == 0 {
		return 0
	}
	return seconds(h.sum / h.count)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
