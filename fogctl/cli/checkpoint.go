package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/gc"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// NewCmdCheckpoint groups the checkpoint commands.
func NewCmdCheckpoint(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "checkpoint", Short: "List, refresh and remove checkpoint generations", RunE: groupRunE}
	ls := &cobra.Command{Use: "ls [APP]", Short: "List checkpoint generations", Args: cobra.MaximumNArgs(1),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			app := ""
			if len(args) == 1 {
				app = args[0]
			}
			gens, err := st.Checkpoints(cmd.Context(), app)
			if err != nil {
				return err
			}
			return printOut(f, gens, func(w io.Writer) {
				fmt.Fprintln(w, "APP\tGEN\tENGINE\tSIZE\tBOOT-READY\tCHECKPOINT\tNODE\tCREATED")
				for _, g := range gens {
					fmt.Fprintf(w, "%s\t%d\t%s %s\t%s\t%.0fms\t%.0fms\t%s\t%s\n", g.App, g.Gen, g.Engine, g.EngineVersion,
						layering.FormatSize(g.Bytes), g.BootReadyMS, g.CheckpointMS, g.Node, g.Created.Format(time.RFC3339))
				}
			})
		})}
	var rmWait time.Duration
	rm := &cobra.Command{Use: "rm APP GEN", Short: "Remove a checkpoint generation (refused while deployments use it)",
		Long: `Removes a checkpoint generation: its images and record. It is refused while
instances or warm-pool slots use it. When only the nodes' read-only copies
of its environment hold it, the generation is retired (no deploy restores
it any more), and the command waits (--wait) while each agent drops its
copy at its next pool refill.`, Args: exactArgs(2, "an app and a generation"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			gen, err := strconv.Atoi(args[1])
			if err != nil || gen < 1 {
				return fmt.Errorf("%w: generation %q: give a positive number (fogctl checkpoint ls %s)", layering.ErrInvalid, args[1], args[0])
			}
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
			gens, err := st.Checkpoints(ctx, args[0])
			if err != nil {
				return err
			}
			// A recorded generation goes with its record even when its
			// images are gone; one without a record must have images.
			if slices.ContainsFunc(gens, func(g deploy.Generation) bool { return g.Gen == gen }) {
				err = gc.RemoveGenerationWaiting(ctx, l.Store, st, args[0], gen, rmWait, progressTo(f))
			} else {
				err = deploy.RemoveGeneration(ctx, l.Store, args[0], gen)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(f.ErrOut, "Removed generation %d of %s\n", gen, args[0])
			return nil
		}}
	var node string
	refresh := &cobra.Command{Use: "refresh APP", Short: "Produce a new checkpoint generation of an app on a node with its engine",
		Long: `Asks a node that has the app's engine (the best-scored one, or --node) to
boot the app from its current spec and environment, wait until it is ready,
checkpoint it and seal a new generation. Later deploys restore the new
generation; running instances keep theirs. The phases are shown as they pass.`,
		Args: exactArgs(1, "an app name"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			ctx := cmd.Context()
			d, err := scheduler.Create(ctx, st, scheduler.Request{App: args[0], Node: node, Mode: deploy.ModeCheckpoint}, "fogctl")
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
			gens, err := st.Checkpoints(ctx, args[0])
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
			return fmt.Errorf("generation %d of %s was sealed by %s but is not recorded", dep.Status.Gen, args[0], d.Node)
		})}
	addNodeFlag(refresh, &node, "node to produce it on (default: the best-scored ready node with the app's engine)")
	rm.Flags().DurationVar(&rmWait, "wait", time.Minute, "how long to wait for the nodes to drop their copies of the generation's environment")
	cmd.AddCommand(ls, refresh, rm)
	return cmd
}
