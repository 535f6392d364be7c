package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

func TestBadOptionsAreRefusedNamingTheOption(t *testing.T) {
	good := func() Options {
		return Options{Topology: "ns/t", Member: "w-0", Registry: &Registry{reg: poolctl.NewTwin(nil)}, NATS: &nats.Conn{},
			Handler: func(context.Context, Row) Settlement { return Ack }}
	}
	tests := []struct {
		name   string
		mutate func(*Options)
		want   string // "" means accepted
	}{
		{"defaults are accepted", func(*Options) {}, ""},
		{"missing topology", func(o *Options) { o.Topology = "" }, "Topology"},
		{"missing member", func(o *Options) { o.Member = "" }, "Member"},
		{"missing handler", func(o *Options) { o.Handler = nil }, "Handler"},
		{"missing registry", func(o *Options) { o.Registry = nil }, "Registry"},
		{"bad subject prefix", func(o *Options) { o.SubjectPrefix = "Has.Dots" }, "SubjectPrefix"},
		{"huge batch", func(o *Options) { o.FetchBatch = 1 << 20 }, "FetchBatch"},
		{"tiny fetch wait", func(o *Options) { o.FetchWait = time.Millisecond }, "FetchWait"},
		{"negative drain timeout", func(o *Options) { o.DrainTimeout = -time.Second }, "DrainTimeout"},
		{"negative fence margin", func(o *Options) { o.FenceMargin = -time.Second }, "FenceMargin"},
		{"one unit per registry call", func(o *Options) { o.ClaimBatch = 1 }, ""},
		{"negative claim batch", func(o *Options) { o.ClaimBatch = -1 }, "ClaimBatch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good()
			tt.mutate(&o)
			c := o.withDefaults()
			err := c.validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want == "":
			case err == nil:
				t.Fatalf("accepted, want a refusal naming %s", tt.want)
			case !errors.Is(err, ErrBadOption) || !strings.Contains(err.Error(), tt.want):
				t.Fatalf("error %q does not name %s", err, tt.want)
			}
		})
	}
}
