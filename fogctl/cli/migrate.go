package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// NewCmdMigrate builds `fogctl migrate ID [--node N]`.
func NewCmdMigrate(f *Factory, runF func(context.Context, *LifecycleOptions) error) *cobra.Command {
	opts := &LifecycleOptions{F: f, Wait: true}
	cmd := lifecycleCmd(opts, runF, migrateRun, "migrate ID", "Move a running deployment to another node with its memory and files",
		"Migrate suspends a Running deployment on its node and resumes it on another (the one given, or the one\n"+
			"the PoP places it on), same ID and state, at a new address; the target reads its checkpoint from the\n"+
			"node it leaves (under CRIU, from 32 MiB of checkpoint, its memory after it runs there). If the resume\n"+
			"fails there, it is resumed back where it was: it is never on two nodes. A node lost before its target\n"+
			"has its checkpoint and memory loses the instance (Failed, lost during migration). It reports the time\n"+
			"it did not answer.")
	cmd.Flags().StringVar(&opts.Node, "node", "", "the node to move it to (default: the PoP places it on another)")
	return cmd
}

func migrateRun(ctx context.Context, o *LifecycleOptions) error {
	st, err := o.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Fprintf(o.F.ErrOut, "==> migrating %s\n", o.ID)
	m, err := scheduler.Migrate(ctx, st, o.ID, o.Node)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.F.ErrOut, "==> %s moved from %s to %s: %s without an answer, checkpoint of %s\n", m.ID, m.From, m.To,
		m.Downtime.Round(time.Millisecond), mibs(m.Bytes))
	return printOut(o.F, m, func(w io.Writer) { fmt.Fprintf(w, "%s\t%s\t%s\t%v\n", m.ID, m.From, m.To, m.Ports) })
}

// NodeDrainOptions are the inputs of `fogctl node drain`.
type NodeDrainOptions struct {
	F        *Factory
	Name     string
	Parallel int
	Reason   string
}

// NewCmdNodeDrain builds `fogctl node drain NODE`.
func NewCmdNodeDrain(f *Factory, runF func(context.Context, *NodeDrainOptions) error) *cobra.Command {
	opts := &NodeDrainOptions{F: f}
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Cordon a node and move every deployment running there to the others, with its state",
		Long: "Drain cordons the node (no new work goes there) and migrates each Running deployment on it to another\n" +
			"node (`fogctl migrate`), --parallel at a time, then reports what moved where and how long each did not\n" +
			"answer. `fogctl node uncordon NODE` lets work back once the node is ready again.",
		Args: exactArgs(1, "a node name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if err := layering.ValidateName("NODE", opts.Name); err != nil {
				return usageError{err}
			}
			if opts.Parallel < 1 || opts.Parallel > 64 {
				return usageError{fmt.Errorf("--parallel %d: give 1 to 64", opts.Parallel)}
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return nodeDrainRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().IntVar(&opts.Parallel, "parallel", 4, "how many deployments move at once")
	cmd.Flags().StringVar(&opts.Reason, "reason", "drained", "why it is cordoned, shown by `fogctl node ls` (one line)")
	return cmd
}

func nodeDrainRun(ctx context.Context, o *NodeDrainOptions) error {
	st, err := o.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Fprintf(o.F.ErrOut, "==> draining %s (cordoned: %s)\n", o.Name, o.Reason)
	start := time.Now()
	moved, err := scheduler.Drain(ctx, st, o.Name, o.Parallel, o.Reason)
	if perr := printOut(o.F, moved, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tAPP\tFROM\tTO\tDOWNTIME\tCHECKPOINT\tERROR")
		for _, m := range moved {
			to, down, why := m.To, "-", m.Error
			if to == "" {
				to = "-"
			}
			if m.To != "" && m.Error == "" {
				down = m.Downtime.Round(time.Millisecond).String()
			}
			if why == "" {
				why = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, m.App, m.From, to, down, mibs(m.Bytes), why)
		}
	}); perr != nil {
		return perr
	}
	fmt.Fprintf(o.F.ErrOut, "==> %s drained of %d deployment(s) in %s\n", o.Name, len(moved), time.Since(start).Round(time.Millisecond))
	return err
}
