package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

// NewCmdPs builds `fogctl ps`.
func NewCmdPs(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use: "ps", Short: "List deployments with their phase and per-phase timings", Args: cobra.NoArgs,
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			deps, err := st.Deployments(cmd.Context())
			if err != nil {
				return err
			}
			return printOut(f, deps, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tAPP\tNODE\tPHASE\tMODE\tGEN\tREADY-IN\tADDRESS")
				for _, d := range deps {
					mode, total := d.Status.Mode, time.Duration(0)
					if d.Status.Booted {
						mode = "checkpoint+restore"
					}
					for _, p := range d.Status.Timings {
						total += p.Duration
					}
					var addrs []string
					for _, a := range d.Status.Ports {
						addrs = append(addrs, a)
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.App, d.Node, d.Status.Phase, mode, d.Status.Gen,
						total.Round(time.Millisecond), strings.Join(addrs, ","))
				}
			})
		}),
	}
}
