package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// EnvLsOptions are the inputs of `fogctl env ls`.
type EnvLsOptions struct {
	F *Factory
}

// NewCmdEnvLs builds `fogctl env ls`.
func NewCmdEnvLs(f *Factory, runF func(context.Context, *EnvLsOptions) error) *cobra.Command {
	opts := &EnvLsOptions{F: f}
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List environments with their snapshot chains",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return envLsRun(cmd.Context(), opts)
		},
	}
}

func envLsRun(ctx context.Context, opts *EnvLsOptions) error {
	l, err := opts.F.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	envs, err := l.Manager.List(ctx)
	if err != nil {
		return err
	}
	return printOut(opts.F, envs, func(w io.Writer) {
		fmt.Fprintln(w, "NAME\tSNAPSHOT\tDEPTH\tSIZE\tUSED\tCLONES\tCHAIN")
		for _, e := range envs {
			chain := make([]string, 0, len(e.Chain))
			for _, r := range e.Chain[1:] {
				chain = append(chain, r.Image)
			}
			c := strings.Join(chain, " <- ")
			if c == "" {
				c = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d\t%s\n", e.Name, e.Ref, e.Depth, layering.FormatSize(e.Size), layering.FormatSize(e.Used), len(e.Children), c)
		}
	})
}
