package poolctl

import (
	"fmt"
	"time"
)

// activityReport is a validated activity report as both backends write
// it: ages in microseconds (PostgreSQL's resolution), -1 for "never".
type activityReport struct {
	units                                    []string
	epochs, sinceFetch, sinceRows, sincePull []int64
}

// activityRows validates a report: canonical unit names, each at most
// once (a report is one member's view of each unit it holds).
func activityRows(units []UnitActivity) (activityReport, error) {
	r := activityReport{units: []string{}, epochs: []int64{}, sinceFetch: []int64{}, sinceRows: []int64{}, sincePull: []int64{}}
	seen := map[string]bool{}
	for _, u := range units {
		if _, _, err := parseUnit(u.Unit); err != nil {
			return activityReport{}, err
		}
		if seen[u.Unit] {
			return activityReport{}, fmt.Errorf("unit %s reported twice: %w", u.Unit, ErrInvalid)
		}
		seen[u.Unit] = true
		r.units, r.epochs = append(r.units, u.Unit), append(r.epochs, u.Epoch)
		r.sinceFetch, r.sinceRows = append(r.sinceFetch, ageMicros(u.SinceFetch)), append(r.sinceRows, ageMicros(u.SinceRows))
		r.sincePull = append(r.sincePull, ageMicros(u.SincePullStart))
	}
	return r, nil
}

// ageMicros is an age in microseconds, -1 for a negative one (never).
func ageMicros(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Microseconds()
}

// agoOrZero is the time an age in microseconds before now, zero for never.
func agoOrZero(now time.Time, micros int64) time.Time {
	if micros < 0 {
		return time.Time{}
	}
	return now.Add(-time.Duration(micros) * time.Microsecond)
}
