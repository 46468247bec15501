package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// appLimits is, per node that says its defaults, what an instance of app
// may use there: the app's resources, the node's `limits:` elsewhere.
func appLimits(ctx context.Context, st *state.Store, a spec.App) (map[string]spec.Limits, error) {
	nodes, err := st.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]spec.Limits{}
	for _, n := range nodes {
		if n.Limits != nil {
			out[n.Name] = a.LimitsOver(*n.Limits)
		}
	}
	return out, nil
}

// describeLimits says l in a line: "cpus 1, memory 256MiB, pids 1024,
// open files 16384, output 2 x 10MiB".
func describeLimits(l spec.Limits) string {
	none := func(v string, ok bool) string {
		if !ok {
			return "none"
		}
		return v
	}
	parts := []string{
		"cpus " + none(fmt.Sprintf("%g", l.CPUs), l.CPUs > 0),
		"memory " + none(mib(l.MemoryBytes), l.MemoryBytes > 0),
		"pids " + none(fmt.Sprint(l.Pids), l.Pids > 0),
		"open files " + none(fmt.Sprint(l.OpenFiles), l.OpenFiles > 0),
		"output " + none(fmt.Sprintf("%d x %s", l.LogFiles, mib(l.LogBytes)), l.LogBytes > 0),
	}
	return strings.Join(parts, ", ")
}

func mib(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%dGiB", n>>30)
	}
	return fmt.Sprintf("%gMiB", float64(n)/(1<<20))
}
