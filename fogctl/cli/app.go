package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/gc"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// NewCmdApp groups the app commands.
func NewCmdApp(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "app", Short: "Manage app specs", RunE: groupRunE}
	create := newCmdAppCreate(f)

	ls := &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List apps", Args: cobra.NoArgs,
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			apps, err := st.Apps(cmd.Context())
			if err != nil {
				return err
			}
			return printOut(f, apps, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tENV\tENGINE\tPORTS\tREADY\tCOMMAND")
				for _, a := range apps {
					var ports []string
					for _, p := range a.Ports {
						ports = append(ports, deploy.PortKey(p.Port, p.Proto))
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Name, a.Env, a.Engine, strings.Join(ports, ","), a.Ready.Kind, strings.Join(a.Command, " "))
				}
			})
		})}
	inspect := &cobra.Command{Use: "inspect NAME", Short: "Show an app's spec, checkpoints and what its deploys cost on each node", Args: exactArgs(1, "an app name"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			a, err := st.App(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			gens, err := st.Checkpoints(cmd.Context(), a.Name)
			if err != nil {
				return err
			}
			costs, err := appCosts(cmd.Context(), st, a.Name)
			if err != nil {
				return err
			}
			limits, err := appLimits(cmd.Context(), st, a)
			if err != nil {
				return err
			}
			out := map[string]any{"app": a, "checkpoints": gens, "costs": costs, "limits": limits}
			return printOut(f, out, func(w io.Writer) {
				b, _ := json.MarshalIndent(a, "", "  ")
				fmt.Fprintf(w, "%s\ncheckpoints: %d\n", b, len(gens))
				for _, n := range slices.Sorted(maps.Keys(limits)) {
					fmt.Fprintf(w, "limits on %s: %s\n", n, describeLimits(limits[n]))
				}
				for _, c := range costs {
					fmt.Fprintf(w, "costs on %s: boot %s, restore %s, hit %s; next %s, %s\n", c.Node, c.boot(), c.restore(), c.hit(), c.next(), c.Next.Reason)
				}
			})
		})}
	var appRmWait time.Duration
	rm := &cobra.Command{Use: "rm NAME", Short: "Remove an app and its checkpoint generations (refused while it has deployments)",
		Long: `Removes the app, what its deploys cost, and its checkpoint generations (their
images and records): an app created again under the name starts afresh.
A generation that clones still use (the app's warm-pool slots, which the
agents release once the app is gone) stays until ` + "`fogctl gc`" + ` removes it; one
that only the nodes' read-only copies of its environment hold is waited
for (--wait) while the agents drop them.`,
		Args: exactArgs(1, "an app name"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			ctx := cmd.Context()
			gens, err := st.Checkpoints(ctx, args[0])
			if err != nil {
				return err
			}
			if err := st.DeleteApp(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(f.ErrOut, "Removed app %s\n", args[0])
			if len(gens) == 0 {
				return nil
			}
			l, err := f.Layering(ctx)
			if err != nil {
				return fmt.Errorf("the app's %d checkpoint generation(s) stay until `fogctl gc` removes them: %w", len(gens), err)
			}
			defer l.Close()
			for _, g := range gens {
				if err := gc.RemoveGenerationWaiting(ctx, l.Store, st, g.App, g.Gen, appRmWait, progressTo(f)); err != nil {
					fmt.Fprintf(f.ErrOut, "Generation %d of %s stays until `fogctl gc` removes it: %v\n", g.Gen, g.App, err)
					continue
				}
				fmt.Fprintf(f.ErrOut, "Removed generation %d of %s\n", g.Gen, g.App)
			}
			return nil
		})}
	rm.Flags().DurationVar(&appRmWait, "wait", time.Minute, "how long to wait for the nodes to drop their copies of a generation's environment")
	cmd.AddCommand(create, ls, inspect, newCmdAppCosts(f), newCmdAppPool(f), rm)
	return cmd
}
