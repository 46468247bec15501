package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/spf13/cobra"
)

// CheckpointRefreshOptions are the inputs of `fogctl checkpoint refresh`.
type CheckpointRefreshOptions struct {
	F    *Factory
	App  string
	Node string
}

// NewCmdCheckpointRefresh builds `fogctl checkpoint refresh APP`.
func NewCmdCheckpointRefresh(f *Factory, runF func(context.Context, *CheckpointRefreshOptions) error) *cobra.Command {
	opts := &CheckpointRefreshOptions{F: f}
	cmd := &cobra.Command{Use: "refresh APP", Short: "Produce a new checkpoint generation of an app on a node with its engine",
		Long: `Asks a node that has the app's engine (the best-scored one, or --node) to
boot the app from its current spec and environment, wait until it is ready,
checkpoint it and seal a new generation. Later deploys restore the new
generation; running instances keep theirs. The phases are shown as they pass.`,
		Args: exactArgs(1, "an app name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.App = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return checkpointRefreshRun(cmd.Context(), opts)
		},
	}
	addNodeFlag(cmd, &opts.Node, "node to produce it on (default: the best-scored ready node with the app's engine)")
	return cmd
}

func checkpointRefreshRun(ctx context.Context, opts *CheckpointRefreshOptions) error {
	f := opts.F
	st, err := f.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	d, err := scheduler.Create(ctx, st, scheduler.Request{App: opts.App, Node: opts.Node, Mode: spec.ModeCheckpoint}, "fogctl")
	if err != nil {
		return err
	}
	fmt.Fprintf(f.ErrOut, "==> checkpoint refresh %s of %s placed on %s\n", d.ID, d.App, d.Node)
	dep, err := waitDeployment(ctx, f, st, d.ID)
	// The request is done (or failed): withdraw it either way.
	if derr := st.DeleteDeployment(context.WithoutCancel(ctx), d.ID); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return err
	}
	gens, err := st.Checkpoints(ctx, opts.App)
	if err != nil {
		return err
	}
	for _, g := range gens {
		if g.Gen == dep.Status.Gen {
			return printOut(f, g, func(w io.Writer) {
				fmt.Fprintf(w, "%s\tgeneration %d\t%s\t%s\n", g.App, g.Gen, layering.FormatSize(g.Bytes), g.Timings)
			})
		}
	}
	return fmt.Errorf("generation %d of %s was sealed by %s but is not recorded", dep.Status.Gen, opts.App, d.Node)
}
