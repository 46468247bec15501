package wire_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/internal/wire"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// TestConfigsFlow: what an operator writes in the config reaches each
// component: the cluster's connection, the mapper's backend, state
// directory and timeout, etcd's endpoints, the front end's port range and
// the placement policy.
func TestConfigsFlow(t *testing.T) {
	c := config.Default()
	c.Ceph.Conf, c.Ceph.Keyring, c.Ceph.ID, c.Ceph.Pool, c.Ceph.Timeout = "/etc/ceph/pop.conf", "/etc/ceph/pop.keyring", "pop", "fog", 7*time.Second
	c.Node.StateDir = "/var/lib/fogdeploy"
	c.Mapper.Backend, c.Mapper.Timeout = mapper.BackendFuse, 9*time.Second
	c.Etcd.Endpoints = []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379"}
	c.PoP.Frontend.Ports = "30000-30099"
	c.PoP.Placement = "spread"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := wire.CephConfig(c); got.Conf != c.Ceph.Conf || got.Keyring != c.Ceph.Keyring || got.ID != "pop" || got.Pool != "fog" || got.Timeout != 7*time.Second {
		t.Errorf("CephConfig = %+v", got)
	}
	if got := wire.MapperConfig(c); got.Backend != mapper.BackendFuse || got.StateDir != "/var/lib/fogdeploy/mapper" || got.CephConf != c.Ceph.Conf || got.ID != "pop" || got.Timeout != 9*time.Second {
		t.Errorf("MapperConfig = %+v", got)
	}
	sc := wire.StateConfig(c)
	if _, isSpread := sc.Policy.(placement.Spread); len(sc.Endpoints) != 2 || sc.EndpointPorts != (state.PortRange{Lo: 30000, Hi: 30099}) || !isSpread {
		t.Errorf("StateConfig = %+v; want both endpoints, ports 30000-30099 and the spread policy", sc)
	}
}

// TestNewLayering: a store and the mapper's file backend make a manager
// that builds and lists an environment, and Close closes the store.
func TestNewLayering(t *testing.T) {
	testenv.NeedRoot(t) // the file backend attaches loop devices
	ctx := context.Background()
	dir := t.TempDir()
	store, err := fakestore.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	mc := mapper.Config{Backend: mapper.BackendFile, StateDir: filepath.Join(dir, "mapper"), FilePath: func(im mapper.Image) (string, error) { return store.Path(im.Name), nil }}
	l, err := wire.NewLayering(ctx, store, "pool", mc, layering.DefaultManagerConfig(filepath.Join(dir, "work")), log)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Store != store || l.Mapper == nil || l.Manager == nil || l.Pool != "pool" {
		t.Fatalf("NewLayering = %+v", l)
	}
	envs, err := l.Manager.List(ctx)
	if err != nil || len(envs) != 0 {
		t.Errorf("environments of an empty pool = %v, %v", envs, err)
	}
}
