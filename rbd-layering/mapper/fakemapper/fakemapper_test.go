package fakemapper_test

import (
	"testing"

	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper/fakemapper"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper/mappertest"
)

// TestNodeSuite runs the node's mapper suite on the fake; TestNodeSuiteFile
// (package mapper) runs it on the mapper's file backend over the same
// store.
func TestNodeSuite(t *testing.T) {
	mappertest.RunNodeSuite(t, mappertest.NodeHarness{
		New: func(t *testing.T, s *fakestore.Store) mapper.Node { return fakemapper.New(s) },
	})
}
