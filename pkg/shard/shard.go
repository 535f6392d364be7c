// Package shard holds the public vocabulary of a shardkeeper fleet that a
// worker SDK user handles: a Unit (one shard of one partition, named
// "p.s") and a Token (the claim on a unit at one fencing epoch, which every
// write carries). It owns the names and their parsing; it does not place
// units (internal/ownership), keep claims (internal/poolctl) or pull rows
// (pkg/worker).
package shard

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Limits of a topology. They match the ShardTopology API's validation, so a
// spec the API server accepts is a topology this package accepts.
const (
	// MaxPartitions is the largest N.
	MaxPartitions = 1024
	// MaxShards is the largest V.
	MaxShards = 1024
	// MaxUnits is the largest N x V.
	MaxUnits = 65536
)

// ErrBadUnitName is wrapped by every error Parse returns.
var ErrBadUnitName = errors.New("bad unit name")

// Unit is one shard of one partition, the smallest thing a member owns. It
// is backed by one durable consumer that only one member may pull.
type Unit struct {
	// Partition is p, 0 <= p < N.
	Partition int
	// Shard is s, 0 <= s < V.
	Shard int
}

// String returns the unit's name, "p.s" (e.g. "3.11").
func (u Unit) String() string {
	return strconv.Itoa(u.Partition) + "." + strconv.Itoa(u.Shard)
}

// MarshalText encodes the unit as its name, so units read well in JSON and
// can be map keys there.
func (u Unit) MarshalText() ([]byte, error) {
	return []byte(u.String()), nil
}

// UnmarshalText decodes a unit name with the rules of Parse.
func (u *Unit) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*u = v
	return nil
}

// Compare orders units by partition, then shard: the canonical order
// lists of units are kept in.
func Compare(a, b Unit) int {
	if a.Partition != b.Partition {
		return compareInt(a.Partition, b.Partition)
	}
	return compareInt(a.Shard, b.Shard)
}

func compareInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Parse parses a unit name "p.s". It is strict, because a name is also a
// consumer name and a registry key, and two spellings of one unit would be
// two units: each part is decimal digits only, without sign, space or
// leading zero (except "0" itself), with p below MaxPartitions and s below
// MaxShards.
func Parse(name string) (Unit, error) {
	ps, ss, ok := strings.Cut(name, ".")
	if !ok {
		return Unit{}, fmt.Errorf("%w %q: want <partition>.<shard>, e.g. 3.11", ErrBadUnitName, name)
	}
	p, err := parseIndex(ps, MaxPartitions)
	if err != nil {
		return Unit{}, fmt.Errorf("%w %q: partition: %w", ErrBadUnitName, name, err)
	}
	s, err := parseIndex(ss, MaxShards)
	if err != nil {
		return Unit{}, fmt.Errorf("%w %q: shard: %w", ErrBadUnitName, name, err)
	}
	return Unit{Partition: p, Shard: s}, nil
}

// parseIndex reads a decimal index in [0, limit) in the one spelling
// String produces.
func parseIndex(s string, limit int) (int, error) {
	want := fmt.Sprintf("want a decimal number 0..%d without sign, spaces or leading zeros", limit-1)
	if s == "" {
		return 0, fmt.Errorf("empty: %s", want)
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("leading zero in %q: %s", s, want)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a digit: %s", c, want)
		}
		n = n*10 + int(c-'0')
		if n >= limit {
			return 0, fmt.Errorf("%s is out of range: %s", s, want)
		}
	}
	return n, nil
}

// Token is what a holder presents with every write: the claim on Unit at
// one fencing epoch, held by Member, in the topology named Topology
// ("namespace/name"). The epoch grows by one at every change of owner, so
// a sink that refuses tokens older than one it has seen (or checks the
// registry) never takes a write from a member that lost the claim.
type Token struct {
	Topology string
	Unit     string
	Member   string
	Epoch    int64
}

// String names the token for errors and logs.
func (t Token) String() string {
	return fmt.Sprintf("%s/%s@%d by %s", t.Topology, t.Unit, t.Epoch, t.Member)
}
