// Package wire builds fogdeploy's components from a config.Config. It is the
// one place where implementations are chosen and connected (no init()
// registries): the Ceph store, the node's mapper and the environment
// manager.
package wire

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/cephstore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Layering is an open environment manager with what it was built from.
type Layering struct {
	Store   layering.Backend
	Mapper  *mapper.Mapper
	Manager *layering.Manager
	Pool    string
}

// Close releases the store connection.
func (l *Layering) Close() error {
	if l == nil || l.Store == nil {
		return nil
	}
	return l.Store.Close()
}

// CephConfig turns the config into the store's.
func CephConfig(c config.Config) cephstore.Config {
	return cephstore.Config{Conf: c.Ceph.Conf, Keyring: c.Ceph.Keyring, ID: c.Ceph.ID, Pool: c.Ceph.Pool, Timeout: c.Ceph.Timeout}
}

// MapperConfig turns the config into the mapper's.
func MapperConfig(c config.Config) mapper.Config {
	return mapper.Config{
		Backend:  c.Mapper.Backend,
		StateDir: filepath.Join(c.Node.StateDir, "mapper"),
		CephConf: c.Ceph.Conf,
		Keyring:  c.Ceph.Keyring,
		ID:       c.Ceph.ID,
		Timeout:  c.Mapper.Timeout,
	}
}

// OpenLayering connects to the cluster, sets up the mapper and returns the
// environment manager.
func OpenLayering(ctx context.Context, c config.Config, log *slog.Logger) (*Layering, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", layering.ErrInvalid, err)
	}
	store, err := openStore(ctx, c, log)
	if err != nil {
		return nil, err
	}
	l, err := NewLayering(ctx, store, c.Ceph.Pool, MapperConfig(c), layering.ManagerConfig{
		WorkDir:     filepath.Join(c.Node.StateDir, "work"),
		DefaultSize: c.DefaultSizeBytes(),
		SoftDepth:   c.Layering.SoftDepth,
		HostNetwork: c.Layering.BuildHostNetwork,
		HardDepth:   c.Layering.HardDepth,
	}, log)
	if err != nil {
		store.Close()
		return nil, err
	}
	return l, nil
}

// NewLayering connects a store and a mapper into a manager. Tests use it
// with the fake store and the mapper's file backend.
func NewLayering(ctx context.Context, store layering.Backend, pool string, mc mapper.Config, lc layering.ManagerConfig, log *slog.Logger) (*Layering, error) {
	mp, err := mapper.New(ctx, mc, log)
	if err != nil {
		return nil, err
	}
	// What a killed build or import left mapped would keep its image
	// busy (its next build could not remove it) and its rbd-fuse running.
	if _, err := mp.ReleaseAbandoned(ctx); err != nil {
		log.Warn("releasing the mappings that killed processes left; retried by the next process", "err", err)
	}
	mgr, err := layering.NewManager(store, mapper.Mounter{M: mp, Pool: pool}, lc, log)
	if err != nil {
		return nil, err
	}
	return &Layering{Store: store, Mapper: mp, Manager: mgr, Pool: pool}, nil
}

// StateConfig is the PoP state's (etcd) client configuration from c.
func StateConfig(c config.Config) state.Config {
	sc := state.Config{Endpoints: c.Etcd.Endpoints, DialTimeout: c.Etcd.DialTimeout,
		CAFile: c.Etcd.CAFile, CertFile: c.Etcd.CertFile, KeyFile: c.Etcd.KeyFile}
	// Validate refused a bad range or policy before.
	if lo, hi, ok, err := c.PoP.Frontend.Range(); ok && err == nil {
		sc.EndpointPorts = state.PortRange{Lo: lo, Hi: hi}
	}
	sc.Policy, _ = placement.ByName(c.PoP.Placement)
	return sc
}
