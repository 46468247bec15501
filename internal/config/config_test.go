package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
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
	if !c.Agent.TLS() || c.Agent.TokensFile == "" || c.Agent.CAFile == "" {
		t.Errorf("example agent = %+v, want TLS, a tokens file and a CA file", c.Agent)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("example config: %v", err)
	}
}

// The API's credentials: certificate and key both or neither, two token
// files apart; plain HTTP on a loopback address only; a token outside --dev.
func TestAPICredentials(t *testing.T) {
	c := Default()
	c.Agent.TLSCertFile = "/etc/fogdeploy/api.crt"
	c.Agent.TokenFile, c.Agent.TokensFile = "/etc/fogdeploy/t", "/etc/fogdeploy/t"
	err := c.Validate()
	for _, want := range []string{"agent.tls_cert_file \"/etc/fogdeploy/api.crt\" and agent.tls_key_file \"\": give both",
		"agent.token_file and agent.tokens_file are both /etc/fogdeploy/t"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want %q", err, want)
		}
	}

	plain := Default().Agent
	withToken := plain
	withToken.TokenFile = "/etc/fogdeploy/token"
	withTLS := withToken
	withTLS.TLSCertFile, withTLS.TLSKeyFile = "/etc/fogdeploy/api.crt", "/etc/fogdeploy/api.key"
	for _, tc := range []struct {
		name   string
		a      Agent
		listen string
		dev    bool
		want   []string // "" : no error
	}{
		{"dev on loopback", plain, "127.0.0.1:7480", true, nil},
		{"dev on ::1", plain, "[::1]:7480", true, nil},
		{"dev on localhost", plain, "localhost:7480", true, nil},
		{"dev beyond loopback", plain, "0.0.0.0:7480", true, []string{"--listen 0.0.0.0:7480 without TLS", "agent.tls_cert_file"}},
		{"dev on every interface", plain, ":7480", true, []string{"--listen :7480 without TLS"}},
		{"token on loopback", withToken, "127.0.0.1:7480", false, nil},
		{"token beyond loopback", withToken, "10.0.0.5:7480", false, []string{"plain HTTP is served on a loopback address only"}},
		{"no token", plain, "127.0.0.1:7480", false, []string{"agent.token_file and agent.tokens_file are empty"}},
		{"TLS anywhere", withTLS, "0.0.0.0:7480", false, nil},
		{"dev with TLS anywhere", withTLS, "0.0.0.0:7480", true, nil},
	} {
		err := tc.a.CheckServe(tc.listen, tc.dev)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: CheckServe = %v; want %q", tc.name, err, w)
			}
		}
	}

	t.Setenv("FOGDEPLOY_TOKENS_FILE", "/etc/fogdeploy/tokens.yaml")
	t.Setenv("FOGDEPLOY_TLS_CERT_FILE", "/etc/fogdeploy/api.crt")
	t.Setenv("FOGDEPLOY_TLS_KEY_FILE", "/etc/fogdeploy/api.key")
	t.Setenv("FOGDEPLOY_CA_FILE", "/etc/fogdeploy/ca.crt")
	c = Default()
	c.ApplyEnv()
	if c.Agent.TokensFile != "/etc/fogdeploy/tokens.yaml" || !c.Agent.TLS() || c.Agent.CAFile != "/etc/fogdeploy/ca.crt" {
		t.Errorf("ApplyEnv: %+v", c.Agent)
	}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
}

func TestMemoryMergeConfig(t *testing.T) {
	c := Default()
	if c.Agent.MemoryMerge.Enabled || c.Agent.MemoryMerge.PagesToScan != DefaultMergePages {
		t.Fatalf("default memory_merge = %+v: want off, %d pages", c.Agent.MemoryMerge, DefaultMergePages)
	}
	for _, n := range []int{-1, 100001} {
		c.Agent.MemoryMerge = MemoryMerge{Enabled: true, PagesToScan: n}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "agent.memory_merge.pages_to_scan") {
			t.Errorf("pages_to_scan %d: %v; want an error naming agent.memory_merge.pages_to_scan", n, err)
		}
	}
	c.Agent.MemoryMerge = MemoryMerge{Enabled: true}
	if err := c.Validate(); err != nil {
		t.Errorf("pages_to_scan 0 (the kernel's): %v", err)
	}
}

