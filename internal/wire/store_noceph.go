//go:build no_ceph

package wire

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

func openStore(ctx context.Context, c config.Config, _ *slog.Logger) (layering.Backend, error) {
	return nil, hint.With(fmt.Errorf("this binary was built without Ceph support (-tags no_ceph): %w", layering.ErrUnavailable),
		"rebuild with `make build`")
}
