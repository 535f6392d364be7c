package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

var summaryLine = regexp.MustCompile(`^max multiply-owned: independent=(\d+) sequenced=(\d+); unowned unit-steps: independent=(\d+) sequenced=(\d+)$`)

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// TestDoneCriterion is the "done when": the field case prints the
// per-step table and the summary line, sequenced at 0 and independent above.
func TestDoneCriterion(t *testing.T) {
	var out bytes.Buffer
	if err := run(strings.Fields("--partitions 4 --from-shards 8 --to-shards 16 --members 4"), &out); err != nil {
		t.Fatal(err)
	}
	m := summaryLine.FindStringSubmatch(lastLine(out.String()))
	if m == nil {
		t.Fatalf("last line %q is not the summary", lastLine(out.String()))
	}
	if m[2] != "0" || m[1] == "0" {
		t.Fatalf("summary %q: want sequenced=0 and independent above 0", m[0])
	}
	if !strings.Contains(out.String(), "stop w-3") || !strings.Contains(out.String(), "HandOver e2 (3)") {
		t.Fatalf("table lacks steps:\n%s", out.String())
	}
}

func TestSweepCoversTwoHundredCases(t *testing.T) {
	var out bytes.Buffer
	if err := run(strings.Fields("--sweep --cases 200"), &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "sweep: 200 cases") || !strings.Contains(s, "sequenced:   multiply-owned in 0/200 cases (max 0), promise violations 0") {
		t.Fatalf("sweep output:\n%s", s)
	}
	if m := summaryLine.FindStringSubmatch(lastLine(s)); m == nil || m[2] != "0" {
		t.Fatalf("last line %q", lastLine(s))
	}
}

func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range []string{"--members 0", "--order 1,1,2,3", "--views psychic", "--from-shards 2000", "extra"} {
		var out bytes.Buffer
		if err := run(strings.Fields(args), &out); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
