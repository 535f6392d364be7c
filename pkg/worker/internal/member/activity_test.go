package member

import (
	"testing"
	"time"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// The activity report carries each pulled unit's pull window: the claim
// epoch its puller pulls under and the time since that puller started
// (issue 21: the operator counts a unit as multiply owned only when two
// tokens' windows overlap). A unit being handed over is not reported, and
// a unit re-claimed under a new token reports the new puller's window.
// checks P1
func TestActivityReportCarriesThePullWindow(t *testing.T) {
	h := newHarness(t)
	err := h.run(func(h *harness) {
		h.holding(1) // 0.0 at epoch 1, its puller started now
		var id PullerID
		for p := range h.running {
			id = p
		}
		h.advance(time.Second)
		h.step(PullerFetched{Unit: unitOf("0.0"), Puller: id, Rows: 2})
		h.advance(2 * time.Second)
		h.step(Timer{})
		h.renewOK()
		r := take[ReportActivity](h)
		want := poolctl.UnitActivity{Unit: "0.0", Epoch: 1, SinceFetch: 2 * time.Second, SinceRows: 2 * time.Second,
			SincePullStart: 3 * time.Second}
		if len(r.Units) != 1 || r.Units[0] != want {
			h.fail("report %+v, want %+v", r.Units, want)
		}
		h.step(ActivityReply{Req: r.Req})

		// Drained for a handover: the unit is no longer reported.
		h.tick(snapshot(1, 1, true, 0))
		take[DrainPuller](h)
		h.advance(3 * time.Second)
		h.step(Timer{})
		h.renewOK()
		if r := take[ReportActivity](h); len(r.Units) != 0 {
			h.fail("a unit being handed over is reported: %+v", r.Units)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}
