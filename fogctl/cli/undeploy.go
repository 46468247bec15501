package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

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
