package controllers_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/shardkeeper/shardkeeper/internal/operator"
	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
	"github.com/shardkeeper/shardkeeper/internal/testbed/pgtest"
)

// cfg and k reach one real kube-apiserver shared by every test here; each
// test works in its own namespace. PostgreSQL starts on first use, one
// server for the package, one database per test.
var (
	testEnv *kubetest.Environment
	cfg     *rest.Config
	k       client.Client

	pgOnce sync.Once
	pgSrv  *pgtest.Server
	pgErr  error
)

func TestMain(m *testing.M) {
	// The test binary doubles as a worker pod's program (see
	// simworker_test.go): the test kubelet runs it once per pod.
	if os.Getenv(simWorkerEnv) == "1" {
		os.Exit(runSimWorkerProcess())
	}
	// SHARDKEEPER_TEST_LOG=1 shows the operator's logs.
	if os.Getenv("SHARDKEEPER_TEST_LOG") == "1" {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapcore.Level(-1))))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	env, err := kubetest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testEnv, cfg = env, env.Config
	scheme, err := operator.NewScheme()
	if err != nil {
		panic(err)
	}
	if k, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		panic(err)
	}
	code := m.Run()
	if pgSrv != nil {
		pgSrv.Stop()
	}
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop envtest:", err)
	}
	os.Exit(code)
}

// postgres returns the package's PostgreSQL server, starting it on first
// use.
func postgres(t *testing.T) *pgtest.Server {
	t.Helper()
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pgSrv, pgErr = pgtest.Start(ctx)
	})
	if pgErr != nil {
		t.Fatalf("start PostgreSQL: %v", pgErr)
	}
	return pgSrv
}

// newNamespace creates a namespace for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	if err := k.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// eventually polls cond until it returns nil or the deadline passes.
var eventually = testbed.Eventually

// consistently polls cond for the whole duration and fails at the first
// error: for promises that something does NOT happen.
func consistently(t *testing.T, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := cond(); err != nil {
			t.Fatalf("within %s: %v", d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
