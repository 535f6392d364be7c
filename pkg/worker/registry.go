package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardkeeper/shardkeeper/internal/poolctl"
	"github.com/shardkeeper/shardkeeper/pkg/shard"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/registryhook"
)

// Registry is the ownership registry (PostgreSQL) a worker joins. Open it
// with OpenRegistry; several Workers of one process may share it.
type Registry struct {
	reg   poolctl.Registry
	close func()
}

// RegistryConfig says how to reach the registry.
type RegistryConfig struct {
	// DSN is the PostgreSQL connection string (the same database the
	// operator's spec.registry.dsnSecretRef names). It is never logged.
	DSN string
	// MaxConns caps the connection pool; zero keeps pgx's default.
	MaxConns int32
}

// ErrNoDSN refuses a RegistryConfig without a DSN.
var ErrNoDSN = errors.New("registry DSN is empty")

// OpenRegistry connects to the registry. The operator migrates its schema;
// a worker only reads and writes rows.
func OpenRegistry(ctx context.Context, cfg RegistryConfig) (*Registry, error) {
	if cfg.DSN == "" {
		return nil, fmt.Errorf("open registry: %w", ErrNoDSN)
	}
	pg, err := poolctl.Open(ctx, poolctl.Config{DSN: cfg.DSN, MaxConns: cfg.MaxConns, SkipMigrate: true})
	if err != nil {
		return nil, fmt.Errorf("open registry: %w", err)
	}
	return &Registry{reg: pg, close: pg.Close}, nil
}

// Close closes the registry's connections.
func (r *Registry) Close() {
	if r != nil && r.close != nil {
		r.close()
	}
}

func init() {
	registryhook.Wrap = func(r poolctl.Registry) any { return &Registry{reg: r} }
}

// GuardSQL is the write guard a sink in the registry's database embeds in
// its own statement, with GuardArgs as its first four arguments:
//
//	INSERT INTO rows (unit, seq, body)
//	SELECT $2, $5, $6 WHERE <GuardSQL>
//
// It locks the claim row until the sink's transaction ends, so the write
// either commits while the row's token is valid or is not made at all
// (zero rows): a member that lost the claim cannot write.
const GuardSQL = poolctl.GuardSQL

// GuardArgs are GuardSQL's arguments for t.
func GuardArgs(t shard.Token) []any { return poolctl.GuardArgs(t) }
