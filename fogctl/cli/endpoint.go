package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// NewCmdEndpoint groups the endpoint commands.
func NewCmdEndpoint(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "endpoint", Short: "List the PoP's stable endpoints, where clients reach each deployment", RunE: groupRunE}
	cmd.AddCommand(NewCmdEndpointLs(f, nil))
	return cmd
}

// EndpointLsOptions are the inputs of `fogctl endpoint ls`.
type EndpointLsOptions struct {
	F   *Factory
	App string
}

// NewCmdEndpointLs builds `fogctl endpoint ls`.
func NewCmdEndpointLs(f *Factory, runF func(context.Context, *EndpointLsOptions) error) *cobra.Command {
	opts := &EndpointLsOptions{F: f}
	cmd := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Args: cobra.NoArgs,
		Short: "List the endpoints: each deployment's port on every node's front end, and where it runs now",
		Long: "A client reaches a deployment at any front-end address (agent.frontend.listen of each Ready node) on its " +
			"endpoint port, which stays the same while the deployment exists: through migrations, drains, suspends and " +
			"resumes. A connection to a Suspended deployment wakes it. An app served on demand (frontend.on_demand) has a " +
			"shared endpoint, \"(on demand)\": a connection to it reaches the app's instance on the node that takes it, " +
			"made by that connection when there is none.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return endpointLsRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.App, "app", "", "only this app's endpoints")
	return cmd
}

// endpointList is what `fogctl endpoint ls -o json` prints.
type endpointList struct {
	Addresses []string        `json:"addresses"`
	Endpoints []endpointEntry `json:"endpoints"`
}

type endpointEntry struct {
	state.Endpoint
	Node  string `json:"node"`
	Phase string `json:"phase"`
	// Instances are, for an app's shared endpoint, its instances made on
	// demand (their IDs).
	Instances []string `json:"instances,omitempty"`
}

func endpointLsRun(ctx context.Context, opts *EndpointLsOptions) error {
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	addrs, err := st.FrontendAddresses(ctx)
	if err != nil {
		return err
	}
	deps, err := st.Deployments(ctx)
	if err != nil {
		return err
	}
	byID := map[string]state.Deployment{}
	onDemand := map[string][]state.Deployment{}
	for _, d := range deps {
		byID[d.ID] = d
		if d.OnDemand {
			onDemand[d.App] = append(onDemand[d.App], d)
		}
	}
	eps, err := st.Endpoints(ctx)
	if err != nil {
		return err
	}
	out := endpointList{Addresses: addrs, Endpoints: []endpointEntry{}}
	for _, e := range eps {
		if opts.App != "" && e.App != opts.App {
			continue
		}
		if e.Shared {
			out.Endpoints = append(out.Endpoints, sharedEntry(e, onDemand[e.App]))
			continue
		}
		d := byID[e.Deployment]
		node := d.Status.Node
		if node == "" {
			node = "-"
		}
		out.Endpoints = append(out.Endpoints, endpointEntry{Endpoint: e, Node: node, Phase: string(d.Status.Phase)})
	}
	return printOut(opts.F, out, func(w io.Writer) {
		fmt.Fprintln(w, "PORT\tDEPLOYMENT\tAPP\tTARGET\tNODE\tPHASE")
		for _, e := range out.Endpoints {
			dep := e.Deployment
			if e.Shared {
				dep = "(on demand)"
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", e.Port, dep, e.App, e.Target, e.Node, e.Phase)
		}
		if len(addrs) == 0 {
			fmt.Fprintln(w, "# no Ready node has a front end (agent.frontend.listen); pop.frontend.ports \"off\" gives no endpoints")
			return
		}
		fmt.Fprintf(w, "# reach each at any front end: %s\n", strings.Join(addrs, ", "))
	})
}

// sharedEntry is app e.App's shared endpoint with its instances made on
// demand: the nodes they run on, and how many run.
func sharedEntry(e state.Endpoint, deps []state.Deployment) endpointEntry {
	ent := endpointEntry{Endpoint: e, Node: "-"}
	var nodes []string
	running := 0
	for _, d := range deps {
		ent.Instances = append(ent.Instances, d.ID)
		if d.Status.Phase == spec.PhaseRunning {
			running++
			nodes = append(nodes, d.Status.Node)
		}
	}
	if len(nodes) > 0 {
		slices.Sort(nodes)
		ent.Node = strings.Join(slices.Compact(nodes), ",")
	}
	ent.Phase = fmt.Sprintf("%d running", running)
	return ent
}
