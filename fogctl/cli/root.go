// Package cli holds fogctl's commands. Each command is an Options struct,
// a NewCmdX constructor and a plain xRun function over the libraries, so
// that exit codes are decided in one place (Main).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/config"
	hintpkg "github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/version"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Exit codes of fogctl.
const (
	ExitOK          = 0
	ExitError       = 1 // any other failure
	ExitInvalid     = 2 // bad flags, arguments, specs or config
	ExitNotFound    = 3 // the environment, image or snapshot does not exist
	ExitConflict    = 4 // it exists already, changed meanwhile, has clones, is in use, is too deep, or is in the wrong phase
	ExitUnavailable = 5 // Ceph, dockerd or etcd did not answer in time, or the pool or disk is full
	ExitInterrupted = 130
)

const exitCodeHelp = `Exit codes:
  0    success
  1    failure
  2    invalid input (flags, names, sizes, build files, config)
  3    not found (environment, image, app, node or deployment)
  4    conflict: already exists, changed meanwhile, has clones, in use, clone chain too deep, or a deployment not in the phase asked
  5    storage, docker or etcd unavailable (timeout), a full pool or disk, or no ready node
  130  interrupted`

// GlobalOptions are the flags every command shares.
type GlobalOptions struct {
	ConfigFile  string
	CephConf    string
	CephKeyring string
	CephID      string
	CephPool    string
	Mapper      string
	AgentCAFile string
	Output      string
	Timeout     time.Duration
	LogLevel    string
	LogFormat   string
}

// Factory gives commands what they need, built lazily from the flags.
type Factory struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
	Global *GlobalOptions

	// Layering opens the environment manager (overridable in tests).
	Layering func(ctx context.Context) (*wire.Layering, error)
	// State connects to the PoP's etcd (overridable in tests).
	State func(ctx context.Context) (*state.Store, error)
}

// Config returns the layered configuration: defaults, file, env, flags.
func (f *Factory) Config() (config.Config, error) {
	c, err := config.Load(f.Global.ConfigFile)
	if err != nil {
		return c, fmt.Errorf("%w: %w", layering.ErrInvalid, err)
	}
	c.ApplyEnv()
	g := f.Global
	for _, o := range []struct {
		dst *string
		v   string
	}{
		{&c.Ceph.Conf, g.CephConf}, {&c.Ceph.Keyring, g.CephKeyring}, {&c.Ceph.ID, g.CephID},
		{&c.Ceph.Pool, g.CephPool}, {&c.Mapper.Backend, g.Mapper}, {&c.Agent.CAFile, g.AgentCAFile},
	} {
		if o.v != "" {
			*o.dst = o.v
		}
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", layering.ErrInvalid, err)
	}
	return c, nil
}

// Logger returns the slog logger the flags ask for (to stderr).
func (f *Factory) Logger() *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(f.Global.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if f.Global.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(f.ErrOut, opts))
	}
	return slog.New(slog.NewTextHandler(f.ErrOut, opts))
}

// Progress writes one line per step to stderr.
func (f *Factory) Progress() layering.Progress {
	return func(format string, args ...any) {
		fmt.Fprintf(f.ErrOut, "==> "+format+"\n", args...)
	}
}

func (f *Factory) openLayering(ctx context.Context) (*wire.Layering, error) {
	c, err := f.Config()
	if err != nil {
		return nil, err
	}
	l, err := wire.OpenLayering(ctx, c, f.Logger())
	if err != nil && hintpkg.Of(err) == "" {
		err = hintpkg.With(err, "for a local cluster run `make dev-up`; for yours pass --ceph-conf and --ceph-keyring")
	}
	return l, err
}

