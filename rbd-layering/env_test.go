package layering_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/envtest"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// TestEnvSuiteFake runs the environment suite on the file-backed fake,
// mounting images through the mapper's file backend (needs root).
func TestEnvSuiteFake(t *testing.T) {
	testenv.NeedRoot(t)
	envtest.RunSuite(t, func(t *testing.T) *wire.Layering {
		dir := t.TempDir()
		fs, err := fakestore.New(dir + "/store")
		if err != nil {
			t.Fatal(err)
		}
		mc := mapper.Config{Backend: mapper.BackendFile, StateDir: dir + "/mapper", FilePath: func(img mapper.Image) (string, error) {
			p := fs.Path(img.Name)
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%w: %w", mapper.ErrImageNotFound, err)
			}
			return p, nil
		}}
		l, err := wire.NewLayering(context.Background(), fs, "fake", mc, layering.DefaultManagerConfig(dir+"/work"), nil)
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}
