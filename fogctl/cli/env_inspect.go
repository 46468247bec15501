package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// EnvInspectOptions are the inputs of `fogctl env inspect`.
type EnvInspectOptions struct {
	F    *Factory
	Name string
}

// NewCmdEnvInspect builds `fogctl env inspect`.
func NewCmdEnvInspect(f *Factory, runF func(context.Context, *EnvInspectOptions) error) *cobra.Command {
	opts := &EnvInspectOptions{F: f}
	return &cobra.Command{
		Use:               "inspect NAME",
		Short:             "Show an environment: chain, sizes, clones, config and history",
		Args:              exactArgs(1, "one environment NAME"),
		ValidArgsFunction: completeEnvNames(f),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return envInspectRun(cmd.Context(), opts)
		},
	}
}

func envInspectRun(ctx context.Context, opts *EnvInspectOptions) error {
	l, err := opts.F.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	e, err := l.Manager.Inspect(ctx, opts.Name)
	if err != nil {
		return err
	}
	return printOut(opts.F, e, func(w io.Writer) {
		fmt.Fprintf(w, "Name:\t%s\n", e.Name)
		fmt.Fprintf(w, "Snapshot:\t%s\n", e.Ref)
		fmt.Fprintf(w, "Size:\t%s\n", layering.FormatSize(e.Size))
		fmt.Fprintf(w, "Used:\t%s (whole chain)\n", layering.FormatSize(e.Used))
		fmt.Fprintf(w, "Depth:\t%d\n", e.Depth)
		fmt.Fprintf(w, "Source:\t%s\n", e.Source)
		fmt.Fprintf(w, "Created:\t%s\n", e.Created.Format("2006-01-02 15:04:05Z07:00"))
		fmt.Fprintf(w, "Env:\t%s\n", strings.Join(e.Config.Env, " "))
		fmt.Fprintf(w, "Workdir:\t%s\n", e.Config.WorkDir)
		fmt.Fprintf(w, "Clones:\t%s\n", strings.Join(e.Children, ", "))
		fmt.Fprintln(w, "Chain:")
		for i, r := range e.Chain {
			fmt.Fprintf(w, "  %d\t%s\n", i, r)
		}
		fmt.Fprintln(w, "History:")
		for _, h := range e.History {
			fmt.Fprintf(w, "  \t%s\n", h)
		}
	})
}
