package natsops

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

func applyOption(t *testing.T, o nats.Option) nats.Options {
	t.Helper()
	var opts nats.Options
	if o != nil {
		if err := o(&opts); err != nil {
			t.Fatal(err)
		}
	}
	return opts
}

func TestCredentialFormsBecomeConnectOptions(t *testing.T) {
	account, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	upub, _ := user.PublicKey()
	claims := jwt.NewUserClaims(upub)
	token, err := claims.Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a .creds file gives a user JWT and seed", func(t *testing.T) {
		o, err := credentialOption(creds)
		if err != nil {
			t.Fatal(err)
		}
		opts := applyOption(t, o)
		if opts.UserJWT == nil || opts.SignatureCB == nil {
			t.Fatalf("no JWT callbacks set")
		}
		got, err := opts.UserJWT()
		if err != nil || got != token {
			t.Fatalf("JWT %q, %v", got, err)
		}
	})
	t.Run("user:password splits at the first colon", func(t *testing.T) {
		opts := applyOption(t, mustOption(t, []byte("app:pa:ss\n")))
		if opts.User != "app" || opts.Password != "pa:ss" {
			t.Fatalf("user %q password %q", opts.User, opts.Password)
		}
	})
	t.Run("anything else is a token", func(t *testing.T) {
		opts := applyOption(t, mustOption(t, []byte("s3cr3t")))
		if opts.Token != "s3cr3t" {
			t.Fatalf("token %q", opts.Token)
		}
	})
	t.Run("empty means no authentication", func(t *testing.T) {
		if o := mustOption(t, nil); o != nil {
			t.Fatalf("option for empty credentials")
		}
	})
	t.Run("a broken .creds file is refused without echoing it", func(t *testing.T) {
		bad := []byte("-----BEGIN NATS USER JWT-----\nnot-a-jwt-SECRETPART\n------END NATS USER JWT------\n")
		_, err := credentialOption(bad)
		if !errors.Is(err, ErrBadCredentials) || strings.Contains(err.Error(), "SECRETPART") {
			t.Fatalf("error %v", err)
		}
	})
}

func mustOption(t *testing.T, b []byte) nats.Option {
	t.Helper()
	o, err := credentialOption(b)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestAuthOptionsRefuseABadTLSBundleWithoutEchoingIt(t *testing.T) {
	_, err := AuthOptions(nil, map[string][]byte{"ca.crt": []byte("not a certificate SECRETPART")})
	if !errors.Is(err, ErrBadCredentials) || strings.Contains(err.Error(), "SECRETPART") {
		t.Fatalf("error %v", err)
	}
	opts, err := AuthOptions([]byte("app:pw"), nil)
	if err != nil || len(opts) != 1 {
		t.Fatalf("user:password without TLS: %d options, %v", len(opts), err)
	}
}
