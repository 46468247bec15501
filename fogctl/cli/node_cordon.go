package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// NodeCordonOptions are the inputs of `fogctl node cordon` and `uncordon`.
type NodeCordonOptions struct {
	F      *Factory
	Name   string
	Reason string
	// Off: uncordon.
	Off bool
}

// NewCmdNodeCordon builds `fogctl node cordon NODE`.
func NewCmdNodeCordon(f *Factory, runF func(context.Context, *NodeCordonOptions) error) *cobra.Command {
	opts := &NodeCordonOptions{F: f}
	cmd := cordonCmd(opts, runF, "cordon NODE", "Keep new deployments and warm-pool slots off a node (what runs there stays)")
	cmd.Long = "Placement skips a cordoned node, a deploy pinned to it with --node is refused, and its agent drops its idle " +
		"warm-pool slots within its reconcile interval. Instances that run there keep running. " +
		"`fogctl node uncordon NODE` undoes it."
	cmd.Flags().StringVar(&opts.Reason, "reason", "", "why, shown by `fogctl node ls` (one line)")
	return cmd
}

// NewCmdNodeUncordon builds `fogctl node uncordon NODE`.
func NewCmdNodeUncordon(f *Factory, runF func(context.Context, *NodeCordonOptions) error) *cobra.Command {
	return cordonCmd(&NodeCordonOptions{F: f, Off: true}, runF, "uncordon NODE", "Let a cordoned node take deployments and keep its warm pool again")
}

func cordonCmd(opts *NodeCordonOptions, runF func(context.Context, *NodeCordonOptions) error, use, short string) *cobra.Command {
	return &cobra.Command{
		Use: use, Short: short, Args: exactArgs(1, "a node name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return nodeCordonRun(cmd.Context(), opts)
		},
	}
}

func nodeCordonRun(ctx context.Context, opts *NodeCordonOptions) error {
	if err := layering.ValidateName("NODE", opts.Name); err != nil {
		return err
	}
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if opts.Off {
		err = st.UncordonNode(ctx, opts.Name)
	} else {
		_, err = st.CordonNode(ctx, opts.Name, opts.Reason)
	}
	if err != nil {
		return err
	}
	n, err := st.Node(ctx, opts.Name)
	if err != nil {
		return err
	}
	return printOut(opts.F, n, func(w io.Writer) {
		if n.Cordon == nil {
			fmt.Fprintf(w, "%s uncordoned: placement and its warm pool use it again\n", n.Name)
			return
		}
		fmt.Fprintf(w, "%s cordoned %s: no new deployment goes there; its idle warm-pool slots go within its agent's reconcile interval\n",
			n.Name, n.Cordon.Describe())
	})
}
