package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/spf13/cobra"
)

// AppLsOptions are the inputs of `fogctl app ls`.
type AppLsOptions struct {
	F *Factory
}

// NewCmdAppLs builds `fogctl app ls`.
func NewCmdAppLs(f *Factory, runF func(context.Context, *AppLsOptions) error) *cobra.Command {
	opts := &AppLsOptions{F: f}
	return &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List apps", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return appLsRun(cmd.Context(), opts)
		},
	}
}

func appLsRun(ctx context.Context, opts *AppLsOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	apps, err := st.Apps(ctx)
	if err != nil {
		return err
	}
	return printOut(opts.F, apps, func(w io.Writer) {
		fmt.Fprintln(w, "NAME\tENV\tENGINE\tPORTS\tREADY\tCOMMAND")
		for _, a := range apps {
			var ports []string
			for _, p := range a.Ports {
				ports = append(ports, drivers.PortKey(p.Port, p.Proto))
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Name, a.Env, a.Engine, strings.Join(ports, ","), a.Ready.Kind, strings.Join(a.Command, " "))
		}
	})
}
