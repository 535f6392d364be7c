package natsops

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Version is a NATS server version: major.minor.patch with an optional
// pre-release. Build metadata is dropped, as semantic versioning ignores it
// for ordering.
type Version struct {
	Major, Minor, Patch int
	// Pre is the pre-release ("rc.2", "beta"), empty for a release. A
	// pre-release orders before its release: 2.14.0-rc.1 < 2.14.0.
	Pre string
}

// Versions the guarded operations need on every server that matters.
var (
	// MinUnpinVersion is the first release with
	// $JS.API.CONSUMER.UNPIN.<stream>.<consumer>.
	MinUnpinVersion = Version{Major: 2, Minor: 11}
	// MinResetVersion is the first release with
	// $JS.API.CONSUMER.RESET.<stream>.<consumer>. Older replicas of a
	// consumer do not know the raft operation RESET replicates.
	MinResetVersion = Version{Major: 2, Minor: 14}
	// DefaultFloor is the version floor when none is given.
	DefaultFloor = MinResetVersion
)

// ErrBadVersion means a version string could not be parsed. The census
// counts such a server below any floor.
var ErrBadVersion = errors.New("bad version")

// maxVersionLen bounds what ParseVersion reads; real versions are short.
const maxVersionLen = 128

// ParseVersion parses "2.14.9", "v2.14.9", "2.14.0-rc.1" and
// "2.14.0-rc.1+build.7". Major, minor and patch are required, plain
// decimal numbers without leading zeros; pre-release and build identifiers
// are non-empty runs of [0-9A-Za-z-], and numeric pre-release identifiers
// have no leading zeros.
func ParseVersion(s string) (Version, error) {
	bad := func(why string) (Version, error) {
		if len(s) > 40 {
			s = s[:40] + "..."
		}
		return Version{}, fmt.Errorf("%w %q: %s", ErrBadVersion, s, why)
	}
	if len(s) > maxVersionLen {
		return bad("too long")
	}
	rest := strings.TrimPrefix(s, "v")
	if i := strings.IndexByte(rest, '+'); i >= 0 {
		if !validIdents(rest[i+1:], false) {
			return bad("bad build metadata")
		}
		rest = rest[:i]
	}
	var v Version
	if i := strings.IndexByte(rest, '-'); i >= 0 {
		v.Pre = rest[i+1:]
		if !validIdents(v.Pre, true) {
			return bad("bad pre-release")
		}
		rest = rest[:i]
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return bad("want major.minor.patch")
	}
	for i, p := range parts {
		n, ok := parseNumber(p)
		if !ok {
			return bad("bad number " + strconv.Quote(p))
		}
		switch i {
		case 0:
			v.Major = n
		case 1:
			v.Minor = n
		case 2:
			v.Patch = n
		}
	}
	return v, nil
}

// parseNumber reads a decimal number without sign or leading zeros that
// fits comfortably in an int.
func parseNumber(s string) (int, bool) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func validIdents(s string, pre bool) bool {
	if s == "" {
		return false
	}
	for _, id := range strings.Split(s, ".") {
		if id == "" {
			return false
		}
		numeric := true
		for _, c := range []byte(id) {
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-':
				numeric = false
			default:
				return false
			}
		}
		if pre && numeric && len(id) > 1 && id[0] == '0' {
			return false
		}
	}
	return true
}

// String renders the version without a v prefix.
func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	return s
}

// Compare returns -1, 0 or +1 as v orders before, equal to or after o,
// following semantic versioning's precedence rules.
func (v Version) Compare(o Version) int {
	for _, d := range [...][2]int{{v.Major, o.Major}, {v.Minor, o.Minor}, {v.Patch, o.Patch}} {
		if d[0] != d[1] {
			return cmpInt(d[0], d[1])
		}
	}
	switch {
	case v.Pre == o.Pre:
		return 0
	case v.Pre == "":
		return 1
	case o.Pre == "":
		return -1
	}
	a, b := strings.Split(v.Pre, "."), strings.Split(o.Pre, ".")
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := compareIdent(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmpInt(len(a), len(b))
}

// AtLeast says whether v is at or above floor.
func (v Version) AtLeast(floor Version) bool { return v.Compare(floor) >= 0 }

// compareIdent orders pre-release identifiers: numeric ones numerically
// and before alphanumeric ones, which compare as ASCII.
func compareIdent(a, b string) int {
	an, aNum := identNumber(a)
	bn, bNum := identNumber(b)
	switch {
	case aNum && bNum:
		if len(an) != len(bn) {
			return cmpInt(len(an), len(bn))
		}
		return strings.Compare(an, bn)
	case aNum:
		return -1
	case bNum:
		return 1
	}
	return strings.Compare(a, b)
}

// identNumber reports whether id is numeric and returns it without
// leading zeros, so long numbers compare by length then digits.
func identNumber(id string) (string, bool) {
	for _, c := range []byte(id) {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	trimmed := strings.TrimLeft(id, "0")
	return trimmed, true
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func maxVersion(a, b Version) Version {
	if a.Compare(b) >= 0 {
		return a
	}
	return b
}
