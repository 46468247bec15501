//go:build !no_ceph

package wire

import (
	"context"

	"github.com/fogdeploy/fogdeploy/internal/config"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
)

func openStore(ctx context.Context, c config.Config) (layering.Backend, error) {
	return cephstore.Open(ctx, CephConfig(c))
}
