package ownership

// summarize counts, per member, what the steps do to its units, from the
// claims before the plan and the claims the steps leave.
func summarize(from, to Topology, members []Member, start Claims, steps []Step) []MemberChange {
	end := finalClaims(start, steps)
	out := make([]MemberChange, 0, len(members))
	idx := make(map[string]int, len(members))
	for _, m := range sortedMembers(indexMembers(members)) {
		idx[m.Name] = len(out)
		out = append(out, MemberChange{Member: m.Name})
	}
	count := func(member string, f func(*MemberChange)) {
		if i, ok := idx[member]; ok {
			f(&out[i])
		}
	}
	for u, m := range start {
		count(m, func(c *MemberChange) { c.Before++ })
		switch {
		case !to.Contains(u):
			count(m, func(c *MemberChange) { c.Retired++ })
		case end[u] == m:
			count(m, func(c *MemberChange) { c.Kept++ })
		default:
			count(m, func(c *MemberChange) { c.MovedOut++ })
		}
	}
	for u, m := range end {
		count(m, func(c *MemberChange) { c.After++ })
		switch {
		case !from.Contains(u):
			count(m, func(c *MemberChange) { c.Added++ })
		case start[u] != m:
			count(m, func(c *MemberChange) { c.MovedIn++ })
		}
	}
	return out
}

// finalClaims applies the steps' moves to a copy of start, without the
// checks State.Apply makes.
func finalClaims(start Claims, steps []Step) Claims {
	c := start.Clone()
	if c == nil {
		c = Claims{}
	}
	for _, st := range steps {
		for _, mv := range st.Moves {
			switch st.Name {
			case StepHandOver, StepRetire:
				delete(c, mv.Unit)
			case StepClaim:
				c[mv.Unit] = mv.To
			}
		}
	}
	return c
}

func indexMembers(members []Member) map[string]Member {
	out := make(map[string]Member, len(members))
	for _, m := range members {
		out[m.Name] = m
	}
	return out
}