// NewCmdRoot builds the command tree.
func NewCmdRoot(f *Factory) *cobra.Command {
	g := f.Global
	root := &cobra.Command{
		Use:   "fogctl",
		Short: "Operate a fogdeploy point of presence",
		Long: `fogctl operates a fogdeploy PoP: container environments stored as Ceph RBD
snapshot/clone chains (env), and apps deployed from them on the PoP's nodes,
booted and checkpointed once, then restored from clones (app, deploy, ps, ...).

It reads the Ceph conf and keyring from flags, FOGDEPLOY_CEPH_* variables,
a config file (--config), or the cluster that ` + "`make dev-up`" + ` started; and
the PoP's etcd from etcd.endpoints or FOGDEPLOY_ETCD_ENDPOINTS (default: the
dev etcd on 127.0.0.1:23790). It talks to etcd, not to the agents (except
logs, which asks the agent of the deployment's node: over TLS when the node
registered https://, verified against --agent-ca-file, with the token of
FOGDEPLOY_TOKEN_FILE).

` + exitCodeHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.String(),
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.ConfigFile, "config", os.Getenv("FOGDEPLOY_CONFIG"), "config file (YAML) [$FOGDEPLOY_CONFIG]")
	pf.StringVar(&g.CephConf, "ceph-conf", "", "ceph.conf of the cluster [$FOGDEPLOY_CEPH_CONF]")
	pf.StringVar(&g.CephKeyring, "ceph-keyring", "", "cephx keyring [$FOGDEPLOY_CEPH_KEYRING]")
	pf.StringVar(&g.CephID, "ceph-id", "", "cephx user without \"client.\" [$FOGDEPLOY_CEPH_ID]")
	pf.StringVar(&g.CephPool, "ceph-pool", "", "RBD pool [$FOGDEPLOY_CEPH_POOL]")
	pf.StringVar(&g.Mapper, "mapper", "", "mapping backend: auto, krbd, nbd or fuse [$FOGDEPLOY_MAPPER]")
	pf.StringVar(&g.AgentCAFile, "agent-ca-file", "", "CA certificates that verify the agents' TLS certificates (fogctl logs) [$FOGDEPLOY_CA_FILE]")
	pf.StringVarP(&g.Output, "output", "o", "table", "output format: table or json")
	pf.DurationVar(&g.Timeout, "timeout", 0, "give up after this long (0: no limit)")
	pf.StringVar(&g.LogLevel, "log-level", "warn", "log level: debug, info, warn or error")
	pf.StringVar(&g.LogFormat, "log-format", "text", "log format: text or json")
	_ = root.RegisterFlagCompletionFunc("output", fixedCompletion("table", "json"))
	_ = root.RegisterFlagCompletionFunc("mapper", fixedCompletion(mapper.BackendAuto, mapper.BackendKRBD, mapper.BackendNBD, mapper.BackendFuse))
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		return validateGlobal(g)
	}

	root.AddGroup(&cobra.Group{ID: "env", Title: "Environments:"})
	envCmd := NewCmdEnv(f)
	envCmd.GroupID = "env"
	root.AddCommand(envCmd)
	root.AddGroup(&cobra.Group{ID: "pop", Title: "Point of presence:"})
	for _, c := range []*cobra.Command{NewCmdNode(f), NewCmdApp(f), NewCmdDeploy(f), NewCmdPs(f, nil), NewCmdUndeploy(f, nil), NewCmdSuspend(f, nil), NewCmdResume(f, nil), NewCmdMigrate(f, nil),
		NewCmdLogs(f, nil), NewCmdCheckpoint(f), NewCmdPool(f), NewCmdGC(f, nil), NewCmdPop(f), NewCmdEndpoint(f)} {
		c.GroupID = "pop"
		root.AddCommand(c)
	}
	root.AddCommand(NewCmdVersion(f))
	return root
}

func validateGlobal(g *GlobalOptions) error {
	var errs []error
	if g.Output != "table" && g.Output != "json" {
		errs = append(errs, fmt.Errorf("--output %q: use table or json", g.Output))
	}
	if g.Timeout < 0 {
		errs = append(errs, fmt.Errorf("--timeout %s is negative: use e.g. 30s, or 0 for no limit", g.Timeout))
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: use debug, info, warn or error", g.LogLevel))
	}
	if g.LogFormat != "text" && g.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format %q: use text or json", g.LogFormat))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", layering.ErrInvalid, err)
	}
	return nil
}

func fixedCompletion(words ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return words, cobra.ShellCompDirectiveNoFileComp
	}
}

