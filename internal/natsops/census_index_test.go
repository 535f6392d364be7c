package natsops

import (
	"fmt"
	"testing"
)

// indexedCensus is a census of n consumers with the index TakeCensus
// builds.
func indexedCensus(n int) *Census {
	c := &Census{byRef: map[ConsumerRef]int{}}
	for i := range n {
		ref := ConsumerRef{Stream: "s", Name: fmt.Sprint(i)}
		c.byRef[ref] = len(c.Consumers)
		c.Consumers = append(c.Consumers, ConsumerPlacement{ConsumerRef: ref, Found: true, Pending: uint64(i)})
	}
	return c
}

func TestACensusFindsAConsumerByItsIndexAndByScanWhenTheIndexNoLongerFits(t *testing.T) {
	cases := []struct {
		name   string
		change func(c *Census)
		ask    ConsumerRef
		want   int // Pending of the placement found; -1: not found
	}{
		{"indexed", func(*Census) {}, ConsumerRef{"s", "7"}, 7},
		{"not inspected", func(*Census) {}, ConsumerRef{"s", "x"}, -1},
		{"decoded from JSON: no index", func(c *Census) { c.byRef = nil }, ConsumerRef{"s", "3"}, 3},
		{"reordered by a caller", func(c *Census) { c.Consumers[2], c.Consumers[5] = c.Consumers[5], c.Consumers[2] }, ConsumerRef{"s", "5"}, 5},
		{"cut by a caller", func(c *Census) { c.Consumers = c.Consumers[:4] }, ConsumerRef{"s", "9"}, -1},
		{"appended by a caller", func(c *Census) {
			c.Consumers = append(c.Consumers, ConsumerPlacement{ConsumerRef: ConsumerRef{"t", "0"}, Pending: 42})
		}, ConsumerRef{"t", "0"}, 42},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := indexedCensus(10)
			tc.change(c)
			p, ok := c.Consumer(tc.ask.Stream, tc.ask.Name)
			switch {
			case tc.want < 0 && ok:
				t.Fatalf("found %s (%+v), want not found", tc.ask, p)
			case tc.want >= 0 && (!ok || p.ConsumerRef != tc.ask || p.Pending != uint64(tc.want)):
				t.Fatalf("Consumer(%s) = %+v, %v; want pending %d", tc.ask, p, ok, tc.want)
			}
		})
	}
}

// BenchmarkCensusConsumer is the operator's verdict over a 4096-unit
// topology: one lookup per unit.
func BenchmarkCensusConsumer(b *testing.B) {
	for _, indexed := range []bool{true, false} {
		b.Run(fmt.Sprintf("indexed=%v", indexed), func(b *testing.B) {
			c := indexedCensus(4096)
			if !indexed {
				c.byRef = nil
			}
			for b.Loop() {
				for i := range 4096 {
					if _, ok := c.Consumer("s", fmt.Sprint(i)); !ok {
						b.Fatal("not found")
					}
				}
			}
		})
	}
}
