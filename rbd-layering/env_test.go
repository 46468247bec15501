package layering_test

import (
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/rbd-layering/envtest"
)

// TestEnvSuiteFake runs the environment suite on the file-backed fake,
// mounting images through the mapper's file backend (needs root).
func TestEnvSuiteFake(t *testing.T) {
	testenv.NeedRoot(t)
	envtest.RunSuite(t, envtest.FakeLayering)
}
