package controllers

import (
	"errors"
	"time"
)

// registryRetry is how soon a reconcile whose registry failed looks again.
// The rate limiter's doubling (up to maxRetryDelay) suits errors nobody is
// waiting on; the registry is the one every worker waits on after a
// failover (they stay fenced until this operator runs Recover), so a
// registry back after an outage must be seen within seconds, not after a
// backoff that grew for as long as the outage lasted.
const registryRetry = time.Second

// afterFirstSight is how soon the pass after the first-sight status write
// runs. That write's echo wakes nothing (notAStatusEcho), so the pass asks
// for its successor itself, at once.
const afterFirstSight = time.Millisecond

// requeueError fails a reconcile pass (its error reaches status as any
// step's does) but asks for the next pass after a set delay instead of the
// rate limiter's growing backoff.
type requeueError struct {
	err   error
	after time.Duration
}

func (e *requeueError) Error() string { return e.err.Error() }
func (e *requeueError) Unwrap() error { return e.err }

// retryAfter wraps err so that the pass it fails runs again after d.
func retryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &requeueError{err: err, after: d}
}

// requeueOf reports the delay a requeueError in err's chain asks for.
func requeueOf(err error) (time.Duration, bool) {
	var re *requeueError
	if errors.As(err, &re) {
		return re.after, true
	}
	return 0, false
}
