package operator

import (
	"testing"
	"time"
)

func TestBearerTokenReadsOnlyTheBearerScheme(t *testing.T) {
	for _, tc := range []struct {
		name, header, token string
		ok                  bool
	}{
		{"a bearer token", "Bearer abc.def", "abc.def", true},
		{"the scheme in any case", "bearer abc", "abc", true},
		{"surrounding spaces", "  Bearer   abc  ", "abc", true},
		{"no header", "", "", false},
		{"basic auth is not a token", "Basic dXNlcjpwYXNz", "", false},
		{"a scheme without token", "Bearer ", "", false},
		{"a token without scheme", "abc", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			token, ok := bearerToken(tc.header)
			if token != tc.token || ok != tc.ok {
				t.Fatalf("bearerToken(%q) = %q, %v; want %q, %v", tc.header, token, ok, tc.token, tc.ok)
			}
		})
	}
}

func TestRememberBoundsTheCacheAndDropsExpiredEntriesFirst(t *testing.T) {
	now := time.Unix(1000, 0)
	exp := func(v time.Time) time.Time { return v }
	m := map[int]time.Time{}
	for i := range maxAuthEntries {
		v := now.Add(time.Minute)
		if i%2 == 0 {
			v = now.Add(-time.Second) // expired
		}
		m = remember(m, i, v, now, exp)
	}
	if len(m) != maxAuthEntries {
		t.Fatalf("%d entries before the cache is full, want %d", len(m), maxAuthEntries)
	}
	m = remember(m, -1, now.Add(time.Minute), now, exp)
	if len(m) != maxAuthEntries/2+1 {
		t.Fatalf("%d entries after a full cache took one more, want the %d live ones and the new one", len(m), maxAuthEntries/2)
	}
	for k, v := range m {
		if !now.Before(v) {
			t.Fatalf("expired entry %d kept", k)
		}
	}
	// All live: the cache starts over rather than grow.
	for i := range maxAuthEntries {
		m = remember(m, 10_000+i, now.Add(time.Minute), now, exp)
	}
	if len(m) > maxAuthEntries {
		t.Fatalf("%d entries, over the bound %d", len(m), maxAuthEntries)
	}
}
