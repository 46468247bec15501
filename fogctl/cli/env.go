package cli

import (
	"context"

	"github.com/spf13/cobra"
)

// NewCmdEnv groups the environment commands.
func NewCmdEnv(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Manage container environments (RBD snapshot/clone chains)",
		Long: `An environment is an RBD image holding a container's root filesystem,
sealed by a protected snapshot that instances and other environments are
cloned from. Build files add layers: each step is a clone of the previous
snapshot, changed and sealed in turn, and cached by content.`,
		RunE: groupRunE,
	}
	cmd.AddCommand(NewCmdEnvImport(f, nil), NewCmdEnvBuild(f, nil), NewCmdEnvLs(f, nil),
		NewCmdEnvInspect(f, nil), NewCmdEnvRm(f, nil), NewCmdEnvFlatten(f, nil), NewCmdEnvPrune(f, nil), NewCmdEnvExec(f, nil))
	return cmd
}

// completeEnvNames completes environment names from the catalog.
func completeEnvNames(f *Factory) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		l, err := f.Layering(cmd.Context())
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer l.Close()
		tags, err := l.Store.Tags(context.WithoutCancel(cmd.Context()))
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names := make([]string, 0, len(tags))
		for n := range tags {
			names = append(names, n)
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}
