package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// UndeployOptions are the inputs of `fogctl undeploy`.
type UndeployOptions struct {
	F    *Factory
	ID   string
	Wait bool
}

// NewCmdUndeploy builds `fogctl undeploy ID`.
func NewCmdUndeploy(f *Factory, runF func(context.Context, *UndeployOptions) error) *cobra.Command {
	opts := &UndeployOptions{F: f}
	cmd := &cobra.Command{
		Use: "undeploy ID", Short: "Stop a deployment and remove its container, mounts, mappings and clones", Args: exactArgs(1, "a deployment ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return undeployRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait until the agent has removed everything")
	return cmd
}

func undeployRun(ctx context.Context, opts *UndeployOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	var store layering.Store
	if d, err := st.Deployment(ctx, opts.ID); err == nil && d.Status.Phase == spec.PhaseSuspended {
		// Its suspension's images are removed here: no node holds it.
		l, err := opts.F.openLayering(ctx)
		if err != nil {
			return err
		}
		defer l.Close()
		store = l.Store
	}
	if err := scheduler.Undeploy(ctx, st, store, opts.ID); err != nil {
		return err
	}
	for opts.Wait {
		held, err := st.HasStatus(ctx, opts.ID)
		if err != nil {
			return err
		}
		if !held {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	fmt.Fprintf(opts.F.ErrOut, "Undeploying %s\n", opts.ID)
	return nil
}
