package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
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
	g, err := refreshGeneration(ctx, f, st, opts.App, opts.Node)
	if err != nil {
		return err
	}
	return printOut(f, g, func(w io.Writer) {
		fmt.Fprintf(w, "%s\tgeneration %d\t%s\t%s\n", g.App, g.Gen, layering.FormatSize(g.Bytes), g.Timings)
	})
}

// refreshGeneration has a node with app's engine (node, or the one
// placement picks) boot app, checkpoint it and seal a new generation,
// showing its phases on f's error output, and returns the generation.
func refreshGeneration(ctx context.Context, f *Factory, st *state.Store, app, node string) (spec.Generation, error) {
	d, err := scheduler.Create(ctx, st, scheduler.Request{App: app, Node: node, Mode: spec.ModeCheckpoint}, "fogctl")
	if err != nil {
		return spec.Generation{}, err
	}
	fmt.Fprintf(f.ErrOut, "==> checkpoint refresh %s of %s placed on %s\n", d.ID, d.App, d.Node)
	dep, err := waitDeployment(ctx, f, st, d.ID)
	// The request is done (or failed): withdraw it either way.
	if derr := st.DeleteDeployment(context.WithoutCancel(ctx), d.ID); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return spec.Generation{}, err
	}
	gens, err := st.Checkpoints(ctx, app)
	if err != nil {
		return spec.Generation{}, err
	}
	for _, g := range gens {
		if g.Gen == dep.Status.Gen {
			return g, nil
		}
	}
	return spec.Generation{}, fmt.Errorf("generation %d of %s was sealed by %s but is not recorded", dep.Status.Gen, app, d.Node)
}
