package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// EnvPruneOptions are the inputs of `fogctl env prune`.
type EnvPruneOptions struct {
	F *Factory
}

// NewCmdEnvPrune builds `fogctl env prune`.
func NewCmdEnvPrune(f *Factory, runF func(context.Context, *EnvPruneOptions) error) *cobra.Command {
	opts := &EnvPruneOptions{F: f}
	return &cobra.Command{
		Use:   "prune",
		Short: "Remove cached layers that no environment uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			l, err := opts.F.Layering(cmd.Context())
			if err != nil {
				return err
			}
			defer l.Close()
			removed, err := l.Manager.Prune(cmd.Context())
			if removed == nil {
				removed = []string{}
			}
			if perr := printOut(opts.F, map[string][]string{"removed_images": removed}, func(w io.Writer) {
				fmt.Fprintf(w, "Removed %d cached layers\n", len(removed))
			}); perr != nil {
				return perr
			}
			return err
		},
	}
}
