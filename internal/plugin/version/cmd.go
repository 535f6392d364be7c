// Package version is "kubectl shardkeeper version": the build identity
// from internal/version, the same the operator and worker report.
package version

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shardkeeper/shardkeeper/internal/plugin"
	"github.com/shardkeeper/shardkeeper/internal/version"
)

// NewCmd returns the version command.
func NewCmd(f *plugin.Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of kubectl-shardkeeper (also --version)",
		Args:  cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			fmt.Fprintf(f.Out, "kubectl-shardkeeper %s\n", version.Get())
			return nil
		},
	}
}
