package historycheck

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/shardkeeper/shardkeeper/pkg/history"
)

// checkHistories is completeness of the histories themselves: every
// process the harness started has one, whole but for one partial last
// record of a process that was killed, and no history comes from a process
// the harness did not list (its list would then not be the whole run).
func (c *checker) checkHistories(v *Verdict) {
	report := func(detail string) {
		v.HistoryProblems++
		c.ex.add(CheckHistories, noInstant, detail)
	}
	if c.in.Expected == nil {
		report("the harness listed no processes (Input.Expected): completeness cannot be judged")
		return
	}
	used := make([]bool, len(c.in.Processes))
	matched := make([]int, len(c.in.Expected))
	// Processes named by pid first, so a PID-less one cannot take theirs.
	for pass := range 2 {
		for ei, e := range c.in.Expected {
			if (pass == 0) != (e.PID != 0) {
				continue
			}
			matched[ei] = -1
			for pi := range c.in.Processes {
				if used[pi] {
					continue
				}
				member, pid := processIdentity(&c.in.Processes[pi])
				if member == e.Member && (e.PID == 0 || pid == e.PID) {
					used[pi], matched[ei] = true, pi
					break
				}
			}
		}
	}
	for ei, e := range c.in.Expected {
		pi := matched[ei]
		switch {
		case pi < 0:
			v.MissingHistories++
			report(fmt.Sprintf("process %s of %s has no history", pidName(e.PID), e.Member))
		case c.in.Processes[pi].Truncated && !e.Abrupt:
			v.CutHistories++
			report(fmt.Sprintf("history %s ends in a partial record, but its process was not killed", c.in.Processes[pi].Name))
		}
	}
	for pi := range c.in.Processes {
		if !used[pi] {
			v.UnlistedHistories++
			report(fmt.Sprintf("history %s is of no process the harness listed", c.in.Processes[pi].Name))
		}
	}
}

// processIdentity is the member (from the clock record) and pid (from the
// file name "<member>-<pid>-<mono>") of a history; pid 0 when the name
// does not say.
func processIdentity(p *history.Process) (string, int) {
	member := ""
	if len(p.Records) > 0 {
		member = p.Records[0].Member
	}
	parts := strings.Split(p.Name, "-")
	if len(parts) < 3 {
		return member, 0
	}
	pid, err := strconv.Atoi(parts[len(parts)-2])
	if err != nil {
		return member, 0
	}
	return member, pid
}

func pidName(pid int) string {
	if pid == 0 {
		return "(pid unknown)"
	}
	return "pid " + strconv.Itoa(pid)
}
