package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/spf13/cobra"
)

// AppInspectOptions are the inputs of `fogctl app inspect`.
type AppInspectOptions struct {
	F    *Factory
	Name string
}

// NewCmdAppInspect builds `fogctl app inspect NAME`.
func NewCmdAppInspect(f *Factory, runF func(context.Context, *AppInspectOptions) error) *cobra.Command {
	opts := &AppInspectOptions{F: f}
	return &cobra.Command{Use: "inspect NAME", Short: "Show an app's spec, checkpoints and what its deploys cost on each node", Args: exactArgs(1, "an app name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return appInspectRun(cmd.Context(), opts)
		},
	}
}

func appInspectRun(ctx context.Context, opts *AppInspectOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	a, err := st.App(ctx, opts.Name)
	if err != nil {
		return err
	}
	gens, err := st.Checkpoints(ctx, a.Name)
	if err != nil {
		return err
	}
	costs, err := appCosts(ctx, st, a.Name)
	if err != nil {
		return err
	}
	limits, err := appLimits(ctx, st, a)
	if err != nil {
		return err
	}
	out := map[string]any{"app": a, "checkpoints": gens, "costs": costs, "limits": limits}
	return printOut(opts.F, out, func(w io.Writer) {
		b, _ := json.MarshalIndent(a, "", "  ")
		fmt.Fprintf(w, "%s\ncheckpoints: %d\n", b, len(gens))
		for _, n := range slices.Sorted(maps.Keys(limits)) {
			fmt.Fprintf(w, "limits on %s: %s\n", n, describeLimits(limits[n]))
		}
		for _, c := range costs {
			fmt.Fprintf(w, "costs on %s: boot %s, restore %s, hit %s; next %s, %s\n", c.Node, c.boot(), c.restore(), c.hit(), c.next(), c.Next.Reason)
		}
	})
}
