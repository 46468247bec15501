// Package config holds the configuration shared by fogctl and pop-agent.
//
// It is layered: Default() → a YAML file (Load) → environment variables
// (ApplyEnv) → command-line flags (set by the caller) → Validate, which
// reports every problem at once, each naming its field.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Config is the whole configuration.
type Config struct {
	Ceph     Ceph     `yaml:"ceph"`
	Mapper   Mapper   `yaml:"mapper"`
	Layering Layering `yaml:"layering"`
	Docker   Docker   `yaml:"docker"`
	Node     Node     `yaml:"node"`
	Etcd     Etcd     `yaml:"etcd"`
	Agent    Agent    `yaml:"agent"`
	// PoP is what every node and fogctl of the PoP share.
	PoP PoP `yaml:"pop"`
	// Limits are an instance's where its app spec is silent.
	Limits Limits `yaml:"limits"`
}

// Etcd says how to reach the PoP's etcd (internal/state.Config).
type Etcd struct {
	Endpoints   []string      `yaml:"endpoints"`
	DialTimeout time.Duration `yaml:"dial_timeout"`
	CAFile      string        `yaml:"ca_file"`
	CertFile    string        `yaml:"cert_file"`
	KeyFile     string        `yaml:"key_file"`
}

// Ceph says how to reach the cluster.
type Ceph struct {
	Conf    string        `yaml:"conf"`
	Keyring string        `yaml:"keyring"`
	ID      string        `yaml:"id"`
	Pool    string        `yaml:"pool"`
	Timeout time.Duration `yaml:"timeout"`
}

// Mapper chooses how images are mapped on this node.
type Mapper struct {
	// Backend: auto, krbd, nbd or fuse.
	Backend string `yaml:"backend"`
	// Timeout bounds each mapping step (map, format, mount, unmount,
	// unmap). An rbd-fuse mapping whose step overruns it, because the
	// cluster stopped serving the image, is cut off so that the step fails
	// instead of waiting forever.
	Timeout time.Duration `yaml:"timeout"`
}

// Layering holds the environment tunables.
type Layering struct {
	// DefaultSize of imported images ("" = twice the content + 1 GiB, at least 2 GiB).
	DefaultSize string `yaml:"default_size"`
	SoftDepth   int    `yaml:"soft_depth"`
	HardDepth   int    `yaml:"hard_depth"`
	// BuildHostNetwork lets a RUN step (and fogctl env exec) ask for the
	// node's own network with --network=host; off by default, when the
	// default network (outbound through NAT) serves.
	BuildHostNetwork bool `yaml:"build_host_network"`
}

// Docker says how to reach dockerd.
type Docker struct {
	Host string `yaml:"host"`
}

// Node describes this machine.
type Node struct {
	Name string `yaml:"name"`
	// StateDir holds mapping records, mountpoints and scratch space.
	StateDir string `yaml:"state_dir"`
}

// Default returns the embedded defaults: the cluster and dockerd that
// `make dev-up` starts.
func Default() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "node"
	}
	host = strings.ToLower(strings.SplitN(host, ".", 2)[0])
	return Config{
		Ceph: Ceph{
			Conf:    devenv.CephConf(),
			Keyring: devenv.CephKeyring(),
			ID:      "admin",
			Pool:    devenv.DefaultPool,
			Timeout: 10 * time.Second,
		},
		Mapper:   Mapper{Backend: "auto", Timeout: 30 * time.Second},
		Layering: Layering{SoftDepth: 4, HardDepth: 8},
		Docker:   Docker{Host: devenv.DockerHost()},
		Node:     Node{Name: host, StateDir: filepath.Join(devenv.Dir(), "node", host)},
		Etcd:     Etcd{Endpoints: []string{devenv.EtcdEndpoint}, DialTimeout: 5 * time.Second},
		Agent: Agent{Capacity: 8, SpareSlots: 1, LeaseTTL: 5, ReconcileInterval: 10 * time.Second, KeepGenerations: 3, Recycle: On, PoolAhead: On, RecycleKeep: 2 * time.Minute,
			BootImage: "fogdeploy/boot:latest", IfBusy: spec.PolicyWait, IfNoEngine: spec.PolicyBoot, CheckpointCache: "4GiB", SpareDisk: "4GiB", Fetch: FetchFirstUse,
			EnvRead: EnvReadShared, MemoryMerge: MemoryMerge{PagesToScan: DefaultMergePages}, Frontend: Frontend{HoldTimeout: 10 * time.Second, MaxHeld: 1024, WakesPerSecond: 5, Kernel: On}},
		PoP:    PoP{Frontend: PoPFrontend{Ports: DefaultEndpointPorts}, Placement: placement.NameLocality},
		Limits: DefaultLimits(),
	}
}

