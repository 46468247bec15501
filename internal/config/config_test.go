package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadAndValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("ceph:\n  pool: rbd2\n  timeout: 3s\nlayering:\n  soft_depth: 2\n  hard_depth: 3\n"), 0o600)
	c, err := Load(good)
	if err != nil {
		t.Fatal(err)
	}
	if c.Ceph.Pool != "rbd2" || c.Ceph.Timeout.Seconds() != 3 || c.Layering.HardDepth != 3 || c.Ceph.ID != "admin" {
		t.Fatalf("loaded %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Agent.CheckpointCacheBytes(); err != nil || n != 4<<30 {
		t.Errorf("default checkpoint cache = %d, %v; want 4 GiB", n, err)
	}
	c.Agent.CheckpointCache = "0"
	if n, err := c.Agent.CheckpointCacheBytes(); err != nil || n != 0 {
		t.Errorf("checkpoint cache 0 = %d, %v; want no limit", n, err)
	}

	unknown := filepath.Join(dir, "unknown.yaml")
	os.WriteFile(unknown, []byte("ceph:\n  pol: x\n"), 0o600)
	if _, err := Load(unknown); err == nil || !strings.Contains(err.Error(), "pol") {
		t.Fatalf("Load with an unknown key = %v, want an error naming it", err)
	}

	c = Default()
	c.Ceph.ID = "client.admin"
	c.Ceph.Pool = "Bad Pool"
	c.Mapper.Backend = "magic"
	c.Layering.SoftDepth, c.Layering.HardDepth = 5, 2
	c.Node.StateDir = "relative"
	c.Layering.DefaultSize = "-3G"
	c.Mapper.Timeout = 0
	c.Agent.CheckpointCache = "lots"
	c.Agent.Fetch = "eager"
	c.Agent.HitConcurrency = -2
	err = c.Validate()
	for _, want := range []string{"ceph.id", "ceph.pool", "mapper.backend", "mapper.timeout", "soft_depth", "node.state_dir", "layering.default_size",
		"agent.checkpoint_cache", "agent.fetch", "agent.hit_concurrency"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}

func TestApplyEnv(t *testing.T) {
	t.Setenv("FOGDEPLOY_CEPH_POOL", "other")
	t.Setenv("FOGDEPLOY_MAPPER", "fuse")
	c := Default()
	c.ApplyEnv()
	if c.Ceph.Pool != "other" || c.Mapper.Backend != "fuse" {
		t.Fatalf("ApplyEnv: %+v", c)
	}
}

// TestExampleConfig: the documented example loads (every key is known) and
// its values are the ones it documents.
func TestExampleConfig(t *testing.T) {
	c, err := Load(filepath.Join("..", "..", "configs", "fogdeploy.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Mapper.Timeout.Seconds() != 30 || c.Mapper.Backend != "auto" {
		t.Errorf("example mapper = %+v, want backend auto and timeout 30s", c.Mapper)
	}
}
