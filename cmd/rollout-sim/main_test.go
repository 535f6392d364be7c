package main

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
	"github.com/shardkeeper/shardkeeper/internal/ownership/rolloutsim"
)

var summaryLine = regexp.MustCompile(`(?m)^max multiply-owned: independent=(\d+) sequenced=(\d+); unowned unit-steps: independent=(\d+) sequenced=(\d+)$`)

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// figureLine reads one model's figures over the whole roll.
var figureLine = regexp.MustCompile(`(?m)^independent membership (fixed|live, views stale|live, views fresh) \((.*)\): pulled by two (\d+).*; pulled by nobody (\d+)`)

// TestFixedMembershipPrintsTheFiguresOfEveryModel is the issue's "done
// when" for the fair baseline: for both field cases the fixed-membership
// replay prints the figures over the whole roll of every model, the ones
// the model computes, says which is the baseline's definition, and shows
// sequenced at 0.
// checks P1
func TestFixedMembershipPrintsTheFiguresOfEveryModel(t *testing.T) {
	for _, shards := range [][2]int{{8, 16}, {32, 48}} {
		t.Run(fmt.Sprintf("V %d to %d", shards[0], shards[1]), func(t *testing.T) {
			var out bytes.Buffer
			args := fmt.Sprintf("--membership fixed --partitions 4 --from-shards %d --to-shards %d --members 4", shards[0], shards[1])
			if err := run(strings.Fields(args), &out); err != nil {
				t.Fatal(err)
			}
			s := out.String()
			if !strings.Contains(lastLine(s), "capped rendezvous over a fixed slot set") || !strings.Contains(lastLine(s), "is membership fixed") {
				t.Fatalf("last line %q does not name the model of the definition", lastLine(s))
			}
			if !strings.Contains(s, "\nsequenced: pulled by two 0 ") || !strings.Contains(s, "max multiply-owned: independent=") {
				t.Fatalf("sequenced figures or summary missing:\n%s", s)
			}
			got := figureLine.FindAllStringSubmatch(s, -1)
			if len(got) != 3 {
				t.Fatalf("want figures of three models, got %d:\n%s", len(got), s)
			}
			for _, m := range got {
				want := computedFigures(t, shards[0], shards[1], m[1])
				if m[3] != strconv.Itoa(len(want.DoublePulled)) || m[4] != strconv.Itoa(len(want.PulledByNobody)) {
					t.Fatalf("%s printed %s and %s, the model computes %d and %d", m[1], m[3], m[4], len(want.DoublePulled), len(want.PulledByNobody))
				}
				desc := "not the baseline's definition"
				if m[1] == "fixed" {
					desc = "0..3: the baseline's definition"
				}
				if !strings.HasSuffix(m[2], desc) {
					t.Fatalf("model %s described as %q", m[1], m[2])
				}
			}
		})
	}
}

// computedFigures replays the field case under the model a figure line
// names.
func computedFigures(t *testing.T, from, to int, model string) rolloutsim.Figures {
	t.Helper()
	sc := rolloutsim.Scenario{From: ownership.Topology{Partitions: 4, Shards: from}, To: ownership.Topology{Partitions: 4, Shards: to}, Members: 4, Membership: rolloutsim.Fixed}
	if v, ok := strings.CutPrefix(model, "live, views "); ok {
		sc.Membership, sc.Views = rolloutsim.Live, rolloutsim.Views(v)
	}
	r, err := rolloutsim.Independent(sc)
	if err != nil {
		t.Fatal(err)
	}
	return r.Figures()
}

// TestLiveStaleViewsDoublePull is the earlier criterion, on the model it was
// written for: with live membership and stale views the field case prints
// the per-step table, sequenced at 0 and independent above.
func TestLiveStaleViewsDoublePull(t *testing.T) {
	var out bytes.Buffer
	if err := run(strings.Fields("--membership live --views stale --partitions 4 --from-shards 8 --to-shards 16 --members 4"), &out); err != nil {
		t.Fatal(err)
	}
	m := summaryLine.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no summary line in\n%s", out.String())
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
	for _, args := range []string{"--members 0", "--order 1,1,2,3", "--views psychic", "--membership elastic", "--sweep --membership elastic", "--from-shards 2000", "extra"} {
		var out bytes.Buffer
		if err := run(strings.Fields(args), &out); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
