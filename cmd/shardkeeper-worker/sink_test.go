package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The delay file's waits end when the file is removed, not when the
// duration read at the write's start passes: chaos tests keep rows in
// flight until a signal lands, then let the handlers run on.
func TestRemovingTheDelayFileEndsTheWritesWaits(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sink.delay")
	if err := os.WriteFile(file, []byte("1h"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &sink{delayFile: file}
	done := make(chan bool, 1)
	go func() { done <- s.wait(context.Background()) }()
	select {
	case <-done:
		t.Fatal("the write went on while the delay file held an hour")
	case <-time.After(3 * fileDelayPoll):
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("wait reported a cancelled context")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write still waited 30s after the delay file was removed")
	}
}

// A cancelled context ends the wait and says so (the write naks).
func TestACancelledWriteStopsWaiting(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sink.delay")
	if err := os.WriteFile(file, []byte("1h"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &sink{delayFile: file}
	done := make(chan bool, 1)
	go func() { done <- s.wait(ctx) }()
	cancel()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("wait reported its delay passed after the context was cancelled")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write still waited 30s after its context was cancelled")
	}
}
