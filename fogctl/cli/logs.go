package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	hintpkg "github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// LogsOptions are the inputs of `fogctl logs`.
type LogsOptions struct {
	F    *Factory
	ID   string
	Tail int
}

// NewCmdLogs builds `fogctl logs ID`.
func NewCmdLogs(f *Factory, runF func(context.Context, *LogsOptions) error) *cobra.Command {
	opts := &LogsOptions{F: f}
	cmd := &cobra.Command{
		Use: "logs ID", Short: "Show a deployment's last output lines (from its node's agent)", Args: exactArgs(1, "a deployment ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if opts.Tail < 1 || opts.Tail > 10000 {
				return usageError{fmt.Errorf("--tail %d: give a number of lines from 1 to 10000", opts.Tail)}
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return logsRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().IntVar(&opts.Tail, "tail", 100, "number of lines")
	return cmd
}

func logsRun(ctx context.Context, opts *LogsOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	dep, err := st.Deployment(ctx, opts.ID)
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
	c, err := opts.F.Config()
	if err != nil {
		return err
	}
	agent, err := newAgentAPI(c, dep.Node, api)
	if err != nil {
		return err
	}
	resp, err := agent.get(ctx, dep.Node, "/v1/deployments/"+dep.ID+"/logs?tail="+strconv.Itoa(opts.Tail))
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
	return printOut(opts.F, body, func(w io.Writer) { fmt.Fprintln(w, strings.Join(body.Lines, "\n")) })
}
