package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/wire"
)

// openState connects to the PoP's etcd.
func (f *Factory) openState(ctx context.Context) (*state.Store, error) {
	c, err := f.Config()
	if err != nil {
		return nil, err
	}
	return state.Open(ctx, wire.StateConfig(c))
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
