// The etcd revision on the images a node makes for an owner: gc's evidence after an etcd rollback.

package agent

import (
	"context"
	"maps"
	"strconv"
	"sync/atomic"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// stampStore is the node's store as its deployer uses it: every metadata
// write that names an image's owner (a deployment, a generation) also
// writes catalog.MetaEtcd, the etcd revision this node had seen then
// (seen, which the control plane keeps current; 0 writes none).
type stampStore struct {
	layering.Backend
	seen *atomic.Int64
}

// SetMeta implements layering.Store.
func (s stampStore) SetMeta(ctx context.Context, name string, meta map[string]string) error {
	if rev := s.seen.Load(); rev > 0 && (meta[catalog.MetaDeployment] != "" || meta[catalog.MetaGeneration] != "") {
		meta = maps.Clone(meta)
		meta[catalog.MetaEtcd] = strconv.FormatInt(rev, 10)
	}
	return s.Backend.SetMeta(ctx, name, meta)
}
