package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// nodeCosts is what deploys of an app cost on one node, with the medians
// and what mode auto would choose there next.
type nodeCosts struct {
	adaptive.Costs
	BootMedianMS    float64           `json:"boot_median_ms"`
	RestoreMedianMS float64           `json:"restore_median_ms"`
	Next            adaptive.Decision `json:"next"`
	// NextEngine is, for an app of engine auto, the engine whose
	// generation a restore would take (among those measured on the node).
	NextEngine string `json:"next_engine,omitempty"`
}

func (c nodeCosts) boot() string { return median(c.Costs.Boot) }

// restore is the restores' median, per engine for an app of engine auto.
func (c nodeCosts) restore() string {
	if len(c.EngineRestore) == 0 {
		return median(c.Costs.Restore)
	}
	var parts []string
	for _, e := range spec.Engines {
		if s, ok := c.EngineRestore[e]; ok {
			parts = append(parts, e+" "+median(s))
		}
	}
	return strings.Join(parts, ", ")
}

func median(s adaptive.Samples) string {
	if len(s) == 0 {
		return "-"
	}
	runs := "runs"
	if len(s) == 1 {
		runs = "run"
	}
	return fmt.Sprintf("%.2f s (%d %s)", s.Median().Seconds(), len(s), runs)
}

// appCosts reads what deploys of app cost on each node that recorded some.
func appCosts(ctx context.Context, st *state.Store, app string) ([]nodeCosts, error) {
	cs, err := st.Costs(ctx, app)
	if err != nil {
		return nil, err
	}
	nodes, err := st.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	cannotBoot := map[string]string{}
	for _, n := range nodes {
		cannotBoot[n.Name] = n.Problems["boot"]
	}
	out := make([]nodeCosts, 0, len(cs))
	for _, c := range cs {
		nc := nodeCosts{Costs: c, BootMedianMS: float64(c.Boot.Median()) / float64(time.Millisecond)}
		view := c
		if len(c.EngineRestore) > 0 {
			var measured []string
			for _, e := range spec.Engines {
				if _, ok := c.EngineRestore[e]; ok {
					measured = append(measured, e)
				}
			}
			nc.NextEngine, _, _ = adaptive.ChooseEngine(c, measured)
			view = c.ForEngine(nc.NextEngine)
		}
		nc.RestoreMedianMS = float64(view.Restore.Median()) / float64(time.Millisecond)
		nc.Next = adaptive.Decide(view, cannotBoot[c.Node])
		out = append(out, nc)
	}
	return out, nil
}

// newCmdAppCosts builds `fogctl app costs APP`.
func newCmdAppCosts(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "costs APP",
		Short: "Show what deploys of an app cost on each node, and what mode auto chooses next",
		Long: `Shows, per node, the medians of the app's recent boots and restores there (the
deploy's critical path: clone, map, mount, container and ready; the last 9
runs of each) and what a deploy of mode auto would do next on the node, and
why. The node's agent records each deploy; a new checkpoint generation
starts the restores afresh, a new app spec the boots.`,
		Args: exactArgs(1, "an app name"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			if _, err := st.App(cmd.Context(), args[0]); err != nil {
				return err
			}
			costs, err := appCosts(cmd.Context(), st, args[0])
			if err != nil {
				return err
			}
			return printOut(f, costs, func(w io.Writer) {
				fmt.Fprintln(w, "NODE\tBOOT\tRESTORE\tGEN\tNEXT\tWHY")
				for _, c := range costs {
					next := string(c.Next.Mode)
					if c.NextEngine != "" && c.Next.Mode == deploy.ModeRestore {
						next += " (" + c.NextEngine + ")"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", c.Node, c.boot(), c.restore(), c.Gen, next, c.Next.Reason)
				}
			})
		}),
	}
}
