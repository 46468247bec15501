package mapper_test

import (
	"fmt"
	"os"
	"testing"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper/mappertest"
)

// TestNodeSuiteFile runs the node's mapper suite on the file backend over
// the fake store's image files: the suite the fake mapper passes
// (package fakemapper) holds for the real one.
func TestNodeSuiteFile(t *testing.T) {
	needLoop(t)
	mappertest.RunNodeSuite(t, mappertest.NodeHarness{
		New: func(t *testing.T, s *fakestore.Store) mapper.Node {
			path := func(img mapper.Image) (string, error) {
				p := s.Path(img.Name)
				if img.Snap != "" {
					p = s.SnapPath(layering.SnapRef{Image: img.Name, Snap: img.Snap})
				}
				if _, err := os.Stat(p); err != nil {
					return "", fmt.Errorf("fake image %s: %w: %w", img, mapper.ErrImageNotFound, err)
				}
				return p, nil
			}
			m, err := mapper.New(t.Context(), mapper.Config{Backend: mapper.BackendFile, StateDir: t.TempDir(), FilePath: path}, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
	})
}
