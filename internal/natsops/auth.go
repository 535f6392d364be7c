package natsops

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// AuthOptions turns the credential forms a ShardTopology's Secrets hold
// into connect options, for the operator and for workers alike:
// credentials are a .creds file (user JWT and nkey seed), "user:password"
// (split at the first colon) or a bare token, empty for none; tlsFiles are
// a TLS Secret's ca.crt, tls.crt and tls.key, empty for plain connections.
// Errors wrap ErrBadCredentials and never quote the values.
func AuthOptions(credentials []byte, tlsFiles map[string][]byte) ([]nats.Option, error) {
	var opts []nats.Option
	auth, err := credentialOption(credentials)
	if err != nil {
		return nil, err
	}
	if auth != nil {
		opts = append(opts, auth)
	}
	if len(tlsFiles) > 0 {
		tc, err := tlsConfig(tlsFiles)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// ErrBadCredentials means a credentials or TLS value could not be used.
// Its messages never quote the value.
var ErrBadCredentials = errors.New("bad NATS credentials")

// credentialOption turns a credentials Secret value into a connect option:
// a .creds file (user JWT and nkey seed), "user:password" (split at the
// first colon), or a bare token. Empty means no authentication (nil).
func credentialOption(content []byte) (nats.Option, error) {
	s := strings.TrimSpace(string(content))
	switch {
	case s == "":
		return nil, nil
	case strings.Contains(s, "-----BEGIN NATS USER JWT-----"):
		userJWT, err := jwt.ParseDecoratedJWT(content)
		if err != nil {
			return nil, fmt.Errorf("%w: .creds file: user JWT: %v", ErrBadCredentials, redactedErr(err))
		}
		kp, err := nkeys.ParseDecoratedNKey(content)
		if err != nil {
			return nil, fmt.Errorf("%w: .creds file: nkey seed: %v", ErrBadCredentials, redactedErr(err))
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, fmt.Errorf("%w: .creds file holds no user seed", ErrBadCredentials)
		}
		return nats.UserJWTAndSeed(userJWT, string(seed)), nil
	}
	if user, pass, ok := strings.Cut(s, ":"); ok {
		return nats.UserInfo(user, pass), nil
	}
	return nats.Token(s), nil
}

// redactedErr keeps an error's kind but not its text, which for key
// parsing could echo key material.
func redactedErr(err error) string {
	if err == nil {
		return ""
	}
	return fmt.Sprintf("%T", err)
}

func tlsConfig(files map[string][]byte) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca := files["ca.crt"]; len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("%w: ca.crt holds no PEM certificate", ErrBadCredentials)
		}
		tc.RootCAs = pool
	}
	crt, key := files["tls.crt"], files["tls.key"]
	if len(crt) > 0 || len(key) > 0 {
		cert, err := tls.X509KeyPair(crt, key)
		if err != nil {
			return nil, fmt.Errorf("%w: tls.crt/tls.key: %v", ErrBadCredentials, redactedErr(err))
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
