package historycheck

import (
	"fmt"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// The e2e prints the sequenced fleet next to the independent baseline.
func ExampleSideBySide() {
	sequenced := Check(handover())
	independent := Check(Input{
		NoRegistry: true,
		Processes: []history.Process{
			newProc("a-1-100", "a", 0).deliver("0.0", 0, "r1", 20).ack("0.0", 0, "r1", 22, 40).fetch("0.0", 10, 45, 1).done(),
			newProc("b-2-200", "b", 0).deliver("0.0", 0, "r1", 30).nd(2).ack("0.0", 0, "r1", 32, 33).fetch("0.0", 25, 50, 1).done(),
		},
		Sink:      []SinkWrite{write("r1", "0.0", "a", 0, 21), write("r1", "0.0", "b", 0, 31)},
		Published: published("0.0", "r1"),
		Expected:  []ExpectedProcess{{Member: "a", PID: 1}, {Member: "b", PID: 2}},
	})
	fmt.Print(SideBySide([]string{"sequenced", "independent"}, sequenced, independent))
	// Output:
	// check                                             sequenced     independent
	// overlapping windows (P1)                          0 OK          1 FAIL
	// units double-pulled (P1)                          0 OK          1 FAIL
	// max double-pulled at once                         0 OK          1 FAIL
	// deliveries outside claim (P1)                     0 OK          n/a
	// stale acks (P1)                                   0 OK          n/a
	// stale writes (P1)                                 0 OK          n/a
	// P2 violations                                     0 OK          n/a
	// P5 violations (takeover)                          0 OK          n/a
	// rows lost (P3)                                    0 OK          0 OK
	// histories missing or cut                          0 OK          0 OK
	// unrecorded writes                                 0 OK          0 OK
	// duplicates explained (takeover/reset/redelivery)  0 (0/0/0) OK  1 (0/0/1) OK
	// duplicates unexplained                            0 OK          0 OK
	// units pulled by two processes (fetches)           0 info        1 info
	// per-key inversions across units                   n/a           n/a
	// per-key reorders within a unit (redelivery)       n/a           n/a
}
