package natsops

import (
	"errors"
	"testing"
)

func TestParseVersionAcceptsReleasesPrefixesAndSuffixes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Version
	}{
		{"2.14.9", Version{2, 14, 9, ""}},
		{"v2.12.15", Version{2, 12, 15, ""}},
		{"2.14.0-rc.1", Version{2, 14, 0, "rc.1"}},
		{"v2.14.0-RC.2+build.7", Version{2, 14, 0, "RC.2"}},
		{"2.11.0+20250101", Version{2, 11, 0, ""}},
		{"0.0.0", Version{0, 0, 0, ""}},
		{"2.15.2-beta-1.x-y", Version{2, 15, 2, "beta-1.x-y"}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseVersion(tc.in)
			if err != nil {
				t.Fatalf("ParseVersion(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("ParseVersion(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseVersionRejectsWhatItCannotOrder(t *testing.T) {
	for _, in := range []string{
		"", "unknown", "2.14", "2.14.9.1", "vv2.14.9", "V2.14.9", "2.14.x", "02.14.9",
		"2.014.9", "2.14.9-", "2.14.9+", "2.14.9-rc..1", "2.14.9-rc.01", "2.14.9-rc_1",
		" 2.14.9", "2.14.9 ", "-2.14.9", "2.-14.9", "+2.14.9", "2.14.9-ü", "1234567890.0.0",
	} {
		t.Run(in, func(t *testing.T) {
			if v, err := ParseVersion(in); !errors.Is(err, ErrBadVersion) {
				t.Fatalf("ParseVersion(%q) = %+v, %v; want ErrBadVersion", in, v, err)
			}
		})
	}
}

func TestVersionOrderFollowsSemver(t *testing.T) {
	// Each version is strictly below the next (semver.org section 11).
	ordered := []string{
		"1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
		"1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "2.11.0", "2.12.15", "2.14.0-rc.1",
		"2.14.0", "2.14.9", "2.15.2", "10.0.0",
	}
	for i := range ordered {
		for j := range ordered {
			a, b := mustParse(t, ordered[i]), mustParse(t, ordered[j])
			want := cmpInt(i, j)
			if got := a.Compare(b); got != want {
				t.Errorf("Compare(%s, %s) = %d, want %d", a, b, got, want)
			}
		}
	}
	if !mustParse(t, "v2.14.0+build").AtLeast(MinResetVersion) {
		t.Error("2.14.0 with build metadata is below 2.14.0")
	}
	if mustParse(t, "2.14.0-rc.1").AtLeast(MinResetVersion) {
		t.Error("a 2.14.0 release candidate passes a 2.14.0 floor")
	}
}

func mustParse(t testing.TB, s string) Version {
	t.Helper()
	v, err := ParseVersion(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"2.14.9", "v2.12.15", "2.14.0-rc.1+b.2", "2.14", "", "v", "1.2.3-0.a.00", "9.9.9-x+y"} {
		f.Add(s, "2.14.0")
	}
	f.Fuzz(func(t *testing.T, s, o string) {
		v, err := ParseVersion(s)
		if err != nil {
			if !errors.Is(err, ErrBadVersion) {
				t.Fatalf("error %v does not wrap ErrBadVersion", err)
			}
			return
		}
		// What parses renders back to itself.
		again, err := ParseVersion(v.String())
		if err != nil || again != v {
			t.Fatalf("%q parsed to %+v, which renders %q and parses back to %+v, %v", s, v, v.String(), again, err)
		}
		if v.Compare(v) != 0 {
			t.Fatalf("%s is not equal to itself", v)
		}
		w, err := ParseVersion(o)
		if err != nil {
			return
		}
		if v.Compare(w) != -w.Compare(v) {
			t.Fatalf("Compare(%s, %s) = %d but Compare(%s, %s) = %d", v, w, v.Compare(w), w, v, w.Compare(v))
		}
		if (v.Compare(w) >= 0) != v.AtLeast(w) {
			t.Fatalf("AtLeast disagrees with Compare for %s, %s", v, w)
		}
	})
}
