package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardkeeper/shardkeeper/internal/natsops"
	"github.com/shardkeeper/shardkeeper/internal/poolctl"
)

// Connections caches, per ShardTopology, the registry pool and the two NATS
// connections (the stream account's and the system account's), so that
// reconciles reuse them instead of reconnecting. Each is keyed by a hash of
// what it was opened from (the Secret contents and URLs): when a Secret
// changes, the next reconcile closes the old connection and opens a new
// one. Secret contents are hashed, never stored or logged.
//
// The zero value is ready to use. It is safe for concurrent use.
type Connections struct {
	// Identity names this operator process as the holder of the operator
	// tokens it takes (poolctl.OperatorToken); empty means one made up at
	// first use from the host name, the process ID and a random suffix.
	Identity string

	mu      sync.Mutex
	entries map[types.NamespacedName]*topologyConns
	// superseded are the topologies whose operator token a newer leader
	// took from this process; it never takes one again (operator_fence.go).
	superseded map[types.NamespacedName]error
	// censusTurns holds a token per census running (census_runs.go).
	censusTurns chan struct{}
}

// topologyConns are one topology's connections and what the operator
// remembers between its reconciles. Nothing here is needed for
// correctness after a restart: it only saves work (provisioning, census)
// that the reconciler would otherwise redo.
type topologyConns struct {
	mu sync.Mutex

	regKey string
	reg    *poolctl.PG
	// opReg is reg bound to the operator token this process took for the
	// topology in that registry, nil until it took one.
	opReg *poolctl.PG
	// tokenTakenAt is when this process took it, on its own clock.
	tokenTakenAt time.Time
	// ensured is the lease parameters last written with EnsureTopology.
	ensured *poolctl.Params

	natsKey string
	nc      *nats.Conn
	sysKey  string
	sys     *nats.Conn

	// behindSince is when this process first found the registry behind
	// (issue 22); zero while it is not.
	behindSince time.Time

	// provisioned is the shape this process last provisioned, and when.
	provisionedShape string
	provisionedAt    time.Time
	// censusDue forces a census at the next reconcile (after an epoch
	// activation, so the RESET verdict covers the new units' consumers).
	censusDue bool
	// announced are units whose retirement an Event already reported;
	// RetireConsumers counts a consumer already gone as retired again.
	announced map[string]bool
	// census is the census running off the reconcile path, or done and
	// not yet published (census_runs.go); nil when none.
	census *censusRun
	// censusTakenAt is when the last census this process published was
	// taken, to the nanosecond: status keeps whole seconds.
	censusTakenAt time.Time
	// censusTaken says this process attempted a census of the topology;
	// pending is what the recent successful ones counted, oldest first.
	censusTaken bool
	pending     []pendingRows
	// secrets are the Secrets the spec names as last read from the API
	// server, by name (readSecret).
	secrets map[string]*corev1.Secret
	// prunedAt is when this process last pruned the registry's history.
	prunedAt time.Time
}

// NATSConfig is what a NATS connection is opened from.
type NATSConfig struct {
	// Name is the client name servers show for the connection.
	Name string
	// URLs are the servers to connect to.
	URLs []string
	// Credentials are the contents of a credentials Secret key: a .creds
	// file, "user:password" or a token. Empty means no authentication.
	Credentials []byte
	// TLS holds ca.crt, tls.crt and tls.key from the TLS Secret, if any.
	TLS map[string][]byte
}

