package natsops

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/nats.go"
)

// manager opens a jsm.go Manager for tests that shape streams and
// consumers by hand. Only tests use it: the jsm.go root package links the
// NATS server, which the shipped binaries must not (jsapi.go).
func manager(ctx context.Context, nc *nats.Conn) (*jsm.Manager, error) {
	timeout := requestTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
		if timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	mgr, err := jsm.New(nc, jsm.WithTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("open JetStream manager: %w", err)
	}
	return mgr, nil
}
