package cli

import (
	"fmt"
	"io"
	"strconv"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// NewCmdPool groups the warm pool's commands.
func NewCmdPool(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Show the warm pools: idle slots that deploys take without provisioning", RunE: groupRunE}
	var node string
	ls := &cobra.Command{
		Use: "ls [APP]", Aliases: []string{"list"}, Args: cobra.MaximumNArgs(1),
		Short: "List each node's warm pool per app: size, idle slots (and how many were restored ahead), provisioning slots, hits, misses, last refill, and whether it holds the checkpoint; the spare slots, made for no app, as app spare",
		Example: `  fogctl pool ls
  fogctl pool ls redis -o json
  fogctl pool ls spare`,
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			// A node or an app that is not there is an error, not an
			// empty list.
			if node != "" {
				if _, err := st.Node(cmd.Context(), node); err != nil {
					return err
				}
			}
			if len(args) == 1 && args[0] != spec.SpareApp { // the nodes' spare slots, made for no app
				if _, err := st.App(cmd.Context(), args[0]); err != nil {
					return err
				}
			}
			pools, err := st.Pools(cmd.Context(), node)
			if err != nil {
				return err
			}
			if len(args) == 1 {
				var mine []state.Pool
				for _, p := range pools {
					if p.App == args[0] {
						mine = append(mine, p)
					}
				}
				pools = mine
			}
			if pools == nil {
				pools = []state.Pool{}
			}
			return printOut(f, pools, func(w io.Writer) {
				fmt.Fprintln(w, "NODE\tAPP\tGEN\tLOCAL\tSIZE\tIDLE\tRESTORED AHEAD\tPROVISIONING\tHITS\tMISSES\tLAST REFILL")
				for _, p := range pools {
					refill := "-"
					if p.LastRefillMS > 0 {
						refill = fmt.Sprintf("%.0f ms", p.LastRefillMS)
					}
					local := "no"
					if p.Local {
						local = "yes"
					}
					fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Node, p.App, p.Gen, local, p.Size, p.Idle, p.Ahead, p.Provisioning, p.Hits, p.Misses, refill)
				}
				if len(pools) == 0 {
					fmt.Fprintln(w, "(no warm pool and no local checkpoint: set `pool:` in an app's spec, `fogctl app pool APP N`, or agent.pool_size)")
				}
			})
		}),
	}
	addNodeFlag(ls, &node, "only this node's pools")
	cmd.AddCommand(ls)
	return cmd
}

// newCmdAppPool builds `fogctl app pool APP SIZE`.
func newCmdAppPool(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "pool APP SIZE",
		Short: "Set how many idle slots of an app each node keeps ready (0: none; \"default\": the node's agent.pool_size)",
		Example: `  fogctl app pool redis 2
  fogctl app pool redis default`,
		Args: exactArgs(2, "an app name and a pool size"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			app, err := st.App(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if args[1] == "default" {
				app.Pool = nil
			} else {
				n, err := strconv.Atoi(args[1])
				if err != nil {
					return fmt.Errorf("%w: pool size %q: give a number of slots, 0 to %d, or default", layering.ErrInvalid, args[1], spec.MaxPool)
				}
				app.Pool = &n
			}
			if err := app.Validate(); err != nil {
				return fmt.Errorf("%w: %w", layering.ErrInvalid, err)
			}
			if err := st.CreateApp(cmd.Context(), app, true); err != nil {
				return err
			}
			return printOut(f, app, func(w io.Writer) {
				if app.Pool == nil {
					fmt.Fprintf(w, "App %s: each node keeps its default number of idle slots (agent.pool_size)\n", app.Name)
					return
				}
				fmt.Fprintf(w, "App %s: each node keeps %d idle slot(s) of its newest generation (`fogctl pool ls %s` shows them)\n", app.Name, *app.Pool, app.Name)
			})
		}),
	}
}
