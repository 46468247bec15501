package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/spf13/cobra"
)

// CheckpointLsOptions are the inputs of `fogctl checkpoint ls`.
type CheckpointLsOptions struct {
	F   *Factory
	App string // "" for every app
}

// NewCmdCheckpointLs builds `fogctl checkpoint ls [APP]`.
func NewCmdCheckpointLs(f *Factory, runF func(context.Context, *CheckpointLsOptions) error) *cobra.Command {
	opts := &CheckpointLsOptions{F: f}
	return &cobra.Command{Use: "ls [APP]", Short: "List checkpoint generations", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				opts.App = args[0]
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return checkpointLsRun(cmd.Context(), opts)
		},
	}
}

func checkpointLsRun(ctx context.Context, opts *CheckpointLsOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	gens, err := st.Checkpoints(ctx, opts.App)
	if err != nil {
		return err
	}
	return printOut(opts.F, gens, func(w io.Writer) {
		fmt.Fprintln(w, "APP\tGEN\tENGINE\tSIZE\tBOOT-READY\tCHECKPOINT\tNODE\tCREATED")
		for _, g := range gens {
			fmt.Fprintf(w, "%s\t%d\t%s %s\t%s\t%.0fms\t%.0fms\t%s\t%s\n", g.App, g.Gen, g.Engine, g.EngineVersion,
				layering.FormatSize(g.Bytes), g.BootReadyMS, g.CheckpointMS, g.Node, g.Created.Format(time.RFC3339))
		}
	})
}
