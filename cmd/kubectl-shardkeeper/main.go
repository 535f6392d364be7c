// Command kubectl-shardkeeper is shardkeeper's command line, usable on its
// own and as a kubectl plugin (kubectl finds it on PATH and runs it as
// "kubectl shardkeeper ..."). It takes kubectl's own flags (--kubeconfig,
// --context, -n, --as and the rest, from k8s.io/cli-runtime), and each verb
// is a package under internal/plugin.
//
//	kubectl shardkeeper status ingest -w
//	kubectl shardkeeper plan ingest
//	kubectl shardkeeper approve ingest --hash 3f2a9c0d1e4b5a69
//
// Exit codes: 0 success, 1 error, 2 usage, 3 status --watch saw Stalled,
// 4 status --watch timed out.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/plugin/abort"
	"github.com/shardkeeper/shardkeeper/internal/plugin/approve"
	"github.com/shardkeeper/shardkeeper/internal/plugin/census"
	"github.com/shardkeeper/shardkeeper/internal/plugin/pause"
	"github.com/shardkeeper/shardkeeper/internal/plugin/plan"
	"github.com/shardkeeper/shardkeeper/internal/plugin/resume"
	"github.com/shardkeeper/shardkeeper/internal/plugin/status"
	"github.com/shardkeeper/shardkeeper/internal/plugin/version"
	internalversion "github.com/shardkeeper/shardkeeper/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := NewRootCmd(plugin.StdStreams()).ExecuteContext(ctx)
	stop()
	code := plugin.CodeOf(err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-shardkeeper:", err)
		// cobra's own "unknown command" has no type to test for.
		if strings.HasPrefix(err.Error(), "unknown command") {
			code = plugin.ExitUsage
		}
	}
	os.Exit(code)
}

// NewRootCmd wires every verb under one root with kubectl's flags.
func NewRootCmd(streams genericiooptions.IOStreams) *cobra.Command {
	f := plugin.NewFactory(streams)
	root := &cobra.Command{
		Use:           "kubectl-shardkeeper",
		Short:         "Day-2 operations on ShardTopologies: status, plan, approve, pause, resume, abort, census",
		Version:       internalversion.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl shardkeeper"},
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.SetVersionTemplate("kubectl-shardkeeper {{.Version}}\n")
	f.ConfigFlags.AddFlags(root.PersistentFlags())
	// Flag errors are usage errors: exit 2, like a missing NAME.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return plugin.Usagef("%v", err) })

	root.AddGroup(&cobra.Group{ID: "observe", Title: "Observe:"}, &cobra.Group{ID: "act", Title: "Act on a rollout:"})
	for _, c := range []*cobra.Command{status.NewCmd(f), plan.NewCmd(f), census.NewCmd(f)} {
		c.GroupID = "observe"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{approve.NewCmd(f), pause.NewCmd(f), resume.NewCmd(f), abort.NewCmd(f)} {
		c.GroupID = "act"
		root.AddCommand(c)
	}
	root.AddCommand(version.NewCmd(f))
	return root
}
