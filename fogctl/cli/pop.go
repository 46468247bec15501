package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/gc"
	hintpkg "github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// openState connects to the PoP's etcd.
func (f *Factory) openState(ctx context.Context) (*state.Store, error) {
	c, err := f.Config()
	if err != nil {
		return nil, err
	}
	return state.Open(ctx, wire.StateConfig(c))
}

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

// NewCmdApp groups the app commands.
func NewCmdApp(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "app", Short: "Manage app specs", RunE: groupRunE}
	create := newCmdAppCreate(f)

	ls := &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List apps", Args: cobra.NoArgs,
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			apps, err := st.Apps(cmd.Context())
			if err != nil {
				return err
			}
			return printOut(f, apps, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tENV\tENGINE\tPORTS\tREADY\tCOMMAND")
				for _, a := range apps {
					var ports []string
					for _, p := range a.Ports {
						ports = append(ports, deploy.PortKey(p.Port, p.Proto))
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Name, a.Env, a.Engine, strings.Join(ports, ","), a.Ready.Kind, strings.Join(a.Command, " "))
				}
			})
		})}
	inspect := &cobra.Command{Use: "inspect NAME", Short: "Show an app's spec, checkpoints and what its deploys cost on each node", Args: exactArgs(1, "an app name"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			a, err := st.App(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			gens, err := st.Checkpoints(cmd.Context(), a.Name)
			if err != nil {
				return err
			}
			costs, err := appCosts(cmd.Context(), st, a.Name)
			if err != nil {
				return err
			}
			limits, err := appLimits(cmd.Context(), st, a)
			if err != nil {
				return err
			}
			out := map[string]any{"app": a, "checkpoints": gens, "costs": costs, "limits": limits}
			return printOut(f, out, func(w io.Writer) {
				b, _ := json.MarshalIndent(a, "", "  ")
				fmt.Fprintf(w, "%s\ncheckpoints: %d\n", b, len(gens))
				for _, n := range slices.Sorted(maps.Keys(limits)) {
					fmt.Fprintf(w, "limits on %s: %s\n", n, describeLimits(limits[n]))
				}
				for _, c := range costs {
					fmt.Fprintf(w, "costs on %s: boot %s, restore %s, hit %s; next %s, %s\n", c.Node, c.boot(), c.restore(), c.hit(), c.next(), c.Next.Reason)
				}
			})
		})}
	var appRmWait time.Duration
	rm := &cobra.Command{Use: "rm NAME", Short: "Remove an app and its checkpoint generations (refused while it has deployments)",
		Long: `Removes the app, what its deploys cost, and its checkpoint generations (their
images and records): an app created again under the name starts afresh.
A generation that clones still use (the app's warm-pool slots, which the
agents release once the app is gone) stays until ` + "`fogctl gc`" + ` removes it; one
that only the nodes' read-only copies of its environment hold is waited
for (--wait) while the agents drop them.`,
		Args: exactArgs(1, "an app name"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			ctx := cmd.Context()
			gens, err := st.Checkpoints(ctx, args[0])
			if err != nil {
				return err
			}
			if err := st.DeleteApp(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(f.ErrOut, "Removed app %s\n", args[0])
			if len(gens) == 0 {
				return nil
			}
			l, err := f.Layering(ctx)
			if err != nil {
				return fmt.Errorf("the app's %d checkpoint generation(s) stay until `fogctl gc` removes them: %w", len(gens), err)
			}
			defer l.Close()
			for _, g := range gens {
				if err := gc.RemoveGenerationWaiting(ctx, l.Store, st, g.App, g.Gen, appRmWait, progressTo(f)); err != nil {
					fmt.Fprintf(f.ErrOut, "Generation %d of %s stays until `fogctl gc` removes it: %v\n", g.Gen, g.App, err)
					continue
				}
				fmt.Fprintf(f.ErrOut, "Removed generation %d of %s\n", g.Gen, g.App)
			}
			return nil
		})}
	rm.Flags().DurationVar(&appRmWait, "wait", time.Minute, "how long to wait for the nodes to drop their copies of a generation's environment")
	cmd.AddCommand(create, ls, inspect, newCmdAppCosts(f), newCmdAppPool(f), rm)
	return cmd
}

// DeployOptions are the inputs of `fogctl deploy`.
type DeployOptions struct {
	F    *Factory
	Node string
	Mode deploy.Mode
	Wait bool
}

