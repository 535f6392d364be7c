package rolloutsim

import (
	"fmt"

	"github.com/shardkeeper/shardkeeper/internal/ownership"
)

// startEpoch is the epoch the simulated fleet starts under.
const startEpoch = 1

// sequencedSim replays plans through ownership.State.
type sequencedSim struct {
	members int
	state   *ownership.State
	counter *counter
	// waiting are units a plan released and a later step claims.
	waiting map[ownership.Unit]bool
	run     Run
}

// Sequenced replays the scenario with the plans of package ownership: the
// topology change, then a pod roll in the scenario's restart order.
func Sequenced(sc Scenario) (Run, error) {
	if err := sc.Validate(); err != nil {
		return Run{}, err
	}
	members := sc.members()
	claims := ownership.ClaimsOf(sc.From, members)
	state, err := ownership.NewState(startEpoch, members, claims)
	if err != nil {
		return Run{}, fmt.Errorf("sequenced: %w", err)
	}
	s := &sequencedSim{
		members: sc.Members,
		state:   state,
		counter: &counter{publishing: sc.From, from: sc.From, retired: state.Retired},
		waiting: map[ownership.Unit]bool{},
		run:     Run{Strategy: "sequenced"},
	}
	s.count("start")
	change, err := ownership.PlanChange(ownership.ChangeInput{Epoch: startEpoch, From: sc.From, To: sc.To, Members: members, Claims: claims})
	if err != nil {
		return Run{}, fmt.Errorf("sequenced: %w", err)
	}
	s.execute(change, sc.To)
	roll, err := ownership.PlanRoll(ownership.RollInput{
		Epoch: change.ToEpoch, Topology: sc.To, Members: members, Claims: s.state.Claims(), Order: names(sc.RestartOrder()),
	})
	if err != nil {
		return Run{}, fmt.Errorf("sequenced: %w", err)
	}
	s.execute(roll, sc.To)
	return s.run, nil
}

// execute applies every step of p and counts after each.
func (s *sequencedSim) execute(p ownership.Plan, to ownership.Topology) {
	for i, st := range p.Steps {
		if err := s.state.Apply(i, st); err != nil {
			s.run.Violations = append(s.run.Violations, fmt.Errorf("%s plan: %w", p.Kind, err))
		}
		for _, mv := range st.Moves {
			switch st.Name {
			case ownership.StepHandOver:
				s.waiting[mv.Unit] = true
			case ownership.StepClaim:
				delete(s.waiting, mv.Unit)
			}
		}
		if p.Kind == ownership.KindTopologyChange && st.Name == ownership.StepClaim {
			// Every unit of the new epoch is claimed: the consumers are
			// ready, so publishers move to it.
			s.counter.publishing = to
		}
		s.count(describe(st))
	}
}

func (s *sequencedSim) count(event string) {
	pulls := make(map[ownership.Unit]int, len(s.state.Holders))
	for u, h := range s.state.Holders {
		for _, m := range h {
			if _, live := s.state.Live[m]; live {
				pulls[u]++
			}
		}
	}
	row := s.counter.row(event, pulls, s.waiting)
	row.AllUp = len(s.state.Live) == s.members
	s.run.Rows = append(s.run.Rows, row)
}

// describe names a step for the table: its name, the epoch for fleet-wide
// steps, the pod for per-pod steps, and how many units it moves.
func describe(st ownership.Step) string {
	e := string(st.Name)
	if st.Member != "" {
		e += " " + st.Member
	} else {
		e += fmt.Sprintf(" e%d", st.Epoch)
	}
	if len(st.Moves) > 0 {
		e += fmt.Sprintf(" (%d)", len(st.Moves))
	}
	return e
}

func names(ordinals []int) []string {
	out := make([]string, len(ordinals))
	for i, o := range ordinals {
		out[i] = PodName(o)
	}
	return out
}
