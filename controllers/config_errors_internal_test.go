package controllers

import (
	"strings"
	"testing"
)

// Connection strings are taken out of error text before it reaches
// status: pgx's parse error quotes a redacted copy of the DSN, and other
// errors may quote a URL with its password.
func TestScrubConnStringsTakesDSNsOutOfMessages(t *testing.T) {
	tests := []struct {
		name, in string
		gone     []string
		kept     []string
	}{
		{"pgx parse error", "parse registry DSN: cannot parse `postgres://u:xxxxx@h:notaport/db`: invalid port",
			[]string{"postgres://", "xxxxx", "notaport"}, []string{"parse registry DSN", "invalid port"}},
		{"a URL with a password", `dial "postgres://shardkeeper:hunter2@pg.ingest:5432/registry?sslmode=require" failed`,
			[]string{"hunter2", "shardkeeper:"}, []string{"failed"}},
		{"nats URL with a token", "connect to nats://tok:s3cret@nats:4222: refused", []string{"s3cret"}, []string{"refused"}},
		{"nothing to scrub", "failed to connect to `user=shardkeeper database=registry`: 127.0.0.1:1: connection refused",
			nil, []string{"user=shardkeeper database=registry", "connection refused"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scrubConnStrings(tt.in)
			for _, g := range tt.gone {
				if strings.Contains(got, g) {
					t.Errorf("%q still holds %q", got, g)
				}
			}
			for _, k := range tt.kept {
				if !strings.Contains(got, k) {
					t.Errorf("%q lost %q", got, k)
				}
			}
		})
	}
}
