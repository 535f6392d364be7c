package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestWatchNamespaceFromFlagsAndEnvironment(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     string
		want    []string
		wantErr string
	}{
		{name: "unset watches every namespace", want: nil},
		{name: "one flag", args: []string{"--watch-namespace=ingest"}, want: []string{"ingest"}},
		{name: "repeated and comma-separated", args: []string{"--watch-namespace=a,b", "--watch-namespace", "c"}, want: []string{"a", "b", "c"}},
		{name: "environment when the flag is unset", env: "a, b", want: []string{"a", "b"}},
		{name: "the flag wins over the environment", args: []string{"--watch-namespace=x"}, env: "a", want: []string{"x"}},
		{name: "a bad name is refused with the rule", args: []string{"--watch-namespace=Ingest"}, wantErr: `"Ingest" is not a namespace name`},
		{name: "a bad environment value names the variable", env: "a_b", wantErr: "WATCH_NAMESPACE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == "WATCH_NAMESPACE" {
					return tt.env
				}
				return ""
			}
			o, _, _, err := parseFlags(tt.args, getenv, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.WatchNamespaces, tt.want) {
				t.Fatalf("watch namespaces %q, want %q", o.WatchNamespaces, tt.want)
			}
		})
	}
}

func TestVersionFlagNeedsNothingElse(t *testing.T) {
	_, _, showVersion, err := parseFlags([]string{"--version"}, func(string) string { return "" }, io.Discard)
	if err != nil || !showVersion {
		t.Fatalf("--version: show %v, err %v", showVersion, err)
	}
}

func TestMetricsAreSecureByDefault(t *testing.T) {
	o, _, _, err := parseFlags(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.MetricsSecure || o.MetricsAddr != ":8443" || o.EnableHTTP2 {
		t.Fatalf("defaults: secure %v on %q, http2 %v; want HTTPS with authn/authz on :8443 and no HTTP/2", o.MetricsSecure, o.MetricsAddr, o.EnableHTTP2)
	}
}
