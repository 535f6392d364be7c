package main

import (
	"errors"
	"testing"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// A history that fails to close (lost records, a failed close) makes the
// process fail: the checker must never judge a holed history as complete.
func TestClosingTheHistoryReportsItsError(t *testing.T) {
	runErr := errors.New("run failed")
	for _, tc := range []struct {
		name       string
		closeTwice bool
		runErr     error
		want       []error
	}{
		{name: "a clean close keeps the run's result", want: nil},
		{name: "a clean close keeps the run's error", runErr: runErr, want: []error{runErr}},
		{name: "a failed close is the process's error", closeTwice: true},
		{name: "a failed close joins the run's error", closeTwice: true, runErr: runErr, want: []error{runErr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := history.NewFileRecorder(t.TempDir(), "ingest-0")
			if err != nil {
				t.Fatal(err)
			}
			if tc.closeTwice {
				// The second Close fails: the file is already closed.
				if err := rec.Close(); err != nil {
					t.Fatal(err)
				}
			}
			err = tc.runErr
			closeHistory(rec, &err)
			switch {
			case tc.closeTwice && (err == nil || err == tc.runErr):
				t.Fatalf("error %v: the failed close is not in it", err)
			case !tc.closeTwice && err != tc.runErr:
				t.Fatalf("error %v, want the run's %v", err, tc.runErr)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Fatalf("error %v lost %v", err, w)
				}
			}
		})
	}
	var err error
	closeHistory(nil, &err) // no --history-dir
	if err != nil {
		t.Fatalf("closing no history: %v", err)
	}
}
