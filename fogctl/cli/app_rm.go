package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/gc"
	"github.com/spf13/cobra"
)

// AppRmOptions are the inputs of `fogctl app rm`.
type AppRmOptions struct {
	F    *Factory
	Name string
	Wait time.Duration
}

// NewCmdAppRm builds `fogctl app rm NAME`.
func NewCmdAppRm(f *Factory, runF func(context.Context, *AppRmOptions) error) *cobra.Command {
	opts := &AppRmOptions{F: f}
	cmd := &cobra.Command{Use: "rm NAME", Short: "Remove an app and its checkpoint generations (refused while it has deployments)",
		Long: `Removes the app, what its deploys cost, and its checkpoint generations (their
images and records): an app created again under the name starts afresh.
A generation that clones still use (the app's warm-pool slots, which the
agents release once the app is gone) stays until ` + "`fogctl gc`" + ` removes it; one
that only the nodes' read-only copies of its environment hold is waited
for (--wait) while the agents drop them.`,
		Args: exactArgs(1, "an app name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if opts.Wait < 0 {
				return usageError{fmt.Errorf("--wait %s is negative: give how long to wait, e.g. 1m, or 0 not to wait", opts.Wait)}
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return appRmRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().DurationVar(&opts.Wait, "wait", time.Minute, "how long to wait for the nodes to drop their copies of a generation's environment")
	return cmd
}

func appRmRun(ctx context.Context, opts *AppRmOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	f := opts.F
	gens, err := st.Checkpoints(ctx, opts.Name)
	if err != nil {
		return err
	}
	if err := st.DeleteApp(ctx, opts.Name); err != nil {
		return err
	}
	fmt.Fprintf(f.ErrOut, "Removed app %s\n", opts.Name)
	if len(gens) == 0 {
		return nil
	}
	l, err := f.Layering(ctx)
	if err != nil {
		return fmt.Errorf("the app's %d checkpoint generation(s) stay until `fogctl gc` removes them: %w", len(gens), err)
	}
	defer l.Close()
	for _, g := range gens {
		if err := gc.RemoveGenerationWaiting(ctx, l.Store, st, g.App, g.Gen, opts.Wait, progressTo(f)); err != nil {
			fmt.Fprintf(f.ErrOut, "Generation %d of %s stays until `fogctl gc` removes it: %v\n", g.Gen, g.App, err)
			continue
		}
		fmt.Fprintf(f.ErrOut, "Removed generation %d of %s\n", g.Gen, g.App)
	}
	return nil
}
