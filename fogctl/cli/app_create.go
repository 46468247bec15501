package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// AppCreateOptions are the inputs of `fogctl app create`.
type AppCreateOptions struct {
	F       *Factory
	File    string
	Replace bool
	App     spec.App
	Ports   []int
	Ready   string
	Timeout time.Duration
	// Pool, when >= 0, sets the spec's pool.
	Pool int
	// NoCheckpoint: an app served on demand is not checkpointed at its
	// creation (its first connection then boots it).
	NoCheckpoint bool
}

// newCmdAppCreate builds `fogctl app create`.
func newCmdAppCreate(f *Factory) *cobra.Command {
	o := &AppCreateOptions{F: f}
	create := &cobra.Command{
		Use:   "create [NAME -- COMMAND...]",
		Short: "Create an app from a YAML spec (-f) or from flags",
		Example: `  fogctl app create -f configs/apps/redis.yaml
  fogctl app create web --env web --port 8080 --ready http:8080/healthz -- python3 -m http.server 8080`,
		RunE: func(cmd *cobra.Command, args []string) error { return appCreateRun(cmd.Context(), o, args) },
	}
	fl := create.Flags()
	fl.StringVarP(&o.File, "file", "f", "", "app spec file (YAML or JSON; - for stdin)")
	fl.BoolVar(&o.Replace, "replace", false, "replace the spec of an existing app")
	fl.StringVar(&o.App.Env, "env", "", "environment the app runs in")
	fl.IntSliceVar(&o.Ports, "port", nil, "tcp port of the app (repeatable)")
	fl.StringVar(&o.Ready, "ready", "", "readiness: tcp:PORT, http:PORT/PATH, exec:CMD or output:PHRASE")
	fl.DurationVar(&o.Timeout, "ready-timeout", 0, "how long to wait for ready (default 60s)")
	fl.StringVar((*string)(&o.App.Engine), "engine", "", "checkpoint engine: dmtcp (default), criu, or auto (each the node has; restores take the fastest)")
	fl.Float64Var(&o.App.Resources.CPUs, "cpus", 0, "CPU limit per instance")
	fl.StringVar(&o.App.Resources.Memory, "memory", "", "memory limit per instance, e.g. 512M")
	fl.IntVar(&o.Pool, "pool", -1, "idle slots of the app each node keeps ready (a warm pool; default: the node's agent.pool_size); overrides the spec's pool")
	fl.StringVar((*string)(&o.App.Mode), "mode", "", "mode of its deployments that ask for none: auto (default: boot or restore, whichever has been faster on the node), restore or boot")
	fl.BoolVar(&o.NoCheckpoint, "no-checkpoint", false, "an app served on demand (frontend.on_demand): do not make its first generation now (its first connection then waits for its boot)")
	_ = create.RegisterFlagCompletionFunc("engine", fixedCompletion("dmtcp", "criu", "auto"))
	_ = create.RegisterFlagCompletionFunc("mode", fixedCompletion(string(spec.ModeAuto), string(spec.ModeRestore), string(spec.ModeBoot)))
	return create
}

func appCreateRun(ctx context.Context, o *AppCreateOptions, args []string) error {
	var app spec.App
	if o.File != "" {
		if len(args) > 0 {
			return usageError{fmt.Errorf("give either -f FILE or NAME -- COMMAND, not both")}
		}
		var r io.Reader = o.F.In
		if o.File != "-" {
			fh, err := os.Open(o.File)
			if err != nil {
				return fmt.Errorf("%w: %w", layering.ErrInvalid, err)
			}
			defer fh.Close()
			r = fh
		}
		a, err := spec.ParseApp(r)
		if err != nil {
			return fmt.Errorf("%s: %w: %w", o.File, layering.ErrInvalid, err)
		}
		app = a
		if o.Pool >= 0 {
			app.Pool = &o.Pool
			if err := app.Validate(); err != nil {
				return fmt.Errorf("%w: %w", layering.ErrInvalid, err)
			}
		}
	} else {
		if len(args) < 2 {
			return usageError{fmt.Errorf("give -f FILE, or NAME -- COMMAND")}
		}
		app = o.App
		app.Name, app.Command = args[0], args[1:]
		if o.Pool >= 0 {
			app.Pool = &o.Pool
		}
		for _, p := range o.Ports {
			app.Ports = append(app.Ports, spec.Port{Port: p})
		}
		r, err := parseReady(o.Ready)
		if err != nil {
			return err
		}
		r.Timeout = spec.Duration(o.Timeout)
		app.Ready = r
		app = app.WithDefaults()
		if err := app.Validate(); err != nil {
			return fmt.Errorf("%w: %w", layering.ErrInvalid, err)
		}
	}
	if err := checkEnv(ctx, o.F, app); err != nil {
		return err
	}
	st, err := o.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.CreateApp(ctx, app, o.Replace); err != nil {
		return err
	}
	if app.Frontend.OnDemand && !o.Replace && !o.NoCheckpoint {
		// Served on demand: its first connection restores a generation
		// made now, instead of waiting for the app's boot.
		if g, err := refreshGeneration(ctx, o.F, st, app.Name, ""); err != nil {
			fmt.Fprintf(o.F.ErrOut, "warning: app %s is created, but its first generation is not made (%v): its first connection boots it; `fogctl checkpoint refresh %s` makes one\n",
				app.Name, err, app.Name)
		} else {
			fmt.Fprintf(o.F.ErrOut, "==> generation %d of %s sealed: connections to its shared endpoint restore it (`fogctl endpoint ls --app %s`)\n", g.Gen, app.Name, app.Name)
		}
	}
	return printOut(o.F, app.WithDefaults(), func(w io.Writer) {
		fmt.Fprintf(w, "Created app %s (env %s, engine %s)\n", app.Name, app.Env, app.WithDefaults().Engine)
	})
}

// checkEnv fails if the environment app names is not in the catalog, so
// that a wrong name fails at app create rather than at every deploy.
func checkEnv(ctx context.Context, f *Factory, app spec.App) error {
	l, err := f.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	if _, err := l.Manager.Get(ctx, app.Env); errors.Is(err, layering.ErrNotFound) {
		return hint.With(fmt.Errorf("app %s: env: %w", app.Name, err),
			"build or import it first (`fogctl env build "+app.Env+" -f FILE`, `fogctl env import`); `fogctl env ls` lists those there are")
	} else if err != nil {
		return err
	}
	return nil
}

// parseReady parses --ready: tcp:PORT, http:PORT/PATH, exec:CMD or output:PHRASE.
func parseReady(s string) (spec.Readiness, error) {
	kind, rest, ok := strings.Cut(s, ":")
	bad := func() (spec.Readiness, error) {
		return spec.Readiness{}, fmt.Errorf("%w: --ready %q: use tcp:PORT, http:PORT/PATH, exec:COMMAND or output:PHRASE", layering.ErrInvalid, s)
	}
	if !ok {
		return bad()
	}
	switch kind {
	case spec.ReadyTCP:
		p, err := strconv.Atoi(rest)
		if err != nil {
			return bad()
		}
		return spec.Readiness{Kind: kind, Port: p}, nil
	case spec.ReadyHTTP:
		ps, path, _ := strings.Cut(rest, "/")
		p, err := strconv.Atoi(ps)
		if err != nil {
			return bad()
		}
		return spec.Readiness{Kind: kind, Port: p, Path: "/" + path}, nil
	case spec.ReadyExec:
		return spec.Readiness{Kind: kind, Command: strings.Fields(rest)}, nil
	case spec.ReadyOutput:
		return spec.Readiness{Kind: kind, Phrase: rest}, nil
	}
	return bad()
}
