package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/spf13/cobra"
)

// NewCmdNode groups the node commands.
func NewCmdNode(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "List the nodes of the PoP, and keep new work off one", RunE: groupRunE}
	cmd.AddCommand(NewCmdNodeLs(f, nil), NewCmdNodeCordon(f, nil), NewCmdNodeUncordon(f, nil), NewCmdNodeDrain(f, nil))
	return cmd
}

// NodeLsOptions are the inputs of `fogctl node ls`.
type NodeLsOptions struct {
	F *Factory
}

// NewCmdNodeLs builds `fogctl node ls`.
func NewCmdNodeLs(f *Factory, runF func(context.Context, *NodeLsOptions) error) *cobra.Command {
	opts := &NodeLsOptions{F: f}
	return &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List nodes (Ready while their agent's lease lives; Fenced while their agent acts on nothing, its etcd not the one it knew; Cordoned while no new work goes there)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return nodeLsRun(cmd.Context(), opts)
		},
	}
}

func nodeLsRun(ctx context.Context, opts *NodeLsOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	nodes, err := st.Nodes(ctx)
	if err != nil {
		return err
	}
	deps, err := st.Deployments(ctx)
	if err != nil {
		return err
	}
	pools, err := st.Pools(ctx, "")
	if err != nil {
		return err
	}
	return printOut(opts.F, nodes, func(w io.Writer) {
		fmt.Fprintln(w, "NAME\tSTATUS\tINSTANCES\tPOOL\tCAPACITY\tMAPPER\tENGINES\tAPI")
		for _, n := range nodes {
			count := 0
			for _, d := range deps {
				if d.Node == n.Name {
					count++
				}
			}
			status := "NotReady"
			if n.Ready {
				status = "Ready"
			}
			if n.Fence() != "" {
				status += ",Fenced" // its agent acts on nothing
			}
			if n.Cordon != nil {
				status += ",Cordoned" // no new work
			}
			engines := joinEngines(n.Engines)
			if engines == "" {
				engines = "none (boots only)"
			}
			idle := 0
			for _, p := range pools {
				if p.Node == n.Name {
					idle += p.Idle + p.Provisioning
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", n.Name, status, count, idle, n.Capacity, n.Mapper, engines, n.API)
		}
		// What a node cannot run, and why: a missing DMTCP image,
		// engine or boot image.
		for _, n := range nodes {
			if n.Priority != "" {
				fmt.Fprintf(w, "# %s: warm-pool refill priority: %s\n", n.Name, n.Priority)
			}
		}
		for _, n := range nodes {
			if n.Cordon != nil {
				fmt.Fprintf(w, "# %s: cordoned %s: no new deployment or warm-pool slot; `fogctl node uncordon %s` undoes it\n",
					n.Name, n.Cordon.Describe(), n.Name)
			}
			for _, what := range slices.Sorted(maps.Keys(n.Problems)) {
				if what == state.ProblemControlPlane {
					// Its etcd is not the one it knew: why, and what to do.
					fmt.Fprintf(w, "! %s: fenced, acting on nothing (its instances keep running): %s\n", n.Name, n.Problems[what])
					continue
				}
				fmt.Fprintf(w, "! %s: no %s: %s\n", n.Name, what, n.Problems[what])
			}
		}
	})
}

// joinEngines lists engine names, comma separated.
func joinEngines(engs []engine.Name) string {
	s := make([]string, len(engs))
	for i, e := range engs {
		s[i] = string(e)
	}
	return strings.Join(s, ",")
}
