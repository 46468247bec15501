//go:build !no_ceph

package wire

import (
	"context"
	"log/slog"

	"github.com/fogdeploy/fogdeploy/internal/config"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
)

func openStore(ctx context.Context, c config.Config, log *slog.Logger) (layering.Backend, error) {
	cfg := CephConfig(c)
	cfg.Log = log
	return cephstore.Open(ctx, cfg)
}
