package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// EnvExecOptions are the inputs of `fogctl env exec`.
type EnvExecOptions struct {
	F       *Factory
	Name    string
	Command string
	// Network is "none" (the default: only lo) or "host".
	Network string
}

// NewCmdEnvExec builds `fogctl env exec`.
func NewCmdEnvExec(f *Factory, runF func(context.Context, *EnvExecOptions) error) *cobra.Command {
	opts := &EnvExecOptions{F: f}
	cmd := &cobra.Command{
		Use:   "exec NAME -- COMMAND...",
		Short: "Run a command in a throwaway clone of an environment",
		Long: `Clone the environment's snapshot, map and mount the clone, run the command
with the clone as its root, in mount, PID and network namespaces of its own
with a private /dev and /proc (as a RUN step), then unmount, unmap and
remove the clone. Prints the time of each phase. Nothing the command writes
is kept. Its network is, as a RUN step's, outbound through NAT (default),
none (only lo), or host (the node's own, where layering.build_host_network
allows it).`,
		Example: `  fogctl env exec redis -- redis-server --version
  fogctl env exec redis -- sh -c 'ls /etc | wc -l'`,
		ValidArgsFunction: completeEnvNames(f),
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 || cmd.ArgsLenAtDash() != 1 {
				return usageError{errors.New("env exec takes NAME -- COMMAND")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name, opts.Command = args[0], layering.ShellJoin(args[1:])
			if opts.Network != "default" && opts.Network != "none" && opts.Network != "host" {
				return usageError{fmt.Errorf("--network %q: use default (outbound through NAT), none (only lo) or host (the node's network, where layering.build_host_network allows it)", opts.Network)}
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return envExecRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Network, "network", "default", "the command's network: default (outbound through NAT), none (only lo) or host (the node's, where layering.build_host_network allows it)")
	return cmd
}

func envExecRun(ctx context.Context, opts *EnvExecOptions) error {
	l, err := opts.F.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	var out io.Writer = opts.F.Out
	if opts.F.Global.Output == "json" {
		out = opts.F.ErrOut
	}
	network := layering.NetworkDefault
	switch opts.Network {
	case "none":
		network = layering.NetworkNone
	case "host":
		network = layering.NetworkHost
	}
	t, err := l.Manager.ExecWith(ctx, opts.Name, opts.Command, layering.ExecOptions{Output: out, Network: network})
	if perr := printOut(opts.F, map[string]any{"env": opts.Name, "phases": t}, func(w io.Writer) {
		fmt.Fprintf(opts.F.ErrOut, "==> %s: %s\n", opts.Name, t)
	}); perr != nil {
		return perr
	}
	return err
}
