package fakestore_test

import (
	"testing"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/storetest"
)

func TestSuite(t *testing.T) {
	storetest.RunSuite(t, func(t *testing.T) layering.Backend {
		s, err := fakestore.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