// MaxFileSize bounds a config file.
const MaxFileSize = 1 << 20

// Load reads a YAML file over the defaults. Unknown keys are errors.
func Load(path string) (Config, error) {
	c := Default()
	if path == "" {
		return c, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return c, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return c, fmt.Errorf("config file %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return c, fmt.Errorf("config file %s is larger than %d bytes", path, MaxFileSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("config file %s: %w", path, err)
		if strings.Contains(err.Error(), "field dmtcp_driver") || strings.Contains(err.Error(), "field criu_driver") {
			err = hint.With(err, "agent.dmtcp_driver and agent.criu_driver are now one map, agent.drivers: e.g. `drivers: {dmtcp: container, criu: host}`")
		}
		return c, err
	}
	return c, nil
}

// ApplyEnv applies the FOGDEPLOY_* and DOCKER_HOST environment variables.
func (c *Config) ApplyEnv() {
	set := func(dst *string, key string) {
		if v := os.Getenv(key); v != "" {
			*dst = v
		}
	}
	set(&c.Ceph.Conf, devenv.EnvCephConf)
	set(&c.Ceph.Keyring, devenv.EnvCephKeyring)
	set(&c.Ceph.ID, devenv.EnvCephID)
	set(&c.Ceph.Pool, devenv.EnvCephPool)
	set(&c.Docker.Host, devenv.EnvDockerHost)
	set(&c.Mapper.Backend, "FOGDEPLOY_MAPPER")
	set(&c.Node.Name, "FOGDEPLOY_NODE")
	set(&c.Node.StateDir, "FOGDEPLOY_STATE_DIR")
	set(&c.Agent.DMTCPImage, "FOGDEPLOY_DMTCP_IMAGE")
	set(&c.Agent.BootImage, "FOGDEPLOY_BOOT_IMAGE")
	set(&c.Agent.TokenFile, "FOGDEPLOY_TOKEN_FILE")
	set(&c.Agent.TokensFile, "FOGDEPLOY_TOKENS_FILE")
	set(&c.Agent.TLSCertFile, "FOGDEPLOY_TLS_CERT_FILE")
	set(&c.Agent.TLSKeyFile, "FOGDEPLOY_TLS_KEY_FILE")
	set(&c.Agent.CAFile, "FOGDEPLOY_CA_FILE")
	set(&c.Agent.Fetch, "FOGDEPLOY_FETCH")
	set(&c.Agent.EnvRead, "FOGDEPLOY_ENV_READ")
	set(&c.Agent.Frontend.Listen, "FOGDEPLOY_FRONTEND_LISTEN")
	set(&c.PoP.Frontend.Ports, "FOGDEPLOY_FRONTEND_PORTS")
	// FOGDEPLOY_DRIVERS: engine=driver[,engine=driver...] over agent.drivers.
	if v := os.Getenv("FOGDEPLOY_DRIVERS"); v != "" {
		for _, kv := range strings.Split(v, ",") {
			eng, dr, _ := strings.Cut(strings.TrimSpace(kv), "=")
			if c.Agent.Drivers == nil {
				c.Agent.Drivers = map[engine.Name]spec.DriverName{}
			}
			c.Agent.Drivers[engine.Name(eng)] = spec.DriverName(dr) // Validate says what is wrong
		}
	}
	for dst, key := range map[*Switch]string{&c.Agent.Recycle: "FOGDEPLOY_RECYCLE", &c.Agent.PoolAhead: "FOGDEPLOY_POOL_AHEAD",
		&c.Agent.Frontend.Kernel: "FOGDEPLOY_FRONTEND_KERNEL"} {
		if v := os.Getenv(key); v != "" {
			dst.parse(v)
		}
	}
	set(&c.Agent.CheckpointCache, "FOGDEPLOY_CHECKPOINT_CACHE")
	if v := os.Getenv("FOGDEPLOY_SPARE_SLOTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			n = -1 // Validate says what to give
		}
		c.Agent.SpareSlots = n
	}
	if v := os.Getenv("FOGDEPLOY_ETCD_ENDPOINTS"); v != "" {
		c.Etcd.Endpoints = strings.Split(v, ",")
	}
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	errs = append(errs, c.Limits.validate()...)
	errs = append(errs, c.validateStorage()...)
	if err := layering.ValidateName("node.name", c.Node.Name); err != nil {
		errs = append(errs, err)
	}
	if c.Node.StateDir == "" || !filepath.IsAbs(c.Node.StateDir) {
		add("node.state_dir %q: give an absolute directory", c.Node.StateDir)
	}
	if len(c.Etcd.Endpoints) == 0 {
		add("etcd.endpoints is empty: give host:port of an etcd member (FOGDEPLOY_ETCD_ENDPOINTS), or run `make dev-up` for the dev one")
	}
	if (c.Etcd.CertFile == "") != (c.Etcd.KeyFile == "") {
		add("etcd.cert_file and etcd.key_file: give both or neither")
	}
	errs = append(errs, c.Agent.validate()...)
	if _, _, _, err := c.PoP.Frontend.Range(); err != nil {
		errs = append(errs, err)
	}
	if _, ok := placement.ByName(c.PoP.Placement); !ok {
		add("pop.placement %q: use %s (a node with the app's pool slots, its checkpoint or a spare slot first, then room) or %s (room alone)",
			c.PoP.Placement, placement.NameLocality, placement.NameSpread)
	}
	if c.Docker.Host != "" && !strings.Contains(c.Docker.Host, "://") {
		add("docker.host %q: give a URL such as unix:///var/run/docker.sock", c.Docker.Host)
	}
	return errors.Join(errs...)
}

