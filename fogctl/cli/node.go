package cli

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

// NewCmdNode groups the node commands.
func NewCmdNode(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "List the nodes of the PoP", RunE: groupRunE}
	cmd.AddCommand(&cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List nodes (Ready while their agent's lease lives; Fenced while their agent acts on nothing, its etcd not the one it knew)", Args: cobra.NoArgs,
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			nodes, err := st.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			deps, err := st.Deployments(cmd.Context())
			if err != nil {
				return err
			}
			pools, err := st.Pools(cmd.Context(), "")
			if err != nil {
				return err
			}
			return printOut(f, nodes, func(w io.Writer) {
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
					engines := strings.Join(n.Engines, ",")
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
		}),
	})
	return cmd
}
