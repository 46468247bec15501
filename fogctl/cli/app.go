package cli

import (
	"github.com/spf13/cobra"
)

// NewCmdApp groups the app commands.
func NewCmdApp(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "app", Short: "Manage app specs", RunE: groupRunE}
	cmd.AddCommand(newCmdAppCreate(f), NewCmdAppLs(f, nil), NewCmdAppInspect(f, nil), newCmdAppCosts(f), newCmdAppPool(f), NewCmdAppRm(f, nil))
	return cmd
}
