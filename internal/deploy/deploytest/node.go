package deploytest

import (
	"context"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Node is one node under the deploy path's scenario tests: the real one
// (Fixture: Ceph, the kernel's mapper, dockerd and the engines) or the
// unit one (Unit: the fake store, mapper, runtime and cgroups). A
// scenario written against Node runs on both: on Unit in every `go test`,
// on Fixture where root and the services are.
type Node interface {
	// Deployer is the node's deployer.
	Deployer() *deploy.Deployer
	// Reopen returns a new Deployer over the node's state and
	// components, as a restarted agent has.
	Reopen(t testing.TB) *deploy.Deployer
	// ReopenMapping is Reopen with the node's mapper wrapped by wrap: a
	// test's hook on the mappings the deployer makes.
	ReopenMapping(t testing.TB, wrap func(deploy.Mapper) deploy.Mapper) *deploy.Deployer
	// Store is the pool's images.
	Store() layering.Backend
	// SlotRecord is the file of slot id's record.
	SlotRecord(id string) string
	// Weight is the CPU weight of container instance ref's cgroup, or -1
	// where the node's cgroups cannot be reweighted.
	Weight(ctx context.Context, t testing.TB, ref string) int
	// Identity is the identity file of dep as its app reads it; false
	// where the node cannot run a command in an instance.
	Identity(ctx context.Context, t testing.TB, dep deploy.Deployment, user string) (spec.Identity, bool)
	// CheckpointFiles is the pattern of the files an engine's checkpoint
	// holds on this node.
	CheckpointFiles(eng engine.Name) string
	// AssertNothingLeft fails t if the node or the pool holds anything of
	// app's deployments and slots (with keepGen: besides its
	// generations).
	AssertNothingLeft(t testing.TB, app string, keepGen bool)
}

var _ Node = (*Unit)(nil)
