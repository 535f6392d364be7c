package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// capture runs the command line with stdout and stderr sent to buffers.
func capture(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	oldOut, oldErr := stdout, stderr
	stdout, stderr = &out, &errOut
	t.Cleanup(func() { stdout, stderr = oldOut, oldErr })
	err := dispatch(args)
	return out.String(), err
}

func TestPlanTableShowsMembersAndSteps(t *testing.T) {
	out, err := capture(t, "plan", "--partitions", "4", "--shards", "8", "--to-shards", "16", "--members", "4")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Change 4x8 -> 4x16 (epoch 1 -> 2) over 4 members: 32 units kept (29 stay put, 3 move), 32 added, 0 retired.",
		"worker-3", "total      32       64",
		"1. Freeze epoch 1", "3. HandOver epoch 2", "3 units: 1.3 worker-1->worker-0",
		"5. Retire epoch 2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPlanJSONIsThePlan(t *testing.T) {
	out, err := capture(t, "plan", "--partitions", "2", "--shards", "4", "--to-shards", "2", "--members", "3", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var p ownership.Plan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	if p.Kind != ownership.KindTopologyChange || len(p.Steps) != 5 || p.Totals().Retired != 4 {
		t.Fatalf("plan %+v", p)
	}
}

func TestCommandLineErrors(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		usage bool
	}{
		{"no subcommand", nil, true},
		{"unknown subcommand", []string{"deploy"}, true},
		{"missing required flag", []string{"plan", "--partitions", "4"}, true},
		{"bad output format", []string{"plan", "--partitions", "4", "--shards", "4", "--members", "2", "-o", "yaml"}, true},
		{"stray argument", []string{"plan", "--partitions", "4", "--shards", "4", "--members", "2", "now"}, true},
		{"topology over the limits", []string{"plan", "--partitions", "4096", "--shards", "4", "--members", "2"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := capture(t, tt.args...)
			if err == nil || errors.Is(err, errUsage) != tt.usage {
				t.Fatalf("error %v, want usage error %t", err, tt.usage)
			}
		})
	}
}

func TestHelpIsNotAnError(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"plan", "-h"}} {
		if _, err := capture(t, args...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
}
