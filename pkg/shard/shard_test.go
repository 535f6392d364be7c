package shard

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestParseAcceptsCanonicalNames(t *testing.T) {
	tests := []struct {
		name string
		want Unit
	}{
		{"0.0", Unit{Partition: 0, Shard: 0}},
		{"3.11", Unit{Partition: 3, Shard: 11}},
		{"10.0", Unit{Partition: 10, Shard: 0}},
		{"1023.1023", Unit{Partition: 1023, Shard: 1023}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.name)
			if err != nil || got != tt.want {
				t.Fatalf("Parse(%q) = %v, %v; want %v", tt.name, got, err, tt.want)
			}
		})
	}
}

func TestParseRejectsOtherSpellings(t *testing.T) {
	tests := []struct {
		name, input, mention string
	}{
		{"empty", "", "want <partition>.<shard>"},
		{"no dot", "311", "want <partition>.<shard>"},
		{"empty partition", ".3", "empty"},
		{"empty shard", "3.", "empty"},
		{"leading zero in partition", "03.1", "leading zero"},
		{"leading zero in shard", "3.01", "leading zero"},
		{"double zero", "00.1", "leading zero"},
		{"minus sign", "-1.2", "not a digit"},
		{"plus sign", "+1.2", "not a digit"},
		{"leading space", " 1.2", "not a digit"},
		{"trailing space", "1.2 ", "not a digit"},
		{"third part", "1.2.3", "not a digit"},
		{"letters", "a.b", "not a digit"},
		{"partition out of range", "1024.0", "out of range"},
		{"shard out of range", "0.1024", "out of range"},
		{"huge number", "99999999999999999999999.1", "out of range"},
		{"unicode digit", "١.2", "not a digit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.input)
			if !errors.Is(err, ErrBadUnitName) {
				t.Fatalf("Parse(%q) error = %v, want ErrBadUnitName", tt.input, err)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("Parse(%q) error %q does not say %q", tt.input, err, tt.mention)
			}
		})
	}
}

// TestUnitNameRoundTrips checks that every unit's name parses back to it.
func TestUnitNameRoundTrips(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		u := Unit{Partition: rapid.IntRange(0, MaxPartitions-1).Draw(t, "p"), Shard: rapid.IntRange(0, MaxShards-1).Draw(t, "s")}
		got, err := Parse(u.String())
		if err != nil || got != u {
			t.Fatalf("Parse(%q) = %v, %v", u.String(), got, err)
		}
	})
}

func TestUnitJSONUsesNames(t *testing.T) {
	in := map[Unit]string{{Partition: 3, Shard: 11}: "w-0"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"3.11":"w-0"}` {
		t.Fatalf("json = %s", b)
	}
	var out map[Unit]string
	if err := json.Unmarshal(b, &out); err != nil || out[Unit{Partition: 3, Shard: 11}] != "w-0" {
		t.Fatalf("decoded %v, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"03.11":"w-0"}`), &out); !errors.Is(err, ErrBadUnitName) {
		t.Fatalf("decoding a non-canonical name: %v, want ErrBadUnitName", err)
	}
}

// FuzzParse checks that Parse accepts exactly the canonical names:
// whatever it accepts prints back to the same string and is in range, and
// whatever it refuses is refused with ErrBadUnitName.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"0.0", "3.11", "1023.1023", "1024.0", "03.1", "-1.2", "1.2.3", "", ".", "1.", " 1.2", "9999999999999999999.0", "0.00", "١.2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrBadUnitName) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrBadUnitName", s, err)
			}
			return
		}
		if u.String() != s {
			t.Fatalf("Parse(%q) = %v, which prints as %q", s, u, u.String())
		}
		if u.Partition >= MaxPartitions || u.Shard >= MaxShards {
			t.Fatalf("Parse(%q) = %v, out of range", s, u)
		}
	})
}