// validateStorage checks the ceph, mapper and layering sections.
func (c Config) validateStorage() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Ceph.Conf == "" {
		add("ceph.conf is empty: give the path of a ceph.conf (--ceph-conf), or run `make dev-up`")
	}
	if c.Ceph.ID == "" || strings.HasPrefix(c.Ceph.ID, "client.") {
		add("ceph.id %q: give the cephx user without the \"client.\" prefix, e.g. admin", c.Ceph.ID)
	}
	if err := layering.ValidateName("ceph.pool", c.Ceph.Pool); err != nil {
		errs = append(errs, err)
	}
	if c.Ceph.Timeout <= 0 {
		add("ceph.timeout %s: use a positive duration such as 10s", c.Ceph.Timeout)
	}
	switch c.Mapper.Backend {
	case "auto", "krbd", "nbd", "fuse":
	default:
		add("mapper.backend %q: use auto, krbd, nbd or fuse", c.Mapper.Backend)
	}
	if c.Mapper.Timeout < time.Second || c.Mapper.Timeout > time.Hour {
		add("mapper.timeout %s: give a duration between 1s and 1h, e.g. 30s", c.Mapper.Timeout)
	}
	if c.Layering.DefaultSize != "" {
		if _, err := layering.ParseSize("layering.default_size", c.Layering.DefaultSize); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Layering.SoftDepth < 1 || c.Layering.HardDepth < c.Layering.SoftDepth {
		add("layering.soft_depth %d / hard_depth %d: need 1 <= soft <= hard (defaults 4 and 8)", c.Layering.SoftDepth, c.Layering.HardDepth)
	}
	return errs
}

// DefaultSizeBytes returns layering.default_size in bytes (0 = automatic).
func (c Config) DefaultSizeBytes() int64 {
	n, _ := layering.ParseSize("layering.default_size", c.Layering.DefaultSize)
	return n
}
