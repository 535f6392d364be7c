// Package plugin holds what every verb of kubectl-shardkeeper shares: the
// standard kubectl flags (k8s.io/cli-runtime's ConfigFlags: --kubeconfig,
// --context, --as, -n and the rest), the client built from them, the
// output flags (-o json|yaml|jsonpath|wide), exit codes and the merge
// patch of an annotation.
//
// Each verb is its own package below this one with a NewCmd, after
// CloudNativePG's plugin layout; cmd/kubectl-shardkeeper only wires them
// into the root command. This package owns no verb and talks to neither
// NATS nor the registry: everything it shows comes from the API server.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	topologyv1 "github.com/shardkeeper/shardkeeper/api/v1alpha1"
)

// Exit codes scripts can rely on.
const (
	// ExitError: the command failed (the API server refused, the object
	// is missing, a refused no-op such as pausing a paused topology).
	ExitError = 1
	// ExitUsage: the command line was wrong.
	ExitUsage = 2
	// ExitStalled: status --watch saw the topology Stalled.
	ExitStalled = 3
	// ExitTimeout: status --watch gave up after --timeout.
	ExitTimeout = 4
)

// ExitCodeError carries the process's exit code with the error a verb returns.
type ExitCodeError struct {
	Code int
	Err  error
}

func (e *ExitCodeError) Error() string { return e.Err.Error() }
func (e *ExitCodeError) Unwrap() error { return e.Err }

// WithCode wraps err with an exit code.
func WithCode(code int, err error) error { return &ExitCodeError{Code: code, Err: err} }

// ErrUsage marks errors in how a verb was called.
var ErrUsage = errors.New("usage")

// Usagef returns a usage error (exit code 2).
func Usagef(format string, args ...any) error {
	return WithCode(ExitUsage, fmt.Errorf("%w: "+format, append([]any{ErrUsage}, args...)...))
}

// CodeOf is the exit code for err: 0 for nil.
func CodeOf(err error) int {
	var ec *ExitCodeError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return ec.Code
	case errors.Is(err, ErrUsage):
		return ExitUsage
	}
	return ExitError
}

// Factory is what the verbs share: the kubectl flags, the streams they
// print to, and the scheme of the objects they read.
type Factory struct {
	ConfigFlags *genericclioptions.ConfigFlags
	genericiooptions.IOStreams
	Scheme *runtime.Scheme
	// Now is the clock ages are computed against; nil means time.Now.
	Now func() time.Time
}

// NewFactory returns a Factory over the process's streams.
func NewFactory(streams genericiooptions.IOStreams) *Factory {
	scheme := runtime.NewScheme()
	if err := topologyv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	if err := eventsv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	// status -w reads the workload StatefulSet for a pending pod roll.
	if err := appsv1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	return &Factory{ConfigFlags: genericclioptions.NewConfigFlags(true), IOStreams: streams, Scheme: scheme}
}

// StdStreams are the process's stdin, stdout and stderr.
func StdStreams() genericiooptions.IOStreams {
	return genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
}

// Clock is the factory's now.
func (f *Factory) Clock() time.Time {
	if f.Now != nil {
		return f.Now()
	}
	return time.Now()
}

// Client connects to the API server the kubectl flags name.
func (f *Factory) Client() (client.WithWatch, error) {
	cfg, err := f.ConfigFlags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: f.Scheme})
	if err != nil {
		return nil, fmt.Errorf("connect to the API server: %w", err)
	}
	return c, nil
}

// Namespace is -n, or the kubeconfig context's namespace.
func (f *Factory) Namespace() (string, error) {
	ns, _, err := f.ConfigFlags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("namespace from kubeconfig: %w", err)
	}
	return ns, nil
}

// Get reads one ShardTopology in the namespace of the flags.
func (f *Factory) Get(ctx context.Context, c client.Reader, name string) (*topologyv1.ShardTopology, error) {
	ns, err := f.Namespace()
	if err != nil {
		return nil, err
	}
	t := &topologyv1.ShardTopology{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, t); err != nil {
		return nil, fmt.Errorf("get shardtopology %s/%s: %w", ns, name, err)
	}
	return t, nil
}

// WithTopology connects, reads the ShardTopology NAME in the flags'
// namespace and calls fn with it, under one context bounded by
// --request-timeout: the opening every one-shot verb shares.
func (f *Factory) WithTopology(name string, fn func(ctx context.Context, c client.Client, t *topologyv1.ShardTopology) error) error {
	c, err := f.Client()
	if err != nil {
		return err
	}
	ctx, cancel := f.Context()
	defer cancel()
	t, err := f.Get(ctx, c, name)
	if err != nil {
		return err
	}
	return fn(ctx, c, t)
}

// Context is a context bounded by the kubectl --request-timeout flag, or
// by 30s when it is unset or 0.
func (f *Factory) Context() (context.Context, context.CancelFunc) {
	d := 30 * time.Second
	if rt := f.ConfigFlags.Timeout; rt != nil && *rt != "" && *rt != "0" {
		if parsed, err := time.ParseDuration(*rt); err == nil && parsed > 0 {
			d = parsed
		}
	}
	return context.WithTimeout(context.Background(), d)
}

// OutputFlags are -o and what goes with it. Human output is "" (the
// default) or "wide"; json, yaml, jsonpath=..., name, go-template=... go
// through cli-runtime's printers, so they print what kubectl get would.
type OutputFlags struct {
	print *genericclioptions.PrintFlags
}