// NewCmdDeploy builds `fogctl deploy APP`.
func NewCmdDeploy(f *Factory) *cobra.Command {
	o := &DeployOptions{F: f}
	cmd := &cobra.Command{
		Use:   "deploy APP",
		Short: "Deploy an instance of an app (placed on a node unless --node)",
		Long: `Records a deployment in the PoP's state; the agent of the chosen node
deploys it in the deployment's mode (--mode), else the app's, else auto:

  auto     boot or restore, whichever has been faster for the app on the
           node (a new app restores first; fogctl app costs APP shows the
           numbers and the next choice); the status says which and why
  restore  restore the app from its checkpoint, booting and checkpointing
           it first if it has none
  boot     run it normally, without a checkpoint engine

A node without an engine boots too, unless its agent has if_no_engine: fail.
--wait shows the phases as they pass and waits until Running.`,
		Args: exactArgs(1, "an app name"),
		RunE: func(cmd *cobra.Command, args []string) error { return deployRun(cmd.Context(), o, args[0]) },
	}
	addNodeFlag(cmd, &o.Node, "node to deploy on (default: the best-scored ready node)")
	cmd.Flags().StringVar((*string)(&o.Mode), "mode", "", "auto, restore or boot (default: the app's mode, else auto)")
	cmd.Flags().BoolVar(&o.Wait, "wait", false, "wait until the deployment is Running (or Failed)")
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{string(deploy.ModeAuto), string(deploy.ModeRestore), string(deploy.ModeBoot)}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func deployRun(ctx context.Context, o *DeployOptions, app string) error {
	if err := deploy.ValidateMode(o.Mode); err != nil {
		return usageError{fmt.Errorf("--mode %q: %s", o.Mode, deploy.ModeHelp)}
	}
	st, err := o.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	d, err := scheduler.Create(ctx, st, scheduler.Request{App: app, Node: o.Node, Mode: o.Mode}, "fogctl")
	if err != nil {
		return err
	}
	fmt.Fprintf(o.F.ErrOut, "==> deployment %s of %s placed on %s\n", d.ID, d.App, d.Node)
	if !o.Wait {
		return printOut(o.F, d, func(w io.Writer) { fmt.Fprintln(w, d.ID) })
	}
	dep, err := waitDeployment(ctx, o.F, st, d.ID)
	if err != nil {
		return err
	}
	return printOut(o.F, dep, func(w io.Writer) {
		fmt.Fprintf(w, "%s\t%s\t%s\tgen %d\t%s\n", dep.ID, dep.Status.Phase, dep.Node, dep.Status.Gen, dep.Status.Timings)
	})
}

// failedError is a Failed deployment's error as its agent recorded it; it
// matches the sentinel of its cause, so that fogctl exits with the code
// the failure would have had in this process.
type failedError struct {
	msg, cause string
}

func (e failedError) Error() string { return e.msg }

func (e failedError) Is(target error) bool {
	switch e.cause {
	case state.CauseUnavailable:
		return target == layering.ErrUnavailable
	case state.CauseInvalid:
		return target == layering.ErrInvalid
	case state.CauseNotFound:
		return target == layering.ErrNotFound
	}
	return false
}

// waitDeployment follows a deployment's status until Running or Failed,
// printing each phase as it passes.
func waitDeployment(ctx context.Context, f *Factory, st *state.Store, id string) (state.Deployment, error) {
	wch := st.Client().Watch(ctx, state.Prefix+"status/"+id)
	seen := 0
	for {
		dep, err := st.Deployment(ctx, id)
		if err != nil {
			return dep, err
		}
		for ; seen < len(dep.Status.Timings); seen++ {
			p := dep.Status.Timings[seen]
			fmt.Fprintf(f.ErrOut, "    %-16s %s\n", p.Name, p.Duration.Round(time.Millisecond))
		}
		switch dep.Status.Phase {
		case deploy.PhaseCheckpointed:
			fmt.Fprintf(f.ErrOut, "==> %s sealed generation %d of %s on %s\n", id, dep.Status.Gen, dep.App, dep.Node)
			return dep, nil
		case deploy.PhaseRunning:
			kind := "restored from generation " + strconv.Itoa(dep.Status.Gen)
			if dep.Status.Reason != "" {
				kind += ": " + dep.Status.Reason
			}
			switch {
			case dep.Status.Mode == deploy.ModeBoot:
				kind = "booted without a checkpoint: " + dep.Status.BootReason
			case dep.Status.Booted:
				kind = "booted, checkpointed as generation " + strconv.Itoa(dep.Status.Gen) + ", restored"
			}
			fmt.Fprintf(f.ErrOut, "==> %s Running on %s (%s) at %v\n", id, dep.Node, kind, dep.Status.Ports)
			return dep, nil
		case deploy.PhaseFailed:
			var err error = failedError{msg: fmt.Sprintf("deployment %s failed on %s: %s", id, dep.Node, dep.Status.Error), cause: dep.Status.Cause}
			if dep.Status.Hint != "" {
				err = hintpkg.With(err, dep.Status.Hint)
			}
			return dep, err
		}
		select {
		case <-ctx.Done():
			return dep, ctx.Err()
		case _, ok := <-wch:
			if !ok {
				return dep, ctx.Err()
			}
		case <-time.After(2 * time.Second):
		}
	}
}

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

// NewCmdUndeploy builds `fogctl undeploy ID`.
func NewCmdUndeploy(f *Factory) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use: "undeploy ID", Short: "Stop a deployment and remove its container, mounts, mappings and clones", Args: exactArgs(1, "a deployment ID"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			ctx := cmd.Context()
			if err := st.DeleteDeployment(ctx, args[0]); err != nil {
				return err
			}
			if wait {
				for {
					r, err := st.Client().Get(ctx, state.Prefix+"status/"+args[0], clientv3.WithCountOnly())
					if err != nil {
						return err
					}
					if r.Count == 0 {
						break
					}
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(200 * time.Millisecond):
					}
				}
			}
			fmt.Fprintf(f.ErrOut, "Undeploying %s\n", args[0])
			return nil
		}),
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the agent has removed everything")
	return cmd
}

