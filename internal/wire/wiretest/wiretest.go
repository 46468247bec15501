// Package wiretest gives tests above the layering a node's layering
// (wire.Layering) over the fake store of rbd-layering's suite.
package wiretest

import (
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/wire"
	"github.com/fogdeploy/fogdeploy/rbd-layering/envtest"
)

// FakeLayering is envtest.FakeLayering as a node's layering.
func FakeLayering(t *testing.T) *wire.Layering {
	t.Helper()
	p := envtest.FakeLayering(t)
	return &wire.Layering{Store: p.Store, Mapper: p.Mapper, Manager: p.Manager, Pool: envtest.FakePool}
}
