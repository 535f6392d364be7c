package sim

import (
	"flag"
	"testing"
)

var seedFlag = flag.Int64("seed", -1, "run only this seed, with its trace")

func TestSimOneSeed(t *testing.T) {
	seed := *seedFlag
	if seed < 0 {
		seed = 1
	}
	r := Run(Config{Seed: seed, Trace: true})
	for _, l := range r.Trace {
		t.Log(l)
	}
	t.Logf("events %d injected %v enabled %v", r.Events, r.Injected, r.Enabled)
	for _, v := range r.Violations {
		t.Error(v)
	}
}

func TestSimSweepProbe(t *testing.T) {
	s := Sweep{From: 0, Count: 2000}.Run()
	t.Log(s.String())
}