// Main runs fogctl and returns its exit code.
func Main(args []string, in io.Reader, out, errOut io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f := &Factory{In: in, Out: out, ErrOut: errOut, Global: &GlobalOptions{}}
	f.Layering = f.openLayering
	f.State = f.openState
	return run(ctx, f, args)
}

// run executes fogctl with a prepared factory and returns the exit code.
func run(ctx context.Context, f *Factory, args []string) int {
	in, out, errOut := f.In, f.Out, f.ErrOut
	root := NewCmdRoot(f)
	root.SetArgs(args)
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	tctx, cancel := withTimeout(ctx, args)
	defer cancel()
	cmd, err := root.ExecuteContextC(tctx)
	if err == nil {
		return ExitOK
	}
	return reportError(errOut, cmd, err, ctx)
}

// withTimeout applies --timeout before cobra parses it, so that the
// context passed to every command carries the deadline.
func withTimeout(ctx context.Context, args []string) (context.Context, context.CancelFunc) {
	for i, a := range args {
		v := ""
		if strings.HasPrefix(a, "--timeout=") {
			v = strings.TrimPrefix(a, "--timeout=")
		} else if a == "--timeout" && i+1 < len(args) {
			v = args[i+1]
		}
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return context.WithTimeout(ctx, d)
		}
	}
	return context.WithCancel(ctx)
}

func reportError(w io.Writer, cmd *cobra.Command, err error, ctx context.Context) int {
	fmt.Fprintf(w, "Error: %s\n", err)
	code := exitCode(err, ctx)
	hint := hintpkg.Of(err)
	if hint == "" && code == ExitInvalid && cmd != nil && isUsageError(err) {
		hint = fmt.Sprintf("see `%s --help`", cmd.CommandPath())
	}
	if hint != "" {
		fmt.Fprintf(w, "Hint: %s\n", hint)
	}
	return code
}

// exitCode maps an error onto the documented exit codes.
// The classes it shares with a failed deployment's recorded cause come
// from state.CauseOf.
func exitCode(err error, ctx context.Context) int {
	cause := state.CauseOf(err)
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return ExitInterrupted
	case cause == state.CauseInvalid, isUsageError(err):
		return ExitInvalid
	case cause == state.CauseNotFound:
		return ExitNotFound
	case errors.Is(err, layering.ErrExists), errors.Is(err, layering.ErrHasChildren),
		errors.Is(err, layering.ErrBusy), errors.Is(err, layering.ErrTooDeep), errors.Is(err, layering.ErrConflict),
		errors.Is(err, state.ErrExists), errors.Is(err, state.ErrInUse), errors.Is(err, state.ErrConflict):
		return ExitConflict
	case cause == state.CauseUnavailable, errors.Is(err, placement.ErrNoNode):
		return ExitUnavailable
	}
	return ExitError
}

// usageError marks errors in flags or arguments.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func isUsageError(err error) bool {
	var u usageError
	if errors.As(err, &u) {
		return true
	}
	s := err.Error()
	return strings.HasPrefix(s, "unknown flag") || strings.HasPrefix(s, "unknown shorthand flag") || strings.HasPrefix(s, "unknown command") ||
		strings.HasPrefix(s, "invalid argument \"") || strings.Contains(s, "flag needs an argument") ||
		strings.HasPrefix(s, "accepts ") || strings.HasPrefix(s, "requires ") ||
		strings.HasPrefix(s, "required flag") || strings.Contains(s, "flags in the group")
}

// groupRunE makes a command that only groups subcommands reject unknown
// ones instead of printing help with exit 0.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
	}
	return cmd.Help()
}

// exactArgs is cobra.ExactArgs with an error fogctl classifies as usage.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %s, got %d arguments", cmd.CommandPath(), what, len(args))}
		}
		for i, a := range args {
			if strings.TrimSpace(a) == "" {
				return usageError{fmt.Errorf("%s takes %s: argument %d is empty", cmd.CommandPath(), what, i+1)}
			}
		}
		return nil
	}
}

// NewCmdVersion prints the version.
func NewCmdVersion(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return printOut(f, map[string]string{"version": version.String()}, func(w io.Writer) {
				fmt.Fprintln(w, "fogctl", version.String())
			})
		},
	}
}
