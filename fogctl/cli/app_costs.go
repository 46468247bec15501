package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// nodeCosts is what deploys of an app cost on one node, with the medians
// and what mode auto would choose there next.
type nodeCosts struct {
	adaptive.Costs
	BootMedianMS    float64           `json:"boot_median_ms"`
	RestoreMedianMS float64           `json:"restore_median_ms"`
	HitMedianMS     float64           `json:"hit_median_ms"`
	Next            adaptive.Decision `json:"next"`
	// NextEngine is, for an app of engine auto, the engine whose
	// generation a restore would take (among those measured on the node).
	NextEngine engine.Name `json:"next_engine,omitempty"`
}

func (c nodeCosts) boot() string { return median(c.Costs.Boot) }
func (c nodeCosts) hit() string  { return median(c.Costs.Hit) }

// next says the choice: boot, restore, or restore (pool slot).
func (c nodeCosts) next() string {
	next := string(c.Next.Mode)
	switch {
	case c.Next.Why == adaptive.WhyPoolSlot:
		next += " (pool slot)"
	case c.NextEngine != "" && c.Next.Mode == spec.ModeRestore:
		next += " (" + string(c.NextEngine) + ")"
	}
	return next
}

// restore is the restores' median, per engine for an app of engine auto.
func (c nodeCosts) restore() string {
	if len(c.EngineRestore) == 0 {
		return median(c.Costs.Restore)
	}
	var parts []string
	for _, e := range spec.Engines {
		if s, ok := c.EngineRestore[e]; ok {
			parts = append(parts, string(e)+" "+median(s))
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
	d := s.Median()
	if d < 100*time.Millisecond {
		return fmt.Sprintf("%.1f ms (%d %s)", float64(d)/float64(time.Millisecond), len(s), runs)
	}
	return fmt.Sprintf("%.2f s (%d %s)", d.Seconds(), len(s), runs)
}

// appCosts reads what deploys of app cost on each node that recorded some,
// and what mode auto would choose there next: the situation each node's
// agent sees (whether a slot of the app waits there, whether the app has a
// generation that node can run, the pool it keeps).
func appCosts(ctx context.Context, st *state.Store, app string) ([]nodeCosts, error) {
	a, err := st.App(ctx, app)
	if err != nil {
		return nil, err
	}
	cs, err := st.Costs(ctx, app)
	if err != nil {
		return nil, err
	}
	nodes, err := st.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	gens, err := st.Checkpoints(ctx, app)
	if err != nil {
		return nil, err
	}
	byNode := map[string]state.Node{}
	for _, n := range nodes {
		byNode[n.Name] = n
	}
	out := make([]nodeCosts, 0, len(cs))
	for _, c := range cs {
		nc := nodeCosts{Costs: c, BootMedianMS: ms(c.Boot), HitMedianMS: ms(c.Hit)}
		view := c
		if len(c.EngineRestore) > 0 {
			var measured []engine.Name
			for _, e := range spec.Engines {
				if _, ok := c.EngineRestore[e]; ok {
					measured = append(measured, e)
				}
			}
			nc.NextEngine, _, _ = adaptive.ChooseEngine(c, measured)
			view = c.ForEngine(nc.NextEngine)
		}
		nc.RestoreMedianMS = ms(view.Restore)
		n := byNode[c.Node]
		sit := adaptive.Situation{CannotBoot: n.Problems["boot"], PoP: cs}
		if a.Pool != nil {
			sit.Pool = *a.Pool
		}
		if pools, err := st.Pools(ctx, c.Node); err == nil {
			for _, p := range pools {
				if p.App == app {
					sit.SlotWaiting, sit.Pool = p.Idle > 0, p.Size
				}
			}
		}
		for _, g := range gens {
			if (len(g.Spec.Command) == 0 || g.Spec.SameProcess(a)) && (n.Engines == nil || slices.Contains(n.Engines, g.Engine)) {
				sit.Generation = true
			}
		}
		nc.Next = adaptive.Decide(view, sit)
		out = append(out, nc)
	}
	return out, nil
}

func ms(s adaptive.Samples) float64 { return float64(s.Median()) / float64(time.Millisecond) }

// newCmdAppCosts builds `fogctl app costs APP`.
func newCmdAppCosts(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "costs APP",
		Short: "Show what deploys of an app cost on each node, and what mode auto chooses next",
		Long: `Shows, per node, the medians of the app's recent boots, restores without a
slot and pool hits there (the deploy's critical path: clone, map, mount,
container and ready; the last 9 runs of each) and what a deploy of mode auto
would do next on the node, and why: take a slot that waits (pool slot), make
the app's generation when it has none, else the faster of boot and restore.
The node's agent records each deploy, the boot of a first deploy included; a
new checkpoint generation starts the restores afresh, a spec that runs
another process (command, environment, variables, working directory, user,
engine) the boots.`,
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
				fmt.Fprintln(w, "NODE\tBOOT\tRESTORE\tHIT\tGEN\tNEXT\tWHY")
				for _, c := range costs {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", c.Node, c.boot(), c.restore(), c.hit(), c.Gen, c.next(), c.Next.Reason)
				}
			})
		}),
	}
}
