package controllers

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// Configuration errors that retrying cannot fix become a stall naming
// the field (issue 21: a DSN that does not parse, a role that does not
// exist and wrong NATS credentials were retried as ReconcileError
// forever, with Stalled=False "retrying"). They are told apart by class,
// not counted: the registry's and NATS's answers say which they are. The
// stall polls (configErrorPoll): a database administrator may create the
// role, or a NATS operator the user, without the Secret changing, and
// nothing else would bring the topology back.
//
// Messages never carry the DSN: pgx's parse error shows a redacted copy
// of it, and its inner error (net/url's) may show it whole, so the
// message here is written from scratch.

// configErrorPoll is how often a configuration stall looks again.
const configErrorPoll = maxRetryDelay

// PostgreSQL error classes that mean the DSN's credentials or database
// are wrong, not that the server is away.
var registryRefusedCodes = map[string]string{
	"28000": "invalid authorization (for example a role that does not exist)",
	"28P01": "password authentication failed",
	"3D000": "the database does not exist",
	"42501": "the role lacks a privilege the operator needs (CREATE on the database, see README Prerequisites)",
}

// registryConfigStall is the stall for an error opening the registry, or
// nil when a retry may fix it.
func registryConfigStall(err error, ref topologyv1.SecretKeyRef) *StallError {
	field := "spec.registry.dsnSecretRef"
	var parse *pgconn.ParseConfigError
	if errors.As(err, &parse) {
		return &StallError{Reason: topologyv1.ReasonInvalidRegistryDSN, Field: field, Poll: configErrorPoll,
			Detail: fmt.Sprintf("the DSN in Secret %q key %q does not parse; give a PostgreSQL URL (postgres://user:password@host:5432/db?sslmode=require) or key=value string", ref.Name, ref.Key)}
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		if what, ok := registryRefusedCodes[pg.Code]; ok {
			return &StallError{Reason: topologyv1.ReasonRegistryRefused, Field: field, Poll: configErrorPoll,
				Detail: fmt.Sprintf("PostgreSQL refused the DSN in Secret %q key %q: %s (SQLSTATE %s: %s)", ref.Name, ref.Key, what, pg.Code, pg.Message)}
		}
	}
	return nil
}

// natsAuthErrors are the NATS client's answers to credentials the server
// refuses.
var natsAuthErrors = []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired}

// natsConfigStall is the stall for an error connecting with the
// credentials at field, or nil when a retry may fix it.
func natsConfigStall(err error, field string) *StallError {
	for _, e := range natsAuthErrors {
		if errors.Is(err, e) {
			return &StallError{Reason: topologyv1.ReasonNATSAuthorizationFailed, Field: field, Poll: configErrorPoll,
				Detail: fmt.Sprintf("NATS refused these credentials (%v); give a user of the stream account that may use the JetStream API", e)}
		}
	}
	return nil
}

// connStringInError matches the (redacted) connection string pgx puts in
// a parse error, and a URL with a password anywhere in a message.
var connStringInError = regexp.MustCompile("cannot parse `[^`]*`|[a-zA-Z][a-zA-Z0-9+.-]*://[^\\s\"'`@/]*:[^\\s\"'`@]*@[^\\s\"'`]*")

// scrubConnStrings takes connection strings out of an error's text
// before it reaches status, Events or logs.
func scrubConnStrings(msg string) string {
	return connStringInError.ReplaceAllString(msg, "<dsn>")
}