// NewCmdLogs builds `fogctl logs ID`.
func NewCmdLogs(f *Factory) *cobra.Command {
	var tail int
	cmd := &cobra.Command{
		Use: "logs ID", Short: "Show a deployment's last output lines (from its node's agent)", Args: exactArgs(1, "a deployment ID"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			ctx := cmd.Context()
			dep, err := st.Deployment(ctx, args[0])
			if err != nil {
				return err
			}
			nodes, err := st.Nodes(ctx)
			if err != nil {
				return err
			}
			api := ""
			for _, n := range nodes {
				if n.Name == dep.Node {
					api = n.API
				}
			}
			if api == "" {
				return fmt.Errorf("node %s of deployment %s: %w", dep.Node, dep.ID, layering.ErrNotFound)
			}
			c, err := f.Config()
			if err != nil {
				return err
			}
			agent, err := newAgentAPI(c, dep.Node, api)
			if err != nil {
				return err
			}
			resp, err := agent.get(ctx, dep.Node, "/v1/deployments/"+dep.ID+"/logs?tail="+strconv.Itoa(tail))
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var body struct {
				Lines []string `json:"lines"`
				Error string   `json:"error"`
				Hint  string   `json:"hint,omitempty"`
			}
			if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&body); err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return hintpkg.With(fmt.Errorf("agent of %s: %s (HTTP %d)", dep.Node, body.Error, resp.StatusCode), body.Hint)
			}
			return printOut(f, body, func(w io.Writer) { fmt.Fprintln(w, strings.Join(body.Lines, "\n")) })
		}),
	}
	cmd.Flags().IntVar(&tail, "tail", 100, "number of lines")
	return cmd
}