// key hashes the configuration; secret contents never leave this function.
func (c NATSConfig) key() string {
	h := sha256.New()
	fmt.Fprintf(h, "%q\n%q\n", c.Name, strings.Join(c.URLs, ","))
	h.Write(c.Credentials)
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		fmt.Fprintf(h, "\n%s:%d:", k, len(c.TLS[k]))
		h.Write(c.TLS[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func hashString(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func (c *Connections) entry(key types.NamespacedName) *topologyConns {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[types.NamespacedName]*topologyConns{}
	}
	e := c.entries[key]
	if e == nil {
		e = &topologyConns{}
		c.entries[key] = e
	}
	return e
}

// lookup returns the topology's entry without creating one.
func (c *Connections) lookup(key types.NamespacedName) *topologyConns {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[key]
}

// Registry returns the topology's registry, opening (and migrating) it when
// none is cached for this DSN, bound to the operator token this process
// takes for topology (the registry key) the first time it opens that
// registry: a process leads once, so it takes a token once, and never
// again once a newer leader took one (the error says so).
func (c *Connections) Registry(ctx context.Context, key types.NamespacedName, topology, dsn string) (*poolctl.PG, error) {
	if err := c.supersededErr(key); err != nil {
		return nil, err
	}
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	h := hashString(dsn)
	if e.reg != nil && e.regKey == h && e.opReg != nil {
		return e.opReg, nil
	}
	if e.reg != nil && e.regKey != h {
		e.reg.Close()
		e.reg, e.regKey, e.ensured, e.opReg = nil, "", nil, nil
	}
	if e.reg == nil {
		reg, err := poolctl.Open(ctx, poolctl.Config{DSN: dsn, MaxConns: 4})
		if err != nil {
			// pgx redacts passwords from its errors; the DSN is taken out
			// whole as well, whatever its form, since status shows errors.
			if dsn != "" && strings.Contains(err.Error(), dsn) {
				return nil, errors.New(strings.ReplaceAll(err.Error(), dsn, "<dsn>"))
			}
			return nil, err
		}
		e.reg, e.regKey = reg, h
	}
	tok, err := e.reg.TakeOperatorToken(ctx, topology, c.identity())
	if err != nil {
		return nil, fmt.Errorf("take the operator token: %w", err)
	}
	e.opReg, e.tokenTakenAt = e.reg.AsOperator(tok), time.Now()
	return e.opReg, nil
}

// CachedRegistry returns the topology's registry, bound to this process's
// operator token, if one is open, whatever its Secret now says; the
// finalizer uses it when the Secret is gone.
func (c *Connections) CachedRegistry(key types.NamespacedName) *poolctl.PG {
	e := c.lookup(key)
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.opReg
}

// EnsureTopology writes the lease parameters when they differ from what
// this process last wrote.
func (c *Connections) EnsureTopology(ctx context.Context, key types.NamespacedName, reg poolctl.Registry, topology string, p poolctl.Params) error {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ensured != nil && *e.ensured == p {
		return nil
	}
	if err := reg.EnsureTopology(ctx, topology, p); err != nil {
		return err
	}
	e.ensured = &p
	return nil
}

// NATS returns the topology's connection to the stream account.
func (c *Connections) NATS(key types.NamespacedName, cfg NATSConfig) (*nats.Conn, error) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return connectCached(&e.nc, &e.natsKey, cfg)
}

// SystemNATS returns the topology's system-account connection (census).
func (c *Connections) SystemNATS(key types.NamespacedName, cfg NATSConfig) (*nats.Conn, error) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return connectCached(&e.sys, &e.sysKey, cfg)
}

// CachedNATS returns the topology's stream-account connection if one is
// open; the finalizer uses it when the Secret is gone.
func (c *Connections) CachedNATS(key types.NamespacedName) *nats.Conn {
	e := c.lookup(key)
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.nc == nil || e.nc.IsClosed() {
		return nil
	}
	return e.nc
}

func connectCached(conn **nats.Conn, cachedKey *string, cfg NATSConfig) (*nats.Conn, error) {
	k := cfg.key()
	if *conn != nil && *cachedKey == k && !(*conn).IsClosed() {
		return *conn, nil
	}
	if *conn != nil {
		(*conn).Close()
		*conn, *cachedKey = nil, ""
	}
	nc, err := connectNATS(cfg)
	if err != nil {
		return nil, err
	}
	*conn, *cachedKey = nc, k
	return nc, nil
}

// connectNATS opens a connection that reconnects on its own for as long as
// it is cached.
func connectNATS(cfg NATSConfig) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
	}
	auth, err := natsops.AuthOptions(cfg.Credentials, cfg.TLS)
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)
	nc, err := nats.Connect(strings.Join(cfg.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", strings.Join(cfg.URLs, ","), err)
	}
	return nc, nil
}

