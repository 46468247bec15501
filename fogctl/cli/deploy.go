package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/spf13/cobra"

	hintpkg "github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// DeployOptions are the inputs of `fogctl deploy`.
type DeployOptions struct {
	F    *Factory
	Node string
	Mode spec.Mode
	Wait bool
}

// NewCmdDeploy builds `fogctl deploy APP`.
func NewCmdDeploy(f *Factory) *cobra.Command {
	o := &DeployOptions{F: f}
	cmd := &cobra.Command{
		Use:   "deploy APP",
		Short: "Deploy an instance of an app (placed on a node unless --node)",
		Long: `Records a deployment in the PoP's state; the agent of the chosen node
deploys it in the deployment's mode (--mode), else the app's, else auto:

  auto     boot or restore, whichever has been faster for the app on the
           node (a new app restores first; fogctl app costs APP shows the
           numbers and the next choice); the status says which and why
  restore  restore the app from its checkpoint, booting and checkpointing
           it first if it has none
  boot     run it normally, without a checkpoint engine

A node without an engine boots too, unless its agent has if_no_engine: fail.
--wait shows the phases as they pass and waits until Running.`,
		Args: exactArgs(1, "an app name"),
		RunE: func(cmd *cobra.Command, args []string) error { return deployRun(cmd.Context(), o, args[0]) },
	}
	addNodeFlag(cmd, &o.Node, "node to deploy on (default: the best-scored ready node)")
	cmd.Flags().StringVar((*string)(&o.Mode), "mode", "", "auto, restore or boot (default: the app's mode, else auto)")
	cmd.Flags().BoolVar(&o.Wait, "wait", false, "wait until the deployment is Running (or Failed)")
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{string(spec.ModeAuto), string(spec.ModeRestore), string(spec.ModeBoot)}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func deployRun(ctx context.Context, o *DeployOptions, app string) error {
	if err := spec.ValidateMode(o.Mode); err != nil {
		return usageError{fmt.Errorf("--mode %q: %s", o.Mode, spec.ModeHelp)}
	}
	st, err := o.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	d, err := scheduler.Create(ctx, st, scheduler.Request{App: app, Node: o.Node, Mode: o.Mode}, "fogctl")
	if err != nil {
		return err
	}
	fmt.Fprintf(o.F.ErrOut, "==> deployment %s of %s placed on %s\n", d.ID, d.App, d.Node)
	if !o.Wait {
		return printOut(o.F, d, func(w io.Writer) { fmt.Fprintln(w, d.ID) })
	}
	dep, err := waitDeployment(ctx, o.F, st, d.ID)
	if err != nil {
		return err
	}
	return printOut(o.F, dep, func(w io.Writer) {
		fmt.Fprintf(w, "%s\t%s\t%s\tgen %d\t%s\n", dep.ID, dep.Status.Phase, dep.Node, dep.Status.Gen, dep.Status.Timings)
	})
}

// failedError is a Failed deployment's error as its agent recorded it; it
// matches the sentinel of its cause, so that fogctl exits with the code
// the failure would have had in this process.
type failedError struct {
	msg, cause string
}

func (e failedError) Error() string { return e.msg }

func (e failedError) Is(target error) bool {
	switch e.cause {
	case state.CauseUnavailable:
		return target == layering.ErrUnavailable
	case state.CauseInvalid:
		return target == layering.ErrInvalid
	case state.CauseNotFound:
		return target == layering.ErrNotFound
	}
	return false
}

// waitDeployment follows a deployment's status until Running or Failed,
// printing each phase as it passes.
func waitDeployment(ctx context.Context, f *Factory, st *state.Store, id string) (state.Deployment, error) {
	seen := 0
	dep, err := st.Follow(ctx, id, func(dep state.Deployment) bool {
		for ; seen < len(dep.Status.Timings); seen++ {
			p := dep.Status.Timings[seen]
			fmt.Fprintf(f.ErrOut, "    %-16s %s\n", p.Name, p.Duration.Round(time.Millisecond))
		}
		return state.Settled(dep.Status.Phase)
	})
	if err != nil {
		return dep, err
	}
	switch dep.Status.Phase {
	case spec.PhaseCheckpointed:
		fmt.Fprintf(f.ErrOut, "==> %s sealed generation %d of %s on %s\n", id, dep.Status.Gen, dep.App, dep.Node)
	case spec.PhaseRunning:
		kind := "restored from generation " + strconv.Itoa(dep.Status.Gen)
		if dep.Status.Reason != "" {
			kind += ": " + dep.Status.Reason
		}
		switch {
		case dep.Status.Mode == spec.ModeBoot:
			kind = "booted without a checkpoint: " + dep.Status.BootReason
		case dep.Status.Booted:
			kind = "booted, checkpointed as generation " + strconv.Itoa(dep.Status.Gen) + ", restored"
		}
		fmt.Fprintf(f.ErrOut, "==> %s Running on %s (%s) at %v\n", id, dep.Node, kind, dep.Status.Ports)
	case spec.PhaseFailed:
		var err error = failedError{msg: fmt.Sprintf("deployment %s failed on %s: %s", id, dep.Node, dep.Status.Error), cause: dep.Status.Cause}
		if dep.Status.Hint != "" {
			err = hintpkg.With(err, dep.Status.Hint)
		}
		return dep, err
	}
	return dep, nil
}
