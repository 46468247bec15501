package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// EnvFlattenOptions are the inputs of `fogctl env flatten`.
type EnvFlattenOptions struct {
	F    *Factory
	Name string
}

// NewCmdEnvFlatten builds `fogctl env flatten`.
func NewCmdEnvFlatten(f *Factory, runF func(context.Context, *EnvFlattenOptions) error) *cobra.Command {
	opts := &EnvFlattenOptions{F: f}
	return &cobra.Command{
		Use:               "flatten NAME",
		Short:             "Give an environment a chain of depth 0 (copies its shared blocks)",
		Args:              exactArgs(1, "one environment NAME"),
		ValidArgsFunction: completeEnvNames(f),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return envFlattenRun(cmd.Context(), opts)
		},
	}
}

func envFlattenRun(ctx context.Context, opts *EnvFlattenOptions) error {
	l, err := opts.F.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	if _, err := l.Manager.Flatten(ctx, opts.Name, opts.F.Progress()); err != nil {
		return err
	}
	info, err := l.Manager.Inspect(ctx, opts.Name)
	if err != nil {
		return err
	}
	return printOut(opts.F, info, func(w io.Writer) {
		fmt.Fprintf(w, "Flattened %s: now %s, depth %d\n", info.Name, info.Ref, info.Depth)
	})
}
