package cli

import (
	"github.com/spf13/cobra"
)

// NewCmdCheckpoint groups the checkpoint commands.
func NewCmdCheckpoint(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "checkpoint", Short: "List, refresh and remove checkpoint generations", RunE: groupRunE}
	cmd.AddCommand(NewCmdCheckpointLs(f, nil), NewCmdCheckpointRefresh(f, nil), NewCmdCheckpointRm(f, nil))
	return cmd
}
