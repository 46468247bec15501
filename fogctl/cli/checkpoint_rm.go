package cli

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/gc"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/spf13/cobra"
)

// CheckpointRmOptions are the inputs of `fogctl checkpoint rm`.
type CheckpointRmOptions struct {
	F    *Factory
	App  string
	Gen  int
	Wait time.Duration
}

// NewCmdCheckpointRm builds `fogctl checkpoint rm APP GEN`.
func NewCmdCheckpointRm(f *Factory, runF func(context.Context, *CheckpointRmOptions) error) *cobra.Command {
	opts := &CheckpointRmOptions{F: f}
	cmd := &cobra.Command{Use: "rm APP GEN", Short: "Remove a checkpoint generation (refused while deployments use it)",
		Long: `Removes a checkpoint generation: its images and record. It is refused while
instances or warm-pool slots use it. When only the nodes' read-only copies
of its environment hold it, the generation is retired (no deploy restores
it any more), and the command waits (--wait) while each agent drops its
copy at its next pool refill.`, Args: exactArgs(2, "an app and a generation"),
		RunE: func(cmd *cobra.Command, args []string) error {
			gen, err := strconv.Atoi(args[1])
			if err != nil || gen < 1 {
				return fmt.Errorf("%w: generation %q: give a positive number (fogctl checkpoint ls %s)", layering.ErrInvalid, args[1], args[0])
			}
			if opts.Wait < 0 {
				return usageError{fmt.Errorf("--wait %s is negative: give how long to wait, e.g. 1m, or 0 not to wait", opts.Wait)}
			}
			opts.App, opts.Gen = args[0], gen
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return checkpointRmRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().DurationVar(&opts.Wait, "wait", time.Minute, "how long to wait for the nodes to drop their copies of the generation's environment")
	return cmd
}

func checkpointRmRun(ctx context.Context, opts *CheckpointRmOptions) error {
	f, gen := opts.F, opts.Gen
	l, err := f.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	st, err := f.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	gens, err := st.Checkpoints(ctx, opts.App)
	if err != nil {
		return err
	}
	// A recorded generation goes with its record even when its
	// images are gone; one without a record must have images.
	if slices.ContainsFunc(gens, func(g spec.Generation) bool { return g.Gen == gen }) {
		err = gc.RemoveGenerationWaiting(ctx, l.Store, st, opts.App, gen, opts.Wait, progressTo(f))
	} else {
		err = catalog.RemoveGeneration(ctx, l.Store, opts.App, gen)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(f.ErrOut, "Removed generation %d of %s\n", gen, opts.App)
	return nil
}
