package main

import "math"

// Row c's stopping rule (issue 23): rounds go on until the 95% interval of
// the SDK/plain ratio is narrower than +/- intervalGoal, or maxRounds ran.
// The interval is Student's t on the mean of the rounds' log ratios (a
// ratio's noise is multiplicative: a round at half speed and one at double
// speed cancel), so it is the geometric mean's and never goes below zero.
// At least minRounds run: three rounds once agreed within +/-3% on a
// low streak (0.947, 0.933, 0.929) of a busy minute, and stopped there.
const (
	minRounds    = 5
	intervalGoal = 0.03
)

// t975 is Student's t distribution's 97.5% quantile for 1..14 degrees of
// freedom (two-sided 95%), enough for 15 rounds.
var t975 = [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145}

// ratioInterval is the geometric mean of ratios and its 95% interval; ok
// is false with fewer than two ratios or more than t975 covers.
func ratioInterval(ratios []float64) (mean, lo, hi float64, ok bool) {
	n := len(ratios)
	if n < 2 || n-1 > len(t975) {
		return 0, 0, 0, false
	}
	var sum float64
	logs := make([]float64, n)
	for i, r := range ratios {
		logs[i] = math.Log(r)
		sum += logs[i]
	}
	m := sum / float64(n)
	var ss float64
	for _, l := range logs {
		ss += (l - m) * (l - m)
	}
	half := t975[n-2] * math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	return math.Exp(m), math.Exp(m - half), math.Exp(m + half), true
}

// narrowEnough reports whether the interval is within +/- intervalGoal of
// its mean.
func narrowEnough(mean, lo, hi float64) bool {
	return hi/mean-1 <= intervalGoal && 1-lo/mean <= intervalGoal
}