// The front end's keys: the PoP's range of endpoint ports and the node's
// front-end address; a bad value names its key and how to fix it; the
// address defaults to the advertised API's host.
func TestFrontendConfig(t *testing.T) {
	c := Default()
	if lo, hi, on, err := c.PoP.Frontend.Range(); err != nil || !on || lo != 20000 || hi != 29999 {
		t.Errorf("default range: %d-%d on %v, %v; want 20000-29999", lo, hi, on, err)
	}
	if c.Agent.Frontend.HoldTimeout != 10*time.Second || c.Agent.SpareSlots != 1 {
		t.Errorf("defaults: hold_timeout %s, spare_slots %d; want 10s and 1", c.Agent.Frontend.HoldTimeout, c.Agent.SpareSlots)
	}
	for _, bad := range []string{"", "20000", "30000-20000", "80-90", "20000-70000", "a-b"} {
		c := Default()
		c.PoP.Frontend.Ports = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pop.frontend.ports") || !strings.Contains(err.Error(), "LO-HI") {
			t.Errorf("pop.frontend.ports %q: %v; want an error naming the key and the form", bad, err)
		}
	}
	c.PoP.Frontend.Ports = "off"
	if _, _, on, err := c.PoP.Frontend.Range(); on || err != nil {
		t.Errorf("off: on %v, %v", on, err)
	}
	for _, bad := range []Frontend{{Listen: "node1.example"}, {Listen: "10.0.0.1:80"}, {HoldTimeout: -time.Second}, {HoldTimeout: time.Hour}} {
		c := Default()
		c.Agent.Frontend = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "agent.frontend.") {
			t.Errorf("agent.frontend %+v: %v; want an error naming its key", bad, err)
		}
	}
	for _, tc := range []struct{ listen, advertise, want string }{
		{"", "10.0.0.11:7480", "10.0.0.11"}, {"", "", "127.0.0.1"}, {"", "0.0.0.0:7480", "127.0.0.1"},
		{"10.0.0.12", "10.0.0.11:7480", "10.0.0.12"}, {"off", "10.0.0.11:7480", ""},
	} {
		if got := (Frontend{Listen: tc.listen}).ListenAddress(tc.advertise); got != tc.want {
			t.Errorf("listen %q with advertise %q: %q; want %q", tc.listen, tc.advertise, got, tc.want)
		}
	}
}

// pop.placement names a policy: locality (the default) or spread.
func TestPlacementConfig(t *testing.T) {
	c := Default()
	if c.PoP.Placement != "locality" {
		t.Errorf("default pop.placement %q; want locality", c.PoP.Placement)
	}
	c.PoP.Placement = "spread"
	if err := c.Validate(); err != nil {
		t.Errorf("spread: %v", err)
	}
	c.PoP.Placement = "random"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pop.placement") {
		t.Errorf("pop.placement random: %v; want an error naming the key", err)
	}
}

// TestDriversConfig: agent.drivers maps an engine to its driver; an engine
// the build lacks or a driver it lacks is named with what to give; the
// environment's FOGDEPLOY_DRIVERS sets entries; the keys it replaced get
// a hint to it.
func TestDriversConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "drivers.yaml")
	os.WriteFile(good, []byte("agent:\n  drivers:\n    criu: host\n"), 0o600)
	c, err := Load(good)
	if err != nil || c.Agent.Drivers["criu"] != "host" || c.Validate() != nil {
		t.Fatalf("agent.drivers {criu: host} = %v, %v, %v", c.Agent.Drivers, err, c.Validate())
	}
	c.Agent.Drivers = map[engine.Name]spec.DriverName{"zap": "container", "dmtcp": "vm"}
	err = c.Validate()
	for _, want := range []string{`agent.drivers: "zap" is not a checkpoint engine of this build: use dmtcp or criu`, `agent.drivers.dmtcp "vm": use container or host`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want %q", err, want)
		}
	}
	t.Setenv("FOGDEPLOY_DRIVERS", "criu=host, dmtcp=container")
	c = Default()
	c.ApplyEnv()
	if c.Agent.Drivers["criu"] != spec.DriverHost || c.Agent.Drivers["dmtcp"] != spec.DriverContainer || c.Validate() != nil {
		t.Errorf("FOGDEPLOY_DRIVERS = %v, %v; want criu host and dmtcp container", c.Agent.Drivers, c.Validate())
	}
	old := filepath.Join(dir, "old.yaml")
	os.WriteFile(old, []byte("agent:\n  criu_driver: host\n"), 0o600)
	if _, err := Load(old); err == nil || !strings.Contains(hint.Of(err), "agent.drivers") {
		t.Errorf("Load with agent.criu_driver = %v (hint %q); want a hint to agent.drivers", err, hint.Of(err))
	}
}
