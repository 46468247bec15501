package drivertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// ContainerLeftovers is Harness.Leftovers for a driver whose instances are
// containers of rt: the containers labelled with the deployment, running
// or not.
func ContainerLeftovers(rt runtime.Runtime) func(t *testing.T, id string) []string {
	return func(t *testing.T, id string) []string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sts, err := rt.List(ctx, map[string]string{runtime.LabelDeployment: id})
		if err != nil {
			t.Fatalf("list containers of %s: %v", id, err)
		}
		var out []string
		for _, st := range sts {
			out = append(out, fmt.Sprintf("container %s (%s)", st.Name, st.Status))
		}
		return out
	}
}

// ProcessLeftovers is Harness.Leftovers for a driver whose instances are
// processes below the test process (the Host driver's engines, their
// helpers and apps): the processes below it, zombies included, that were
// not there when ProcessLeftovers was called. The deployment is not told
// apart, so the suite's subtests, which run one after another, see only
// their own.
func ProcessLeftovers() func(t *testing.T, id string) []string {
	before := map[int]bool{}
	for _, p := range testenv.Descendants() {
		before[p.PID] = true
	}
	return func(t *testing.T, id string) []string {
		var out []string
		for _, p := range testenv.Descendants() {
			if !before[p.PID] {
				out = append(out, fmt.Sprintf("process %d [%s] %s", p.PID, p.State, p.Cmdline))
			}
		}
		return out
	}
}
