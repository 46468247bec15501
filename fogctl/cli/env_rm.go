package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// EnvRmOptions are the inputs of `fogctl env rm`.
type EnvRmOptions struct {
	F     *Factory
	Names []string
}

// NewCmdEnvRm builds `fogctl env rm`.
func NewCmdEnvRm(f *Factory, runF func(context.Context, *EnvRmOptions) error) *cobra.Command {
	opts := &EnvRmOptions{F: f}
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove environments (refused while clones of them exist)",
		Long: `Remove environments. An environment whose snapshot still has clones
(running instances, or environments built on it) is refused with the
names of the clones. Cached layers that nothing else uses go with it.`,
		Aliases:           []string{"remove"},
		ValidArgsFunction: completeEnvNames(f),
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("env rm takes at least one environment NAME")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Names = args
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return envRmRun(cmd.Context(), opts)
		},
	}
}

type rmResult struct {
	Name    string   `json:"name"`
	Removed []string `json:"removed_images"`
}

func envRmRun(ctx context.Context, opts *EnvRmOptions) error {
	l, err := opts.F.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	var results []rmResult
	var errs []error
	for _, n := range opts.Names {
		removed, err := l.Manager.Remove(ctx, n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if removed == nil {
			removed = []string{}
		}
		results = append(results, rmResult{Name: n, Removed: removed})
	}
	if err := printOut(opts.F, results, func(w io.Writer) {
		for _, r := range results {
			fmt.Fprintf(w, "Removed %s (%d images)\n", r.Name, len(r.Removed))
		}
	}); err != nil {
		return err
	}
	return errors.Join(errs...)
}