// ErrBadCredentials means a credentials Secret value could not be used
// (natsops.ErrBadCredentials).
var ErrBadCredentials = natsops.ErrBadCredentials

// provisionedRecently reports whether this process provisioned shape for
// the topology within maxAge.
func (c *Connections) provisionedRecently(key types.NamespacedName, shape string, now time.Time, maxAge time.Duration) bool {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.provisionedShape == shape && now.Sub(e.provisionedAt) < maxAge
}

func (c *Connections) markProvisioned(key types.NamespacedName, shape string, now time.Time) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.provisionedShape, e.provisionedAt = shape, now
}

// forgetProvisioned makes the next reconcile provision again.
func (c *Connections) forgetProvisioned(key types.NamespacedName) {
	c.markProvisioned(key, "", time.Time{})
}

// cachedSecret returns a copy of the topology's Secret name as last read,
// if it was read at resourceVersion rv; nil otherwise.
func (c *Connections) cachedSecret(key types.NamespacedName, name, rv string) *corev1.Secret {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if sec := e.secrets[name]; sec != nil && rv != "" && sec.ResourceVersion == rv {
		return sec.DeepCopy()
	}
	return nil
}

// keepSecret remembers a copy of sec as the topology's Secret of its name.
func (c *Connections) keepSecret(key types.NamespacedName, sec *corev1.Secret) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.secrets == nil {
		e.secrets = map[string]*corev1.Secret{}
	}
	e.secrets[sec.Name] = sec.DeepCopy()
}

// setCensusDue asks for a census at the next reconcile; asking drops the
// census running, so the one published next was started after the ask.
func (c *Connections) setCensusDue(key types.NamespacedName, due bool) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.censusDue = due
	if due {
		e.dropCensusLocked()
	}
}

func (c *Connections) censusDue(key types.NamespacedName) bool {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.censusDue
}

// addPendingRows records that a census was taken and what it counted (p
// nil when it failed), keeping the censuses a stall judgement with bound
// may need.
func (c *Connections) addPendingRows(key types.NamespacedName, p *pendingRows, bound time.Duration) []pendingRows {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.censusTaken = true
	if p != nil {
		e.pending = keepPending(e.pending, *p, bound)
	}
	return slices.Clone(e.pending)
}

// pendingRows returns what the recent censuses counted, oldest first, and
// whether this process took a census of the topology at all.
func (c *Connections) pendingRows(key types.NamespacedName) ([]pendingRows, bool) {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.pending), e.censusTaken
}

// pruneDue reports whether the registry's history was not pruned by this
// process within every, and if so records now as the prune time.
func (c *Connections) pruneDue(key types.NamespacedName, now time.Time, every time.Duration) bool {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.prunedAt.IsZero() && now.Sub(e.prunedAt) < every && now.After(e.prunedAt) {
		return false
	}
	e.prunedAt = now
	return true
}

// newlyRetired returns the units not announced as retired under the
// active epoch before, and remembers them.
func (c *Connections) newlyRetired(key types.NamespacedName, epoch int64, units []string) []string {
	e := c.entry(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.announced == nil {
		e.announced = map[string]bool{}
	}
	var out []string
	for _, u := range units {
		k := fmt.Sprintf("%d/%s", epoch, u)
		if !e.announced[k] {
			e.announced[k] = true
			out = append(out, u)
		}
	}
	return out
}

// Close closes and forgets the topology's connections.
func (c *Connections) Close(key types.NamespacedName) {
	c.mu.Lock()
	e := c.entries[key]
	delete(c.entries, key)
	c.mu.Unlock()
	if e != nil {
		e.close()
	}
}

// CloseAll closes every cached connection (at operator shutdown).
func (c *Connections) CloseAll() {
	c.mu.Lock()
	entries := c.entries
	c.entries = nil
	c.mu.Unlock()
	for _, e := range entries {
		e.close()
	}
}

func (e *topologyConns) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropCensusLocked()
	if e.reg != nil {
		e.reg.Close()
		e.reg, e.opReg = nil, nil
	}
	for _, nc := range []*nats.Conn{e.nc, e.sys} {
		if nc != nil {
			nc.Close()
		}
	}
	e.nc, e.sys = nil, nil
}
