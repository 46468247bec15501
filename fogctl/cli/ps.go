package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// PsOptions are the inputs of `fogctl ps`.
type PsOptions struct {
	F *Factory
}

// NewCmdPs builds `fogctl ps`.
func NewCmdPs(f *Factory, runF func(context.Context, *PsOptions) error) *cobra.Command {
	opts := &PsOptions{F: f}
	return &cobra.Command{
		Use: "ps", Short: "List deployments with their phase and per-phase timings", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return psRun(cmd.Context(), opts)
		},
	}
}

func psRun(ctx context.Context, opts *PsOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	deps, err := st.Deployments(ctx)
	if err != nil {
		return err
	}
	return printOut(opts.F, deps, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tAPP\tNODE\tPHASE\tMODE\tGEN\tREADY-IN\tENDPOINT\tADDRESS")
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
			node := d.Node
			if s := d.Status.Suspension; s != nil && d.Status.Phase == spec.PhaseSuspended {
				// On no node: what it holds in the cluster instead.
				node, addrs = "-", []string{fmt.Sprintf("held: checkpoint %s, files %s", mibs(s.Bytes), mibs(s.EnvBytes))}
				if s.Pending != "" {
					// A migration's hand-over: the checkpoint is on that node alone.
					addrs[0] += ", checkpoint on " + s.Pending + " only"
				}
			}
			ready := total.Round(time.Millisecond).String()
			if d.Status.Phase != spec.PhaseRunning {
				ready = "-" // its phases are a suspend's, or a deploy's under way
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.App, node, d.Status.Phase, mode, d.Status.Gen,
				ready, endpointColumn(d.Desired), strings.Join(addrs, ","))
		}
	})
}

// endpointColumn is a deployment's endpoint ports, ":20417" (or
// ":20417->6379/tcp,:20418->8080/tcp" for several), "-" for none.
func endpointColumn(d state.Desired) string {
	ep := d.Endpoint
	if d.OnDemand {
		return "app's, on demand" // its app's shared endpoint (fogctl endpoint ls)
	}
	if len(ep) == 0 {
		return "-"
	}
	if len(ep) == 1 {
		for _, p := range ep {
			return fmt.Sprintf(":%d", p)
		}
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(ep)) {
		out = append(out, fmt.Sprintf(":%d->%s", ep[name], name))
	}
	return strings.Join(out, ",")
}
