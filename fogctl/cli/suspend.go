package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	hintpkg "github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// LifecycleOptions are the inputs of `fogctl suspend` and `fogctl resume`.
type LifecycleOptions struct {
	F    *Factory
	ID   string
	Node string // resume only: "" lets the PoP place it
	Wait bool
}

// NewCmdSuspend builds `fogctl suspend ID`.
func NewCmdSuspend(f *Factory, runF func(context.Context, *LifecycleOptions) error) *cobra.Command {
	opts := &LifecycleOptions{F: f}
	cmd := lifecycleCmd(opts, runF, suspendRun, "suspend ID",
		"Checkpoint a running deployment with its file-system changes into the cluster and release its node",
		"Suspend checkpoints a Running deployment's instance, memory and file-system changes together, into RBD\n"+
			"images sealed as snapshots, and releases its slot on its node. The deployment stays, Suspended on no\n"+
			"node (`fogctl ps`), until `fogctl resume` restores it on any node, or `fogctl undeploy` removes it.")
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait until it is Suspended, showing the suspend's phases")
	return cmd
}

// NewCmdResume builds `fogctl resume ID [--node N]`.
func NewCmdResume(f *Factory, runF func(context.Context, *LifecycleOptions) error) *cobra.Command {
	opts := &LifecycleOptions{F: f}
	cmd := lifecycleCmd(opts, runF, resumeRun, "resume ID",
		"Restore a suspended deployment, with its memory and files, on a node of the PoP",
		"Resume restores a Suspended deployment on the node given, or the one the PoP places it on, from its\n"+
			"suspension: same ID, same state, a new address in its status. A resume that fails leaves it Suspended,\n"+
			"saying why.")
	cmd.Flags().StringVar(&opts.Node, "node", "", "the node to resume it on (default: the PoP places it)")
	cmd.Flags().BoolVar(&opts.Wait, "wait", false, "wait until it runs again, showing the resume's phases")
	return cmd
}

// lifecycleCmd is the command of a verb on one deployment (suspend,
// resume, migrate): its ID, and --node checked when given.
func lifecycleCmd(opts *LifecycleOptions, runF, run func(context.Context, *LifecycleOptions) error, use, short, long string) *cobra.Command {
	if runF == nil {
		runF = run
	}
	return &cobra.Command{
		Use: use, Short: short, Long: long, Args: exactArgs(1, "a deployment ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if opts.Node != "" {
				if err := layering.ValidateName("--node", opts.Node); err != nil {
					return usageError{err}
				}
			}
			return runF(cmd.Context(), opts)
		},
	}
}

func suspendRun(ctx context.Context, o *LifecycleOptions) error {
	st, err := o.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	d, err := st.RequestSuspend(ctx, o.ID)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.F.ErrOut, "==> suspending %s on %s\n", d.ID, d.Node)
	if o.Wait {
		if d, err = followLifecycle(ctx, o.F, st, o.ID, spec.PhaseRunning, func(d state.Deployment) bool {
			return d.Status.Phase == spec.PhaseSuspended || d.Status.Phase == spec.PhaseFailed
		}); err != nil {
			return err
		}
		if s := d.Status.Suspension; s != nil {
			fmt.Fprintf(o.F.ErrOut, "==> %s Suspended: checkpoint of %s and its files in %s (%s)\n", d.ID, mibs(s.Bytes), s.Env.Image, s.Timings)
		}
	}
	return printOut(o.F, d, func(w io.Writer) { fmt.Fprintf(w, "%s\t%s\n", d.ID, d.Status.Phase) })
}

func resumeRun(ctx context.Context, o *LifecycleOptions) error {
	st, err := o.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	d, err := st.RequestResume(ctx, o.ID, o.Node, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.F.ErrOut, "==> resuming %s on %s (%s)\n", d.ID, d.Node, d.Placement)
	if o.Wait {
		if d, err = followLifecycle(ctx, o.F, st, o.ID, spec.PhaseSuspended, func(d state.Deployment) bool {
			p := d.Status.Phase
			return p == spec.PhaseRunning || p == spec.PhaseFailed || p == spec.PhaseSuspended && d.Status.Error != ""
		}); err != nil {
			return err
		}
		fmt.Fprintf(o.F.ErrOut, "==> %s Running on %s at %v\n", d.ID, d.Node, d.Status.Ports)
	}
	return printOut(o.F, d, func(w io.Writer) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%v\n", d.ID, d.Status.Phase, d.Node, d.Status.Ports)
	})
}

// followLifecycle follows deployment id until done, printing each phase
// of the suspend or resume as it passes (none while its status is still
// in phase from, whose phases are those of what came before); a
// deployment that failed, or is Suspended with the error of its resume,
// is an error.
func followLifecycle(ctx context.Context, f *Factory, st *state.Store, id string, from spec.Phase, done func(state.Deployment) bool) (state.Deployment, error) {
	seen := 0
	d, err := st.Follow(ctx, id, func(d state.Deployment) bool {
		if d.Status.Phase == from {
			return done(d)
		}
		ts := d.Status.Timings
		if s := d.Status.Suspension; s != nil && d.Status.Phase == spec.PhaseSuspended {
			ts = s.Timings
		}
		for ; seen < len(ts); seen++ {
			fmt.Fprintf(f.ErrOut, "    %-16s %s\n", ts[seen].Name, ts[seen].Duration.Round(time.Millisecond))
		}
		return done(d)
	})
	if err != nil {
		return d, err
	}
	if d.Status.Error != "" {
		err := fmt.Errorf("deployment %s is %s: %s", id, d.Status.Phase, d.Status.Error)
		if d.Status.Hint != "" {
			err = hintpkg.With(err, d.Status.Hint)
		}
		return d, err
	}
	return d, nil
}

func mibs(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
