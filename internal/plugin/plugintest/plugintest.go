// Package plugintest runs the plugin's verbs against the test bed's API
// server (kubetest: kube-apiserver and etcd with the project's CRDs), the
// way a person runs them: through a kubeconfig file and kubectl's flags.
// Each verb package's TestMain starts one Env; each test works in its own
// namespace.
package plugintest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

// Env is a running API server, a kubeconfig file that reaches it as an
// administrator, and a client for arranging objects.
type Env struct {
	kube       *kubetest.Environment
	dir        string
	Kubeconfig string
	Client     client.Client
}

// Start starts the API server; call it from TestMain.
func Start() (*Env, error) {
	kube, err := kubetest.Start()
	if err != nil {
		return nil, err
	}
	e := &Env{kube: kube}
	if err := e.init(); err != nil {
		_ = kube.Stop()
		return nil, err
	}
	return e, nil
}

func (e *Env) init() error {
	kc, err := kubetest.Kubeconfig(e.kube.Config)
	if err != nil {
		return err
	}
	if e.dir, err = os.MkdirTemp("", "plugintest-"); err != nil {
		return err
	}
	e.Kubeconfig = filepath.Join(e.dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kc, 0o600); err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{topologyv1.AddToScheme, corev1.AddToScheme, appsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	e.Client, err = client.New(e.kube.Config, client.Options{Scheme: scheme})
	return err
}

// Stop stops the API server.
func (e *Env) Stop() {
	_ = os.RemoveAll(e.dir)
	_ = e.kube.Stop()
}

// Main is a TestMain body: start, run, stop.
func Main(m *testing.M, env **Env) {
	e, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	e.Stop()
	os.Exit(code)
}

// Namespace creates a namespace for one test.
func (e *Env) Namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// Topology creates a valid ShardTopology named ingest in ns, lets mutate
// shape it, and writes its status as the operator would.
func (e *Env) Topology(t *testing.T, ns string, mutate func(*topologyv1.ShardTopology)) *topologyv1.ShardTopology {
	t.Helper()
	o := &topologyv1.ShardTopology{
		ObjectMeta: metav1.ObjectMeta{Name: "ingest", Namespace: ns},
		Spec: topologyv1.ShardTopologySpec{
			Partitions: 2, ShardsPerPartition: 4,
			NATS:     topologyv1.NATSSpec{URLs: []string{"nats://nats:4222"}},
			Registry: topologyv1.RegistrySpec{DSNSecretRef: topologyv1.SecretKeyRef{Name: "registry", Key: "dsn"}},
			Workload: topologyv1.WorkloadSpec{StatefulSetName: "ingest"},
		},
	}
	if mutate != nil {
		mutate(o)
	}
	st := o.Status
	o.Status = topologyv1.ShardTopologyStatus{}
	ctx := context.Background()
	if err := e.Client.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	o.Status = st
	if o.Status.ObservedGeneration == 0 {
		o.Status.ObservedGeneration = o.Generation
	}
	if err := e.Client.Status().Update(ctx, o); err != nil {
		t.Fatal(err)
	}
	return o
}

// Get reads the topology named ingest in ns.
func (e *Env) Get(t *testing.T, ns string) *topologyv1.ShardTopology {
	t.Helper()
	o := &topologyv1.ShardTopology{}
	if err := e.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "ingest"}, o); err != nil {
		t.Fatal(err)
	}
	return o
}

// Result is what one command line printed and returned.
type Result struct {
	Out, Err string
	Error    error
}

// Code is the exit code the command line would end with.
func (r Result) Code() int { return plugin.CodeOf(r.Error) }

// Run runs one verb as "kubectl shardkeeper --kubeconfig <env's> <args>",
// under a root command with kubectl's flags as the real one has.
func (e *Env) Run(newCmd func(*plugin.Factory) *cobra.Command, args ...string) Result {
	return RunWith(e.Kubeconfig, newCmd, args...)
}

// RunWith runs one verb as Run does, against the API server kubeconfig
// reaches: for tests that bring their own control plane (the operator's).
func RunWith(kubeconfig string, newCmd func(*plugin.Factory) *cobra.Command, args ...string) Result {
	var out, errOut bytes.Buffer
	f := plugin.NewFactory(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	root := &cobra.Command{Use: "kubectl-shardkeeper", SilenceUsage: true, SilenceErrors: true}
	f.ConfigFlags.AddFlags(root.PersistentFlags())
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return plugin.Usagef("%v", err) })
	root.AddCommand(newCmd(f))
	// The kubeconfig goes first: __complete reads its last argument as
	// the word to complete.
	full := []string{"--kubeconfig", kubeconfig}
	if len(args) > 0 && args[0] == "__complete" {
		full = append([]string{"__complete"}, append(full, args[1:]...)...)
	} else {
		full = append(full, args...)
	}
	root.SetArgs(full)
	root.SetOut(&out)
	root.SetErr(&errOut)
	err := root.ExecuteContext(context.Background())
	return Result{Out: out.String(), Err: errOut.String(), Error: err}
}
