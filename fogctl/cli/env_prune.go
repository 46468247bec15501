package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// EnvPruneOptions are the inputs of `fogctl env prune`.
type EnvPruneOptions struct {
	F      *Factory
	MinAge time.Duration
}

// NewCmdEnvPrune builds `fogctl env prune`.
func NewCmdEnvPrune(f *Factory, runF func(context.Context, *EnvPruneOptions) error) *cobra.Command {
	opts := &EnvPruneOptions{F: f}
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove cached layers that no environment uses",
		Long: `Removes the cached layers that no environment uses and nothing was cloned
from (what rebuilds with changed steps leave), and the unsealed layers that a
build or an import killed halfway left, once older than --min-age. A layer
that is mapped or open (a build or an import in progress) stays.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.MinAge < 0 {
				return usageError{fmt.Errorf("--min-age %s is negative: use e.g. 10m", opts.MinAge)}
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			l, err := opts.F.Layering(cmd.Context())
			if err != nil {
				return err
			}
			defer l.Close()
			removed, err := l.Manager.Prune(cmd.Context(), layering.PruneOptions{UnsealedMinAge: opts.MinAge})
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
	cmd.Flags().DurationVar(&opts.MinAge, "min-age", layering.DefaultUnsealedMinAge, "spare unsealed layers younger than this (a build or an import may be making them)")
	return cmd
}
