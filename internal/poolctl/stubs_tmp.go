package poolctl

// Temporary stubs so the tree compiles while the registry work lands.
// The registry change replaces every one of them; delete this file then.

import (
	"context"
	"errors"
	"time"
)

var errNotYet = errors.New("not implemented yet")

func (p *PG) ClaimMany(ctx context.Context, m MemberRef, under int64, units []string) ([]ClaimOutcome, error) {
	return nil, errNotYet
}
func (p *PG) ReleaseMany(ctx context.Context, tokens []Token) ([]error, error) { return nil, errNotYet }
func (p *PG) SetRetiring(ctx context.Context, topology string, units []string) error {
	return errNotYet
}
func (p *PG) ReportActivity(ctx context.Context, m MemberRef, units []UnitActivity) error {
	return errNotYet
}
func (p *PG) Activity(ctx context.Context, topology string) ([]ActivityReport, error) {
	return nil, errNotYet
}
func (p *PG) ClaimHistory(ctx context.Context, topology string) ([]ClaimEvent, error) {
	return nil, errNotYet
}
func (p *PG) LeaseHistory(ctx context.Context, topology string) ([]LeaseEvent, error) {
	return nil, errNotYet
}
func (p *PG) EpochHistory(ctx context.Context, topology string) ([]EpochSpan, error) {
	return nil, errNotYet
}
func (p *PG) PruneHistory(ctx context.Context, topology string, before time.Time) error {
	return errNotYet
}

func (t *Twin) ClaimMany(ctx context.Context, m MemberRef, under int64, units []string) ([]ClaimOutcome, error) {
	return nil, errNotYet
}
func (t *Twin) ReleaseMany(ctx context.Context, tokens []Token) ([]error, error) { return nil, errNotYet }
func (t *Twin) SetRetiring(ctx context.Context, topology string, units []string) error {
	return errNotYet
}
func (t *Twin) ReportActivity(ctx context.Context, m MemberRef, units []UnitActivity) error {
	return errNotYet
}
func (t *Twin) Activity(ctx context.Context, topology string) ([]ActivityReport, error) {
	return nil, errNotYet
}