// NewCmdCheckpoint groups the checkpoint commands.
func NewCmdCheckpoint(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "checkpoint", Short: "List, refresh and remove checkpoint generations", RunE: groupRunE}
	ls := &cobra.Command{Use: "ls [APP]", Short: "List checkpoint generations", Args: cobra.MaximumNArgs(1),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			app := ""
			if len(args) == 1 {
				app = args[0]
			}
			gens, err := st.Checkpoints(cmd.Context(), app)
			if err != nil {
				return err
			}
			return printOut(f, gens, func(w io.Writer) {
				fmt.Fprintln(w, "APP\tGEN\tENGINE\tSIZE\tBOOT-READY\tCHECKPOINT\tNODE\tCREATED")
				for _, g := range gens {
					fmt.Fprintf(w, "%s\t%d\t%s %s\t%s\t%.0fms\t%.0fms\t%s\t%s\n", g.App, g.Gen, g.Engine, g.EngineVersion,
						layering.FormatSize(g.Bytes), g.BootReadyMS, g.CheckpointMS, g.Node, g.Created.Format(time.RFC3339))
				}
			})
		})}
	var rmWait time.Duration
	rm := &cobra.Command{Use: "rm APP GEN", Short: "Remove a checkpoint generation (refused while deployments use it)",
		Long: `Removes a checkpoint generation: its images and record. It is refused while
instances or warm-pool slots use it. When only the nodes' read-only copies
of its environment hold it, the generation is retired (no deploy restores
it any more), and the command waits (--wait) while each agent drops its
copy at its next pool refill.`, Args: exactArgs(2, "an app and a generation"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			gen, err := strconv.Atoi(args[1])
			if err != nil || gen < 1 {
				return fmt.Errorf("%w: generation %q: give a positive number (fogctl checkpoint ls %s)", layering.ErrInvalid, args[1], args[0])
			}
			l, err := f.Layering(ctx)
			if err != nil {
				return err
			}
			defer l.Close()
			st, err := f.State(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			gens, err := st.Checkpoints(ctx, args[0])
			if err != nil {
				return err
			}
			// A recorded generation goes with its record even when its
			// images are gone; one without a record must have images.
			if slices.ContainsFunc(gens, func(g deploy.Generation) bool { return g.Gen == gen }) {
				err = gc.RemoveGenerationWaiting(ctx, l.Store, st, args[0], gen, rmWait, progressTo(f))
			} else {
				err = deploy.RemoveGeneration(ctx, l.Store, args[0], gen)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(f.ErrOut, "Removed generation %d of %s\n", gen, args[0])
			return nil
		}}
	var node string
	refresh := &cobra.Command{Use: "refresh APP", Short: "Produce a new checkpoint generation of an app on a node with its engine",
		Long: `Asks a node that has the app's engine (the best-scored one, or --node) to
boot the app from its current spec and environment, wait until it is ready,
checkpoint it and seal a new generation. Later deploys restore the new
generation; running instances keep theirs. The phases are shown as they pass.`,
		Args: exactArgs(1, "an app name"),
		RunE: withState(f, func(cmd *cobra.Command, args []string, st *state.Store) error {
			ctx := cmd.Context()
			d, err := scheduler.Create(ctx, st, scheduler.Request{App: args[0], Node: node, Mode: deploy.ModeCheckpoint}, "fogctl")
			if err != nil {
				return err
			}
			fmt.Fprintf(f.ErrOut, "==> checkpoint refresh %s of %s placed on %s\n", d.ID, d.App, d.Node)
			dep, err := waitDeployment(ctx, f, st, d.ID)
			// The request is done (or failed): withdraw it either way.
			if derr := st.DeleteDeployment(context.WithoutCancel(ctx), d.ID); derr != nil && err == nil {
				err = derr
			}
			if err != nil {
				return err
			}
			gens, err := st.Checkpoints(ctx, args[0])
			if err != nil {
				return err
			}
			for _, g := range gens {
				if g.Gen == dep.Status.Gen {
					return printOut(f, g, func(w io.Writer) {
						fmt.Fprintf(w, "%s\tgeneration %d\t%s\t%s\n", g.App, g.Gen, layering.FormatSize(g.Bytes), g.Timings)
					})
				}
			}
			return fmt.Errorf("generation %d of %s was sealed by %s but is not recorded", dep.Status.Gen, args[0], d.Node)
		})}
	addNodeFlag(refresh, &node, "node to produce it on (default: the best-scored ready node with the app's engine)")
	rm.Flags().DurationVar(&rmWait, "wait", time.Minute, "how long to wait for the nodes to drop their copies of the generation's environment")
	cmd.AddCommand(ls, refresh, rm)
	return cmd
}

// withState is a command's RunE with the PoP's etcd opened for it and
// closed after.
func withState(f *Factory, run func(cmd *cobra.Command, args []string, st *state.Store) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		st, err := f.State(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		return run(cmd, args, st)
	}
}

// progressTo prints progress lines on f's error output.
func progressTo(f *Factory) func(string) {
	return func(s string) { fmt.Fprintf(f.ErrOut, "==> %s\n", s) }
}