// AddOutputFlags registers -o on cmd.
func (f *Factory) AddOutputFlags(cmd *cobra.Command) *OutputFlags {
	pf := genericclioptions.NewPrintFlags("").WithTypeSetter(f.Scheme)
	pf.AddFlags(cmd)
	cmd.Flag("output").Usage = "Output format: wide, json, yaml, name, jsonpath=..., go-template=... (default: a human view)."
	return &OutputFlags{print: pf}
}

// Format is the -o value.
func (o *OutputFlags) Format() string { return *o.print.OutputFormat }

// Human reports whether the verb prints its own view (no -o, or -o wide).
func (o *OutputFlags) Human() bool { return o.Format() == "" || o.Format() == "wide" }

// Wide reports -o wide.
func (o *OutputFlags) Wide() bool { return o.Format() == "wide" }

// Print writes obj with the printer -o asks for.
func (o *OutputFlags) Print(w io.Writer, obj runtime.Object) error {
	p, err := o.print.ToPrinter()
	if err != nil {
		return Usagef("-o %s: %v", o.Format(), err)
	}
	return p.PrintObj(obj, w)
}

// PrintTable writes rows under an upper-case header, the way kubectl get
// does.
func PrintTable(w io.Writer, header []string, rows [][]string) error {
	tw := printers.GetNewTabWriter(w)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(header, "\t")))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// CompleteTopologies is a ValidArgsFunction completing the first argument
// with the names of the ShardTopologies in the namespace.
func (f *Factory) CompleteTopologies(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := f.Client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	ns, err := f.Namespace()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	ctx, cancel := f.Context()
	defer cancel()
	var list topologyv1.ShardTopologyList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var names []string
	for _, t := range list.Items {
		if strings.HasPrefix(t.Name, toComplete) {
			names = append(names, t.Name)
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// ExactlyOneName is a cobra Args check: one NAME, a usage error otherwise.
func ExactlyOneName(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return Usagef("want one ShardTopology NAME, got %d arguments %q", len(args), args)
	}
	return nil
}

// PatchAnnotation sets (value non-nil) or removes (nil) one annotation of
// t with a merge patch carrying t's resourceVersion, so a change someone
// else made since t was read is not overwritten blindly: the API server
// answers Conflict and the person runs the command again.
//
// The operator writes status (and the finalizer) often, and each write
// moves the resourceVersion: abort right after resume failed with "the
// object has been modified" although nothing the person decided on had
// changed. So on a conflict it reads the object again and patches again
// when what a person writes is as they read it: the spec (generation),
// the labels and the annotations, and the object is not being deleted;
// recheck, when given, judges the fresh object too (a verb whose answer
// depends on status refuses there if status now says otherwise).
// Anything else is the conflict it was.
func PatchAnnotation(ctx context.Context, c client.Client, t *topologyv1.ShardTopology, key string, value *string, recheck ...func(*topologyv1.ShardTopology) error) error {
	read := t
	for attempt := 0; ; attempt++ {
		after := read.DeepCopy()
		if value == nil {
			delete(after.Annotations, key)
		} else {
			if after.Annotations == nil {
				after.Annotations = map[string]string{}
			}
			after.Annotations[key] = *value
		}
		err := c.Patch(ctx, after, client.MergeFromWithOptions(read, client.MergeFromWithOptimisticLock{}))
		if err == nil {
			*t = *after
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == 4 {
			return fmt.Errorf("patch annotation %s of shardtopology %s/%s: %w", key, t.Namespace, t.Name, err)
		}
		fresh := &topologyv1.ShardTopology{}
		if gerr := c.Get(ctx, client.ObjectKeyFromObject(t), fresh); gerr != nil {
			return fmt.Errorf("patch annotation %s of shardtopology %s/%s: %w (read again: %v)", key, t.Namespace, t.Name, err, gerr)
		}
		if what := changedByAPerson(t, fresh); what != "" {
			return fmt.Errorf("patch annotation %s of shardtopology %s/%s: %s changed since it was read; run the command again: %w", key, t.Namespace, t.Name, what, err)
		}
		for _, check := range recheck {
			if cerr := check(fresh); cerr != nil {
				return cerr
			}
		}
		read = fresh
	}
}

// changedByAPerson names what differs between the object as read and as
// it is now among what people (or GitOps) write: "" when only what the
// operator writes (status, finalizers) moved.
func changedByAPerson(read, now *topologyv1.ShardTopology) string {
	switch {
	case now.Generation != read.Generation:
		return "its spec"
	case !maps.Equal(now.Annotations, read.Annotations):
		return "its annotations"
	case !maps.Equal(now.Labels, read.Labels):
		return "its labels"
	case !now.DeletionTimestamp.Equal(read.DeletionTimestamp):
		return "its deletion"
	}
	return ""
}

// CheckDataFormat refuses an -o other than "" (the verb's own view), json
// or yaml, for verbs that print a status field rather than the object.
func CheckDataFormat(format string) error {
	if format != "" && format != "json" && format != "yaml" {
		return Usagef("-o must be json or yaml, got %q", format)
	}
	return nil
}

// WriteData writes v as YAML for format "yaml", else as indented JSON;
// what names v in an encoding error.
func WriteData(w io.Writer, format, what string, v any) error {
	var b []byte
	var err error
	if format == "yaml" {
		b, err = yaml.Marshal(v)
	} else {
		b, err = json.MarshalIndent(v, "", "  ")
		b = append(b, '\n')
	}
	if err != nil {
		return fmt.Errorf("encode %s: %w", what, err)
	}
	_, err = w.Write(b)
	return err
}
