package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/gc"
)

// GCOptions are the inputs of `fogctl gc`.
type GCOptions struct {
	F *Factory
	// Apps: only these apps' generations (none: every app's).
	Apps   []string
	DryRun bool
	Keep   int
	MinAge time.Duration
	Blanks bool
}

// NewCmdGC builds `fogctl gc [APP...]`.
func NewCmdGC(f *Factory, runF func(context.Context, *GCOptions) error) *cobra.Command {
	o := &GCOptions{F: f}
	cmd := &cobra.Command{
		Use:   "gc [APP...]",
		Short: "Remove orphaned clones, unsealed generations and stale records, and old generations beyond --keep",
		Long: `Compares the pool with the PoP's etcd and removes what has no owner:
instance clones made by this PoP's nodes whose deployment is gone, a NotReady
node's copies of environments and its pool slots that no deployment holds
(listed as kept while a deployment there may hold one its status does not name),
the throwaway clones of a killed ` + "`fogctl env exec`" + ` (one whose exec still runs is kept),
images of generations that were never sealed (when no agent holds the app's
checkpoint lock), checkpoint records whose images are gone, statuses of
withdrawn deployments on NotReady nodes, the generations of each app beyond
the newest --keep that no deployment uses, and with --blanks the pool's blank
filesystem images that no clone uses (every PoP of the pool shares them; a
node makes one again when it needs it). Generations in use are listed as
kept.
Nothing younger than --min-age is touched. --dry-run only shows the plan.
Against an etcd that may not be the PoP's, gc removes nothing and says why:
one without the PoP's record while the pool holds images of deployments or
checkpoints (emptied or replaced: each would look orphaned), or one a node
is fenced from (` + "`fogctl node ls`" + ` shows Fenced). An image that carries
its node's record of its owner (the etcd revision at which the node held
its deployment or app) is kept, and listed as kept with why, where this
etcd did not hold that owner at that revision or has not reached it: an
etcd restored from an older backup while the agents were down.
Node-local leftovers (containers, mappings, mounts) are swept by each pop-agent.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Apps = args
			if runF != nil {
				return runF(cmd.Context(), o)
			}
			return gcRun(cmd.Context(), o)
		},
	}
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "show what would be removed, remove nothing")
	cmd.Flags().IntVar(&o.Keep, "keep", 0, "checkpoint generations to keep per app (default: the config's agent.keep_generations, 3)")
	cmd.Flags().DurationVar(&o.MinAge, "min-age", 10*time.Minute, "spare orphans younger than this")
	cmd.Flags().BoolVar(&o.Blanks, "blanks", false, "also remove the pool's blank filesystem images that no clone uses (shared by every PoP of the pool)")
	return cmd
}

func gcRun(ctx context.Context, o *GCOptions) error {
	if o.Keep == 0 {
		// What the agents keep, so that gc takes none they would keep.
		c, err := o.F.Config()
		if err != nil {
			return err
		}
		o.Keep = c.Agent.KeepGenerations
	}
	if o.Keep < 1 {
		return usageError{fmt.Errorf("--keep %d: keep at least 1 generation per app", o.Keep)}
	}
	if o.MinAge < 0 {
		return usageError{fmt.Errorf("--min-age %s is negative: use e.g. 10m", o.MinAge)}
	}
	l, err := o.F.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	st, err := o.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	cfg := gc.Config{Store: l.Store, State: st, Keep: o.Keep, MinAge: o.MinAge, Apps: o.Apps, Blanks: o.Blanks}
	plan, err := gc.Plan(ctx, cfg)
	if err != nil {
		return err
	}
	done := plan
	if !o.DryRun {
		done, err = gc.Apply(ctx, cfg, plan)
		for _, it := range plan {
			if it.Skip {
				done = append(done, it)
			}
		}
	}
	if done == nil {
		done = []gc.Item{}
	}
	perr := printOut(o.F, done, func(w io.Writer) {
		fmt.Fprintln(w, "ACTION\tKIND\tNAME\tREASON")
		for _, it := range done {
			action := "removed"
			switch {
			case it.Skip:
				action = "kept"
			case o.DryRun:
				action = "would remove"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", action, it.Kind, it.Name, it.Reason)
		}
	})
	if len(plan) == 0 {
		fmt.Fprintln(o.F.ErrOut, "Nothing to collect")
	}
	if err != nil {
		return err
	}
	return perr
}
