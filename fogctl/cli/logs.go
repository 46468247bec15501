package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	hintpkg "github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

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
