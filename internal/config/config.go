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
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
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

// Agent tunes pop-agent.
type Agent struct {
	// Capacity is how many instances this node takes; the warm pool's
	// idle slots count against it.
	Capacity int `yaml:"capacity"`
	// PoolSize is how many idle slots per app this node keeps ready by
	// default (an app's `pool:` wins); 0, the default, keeps none.
	PoolSize int `yaml:"pool_size"`
	// SpareSlots is how many spare slots per engine this node keeps:
	// slots made for no app, which a restore of any app that has no pool
	// slot free takes (default 1; 0: none). They count against
	// Capacity.
	SpareSlots int `yaml:"spare_slots"`
	// SparePorts is how many TCP ports a spare publishes (an app with
	// more does not take one); 0: 4.
	SparePorts int `yaml:"spare_ports"`
	// SpareDisk is the size of a spare's writable image ("4GiB", the
	// default): an app whose environment is larger does not take one.
	SpareDisk string `yaml:"spare_disk"`
	// LeaseTTL is the node lease in seconds: a killed agent's node turns
	// NotReady after it.
	LeaseTTL int `yaml:"lease_ttl"`
	// ReconcileInterval is how often the agent compares what etcd wants
	// with what runs on its node, retrying what failed (e.g. an image
	// still watched by a killed rbd-fuse).
	ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	// DMTCPImage is the DMTCP container image; "" (the default) runs the
	// newest image on the node labelled as one (io.fogdeploy.dmtcp.version),
	// whatever its tag, as `make dmtcp-image` builds it.
	DMTCPImage string `yaml:"dmtcp_image"`
	// DMTCPDriver is "container" (default) or "host".
	DMTCPDriver spec.DriverName `yaml:"dmtcp_driver"`
	// CRIUDriver is "container" (default: CRIU runs in the light
	// container, whose image carries it when CRIU was installed at its
	// build) or "host" (the agent runs criu; instances end with it).
	CRIUDriver spec.DriverName `yaml:"criu_driver"`
	// Recycle on (default: an undeployed instance of an app with a
	// pool goes back to the pool in its container, its root reset,
	// instead of being removed, so that the next deploys need no slot
	// provisioned anew) or off.
	Recycle Switch `yaml:"recycle"`
	// PoolAhead on (default: a warm pool's slot is restored before
	// any request and waits running at the background CPU weight, so that
	// a deploy that takes it only raises it; it holds the app's memory
	// meanwhile) or off (slots wait with their instance created, and a
	// deploy that takes one restarts the app). Nodes whose cgroups cannot
	// be reweighted keep slots unstarted either way.
	PoolAhead Switch `yaml:"pool_ahead"`
	// HitConcurrency is how many pool hits run their stages at once on
	// this node; more wait in arrival order (their `queue` phase). 0 (the
	// default) is the node's CPUs plus one.
	HitConcurrency int `yaml:"hit_concurrency"`
	// RecycleKeep is how long the pool keeps idle slots beyond its size
	// (recycled ones) before it releases them; at most as many as its
	// size are kept beyond it. Default 2m.
	RecycleKeep time.Duration `yaml:"recycle_keep"`
	// BootImage runs apps with no checkpoint engine
	// (`dmtcp-image/build.sh -b`).
	BootImage string `yaml:"boot_image"`
	// IfBusy is what a deploy does while another deploy produces the
	// app's first checkpoint: wait (default) or boot normally meanwhile.
	IfBusy spec.Policy `yaml:"if_busy"`
	// KeepGenerations is how many checkpoint generations per app are
	// kept; older ones go once no deployment uses them.
	KeepGenerations int `yaml:"keep_generations"`
	// IfNoEngine is what a deploy does on a node that cannot run the app's
	// checkpoint engine: boot normally (default) or fail.
	IfNoEngine spec.Policy `yaml:"if_no_engine"`
	// TokenFile holds the operator's admin token of the hook API, in
	// clear (mode 0600): a client with every app, every deployment and
	// /metrics, without a rate limit. The agent keeps only its SHA-256.
	// fogctl sends it to agents (fogctl logs).
	TokenFile string `yaml:"token_file"`
	// TokensFile lists the API's clients (a YAML list; docs/api.md): each
	// with the SHA-256 of its token, its apps, its label and its rate.
	// Outside --dev, token_file or tokens_file is required.
	TokensFile string `yaml:"tokens_file"`
	// Advertise is the host:port where the other nodes and fogctl reach
	// this agent's API, registered in etcd ("": the listener's address,
	// which must then not be 0.0.0.0 or [::]). Its certificate must name
	// that host.
	Advertise string `yaml:"advertise"`
	// TLSCertFile and TLSKeyFile (PEM, the key mode 0600) serve the API
	// over TLS; both or neither. Without them the agent listens on a
	// loopback address only.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// CAFile holds the PEM certificates that callers of agents (fogctl)
	// verify the agents' certificates against; "": the system's roots.
	CAFile string `yaml:"ca_file"`
	// CheckpointCache is the byte budget of the node's copies of the
	// checkpoint generations its restores read ("4GiB"; "0": no limit).
	CheckpointCache string `yaml:"checkpoint_cache"`
	// Fetch is when the node copies a generation's checkpoint: on its
	// first use by a restore or a warm-pool slot (first-use, the default),
	// or as soon as it is sealed (sealed).
	Fetch string `yaml:"fetch"`
	// EnvRead is where restores read their environment from: shared (the
	// default: one read-only copy of a generation's environment per node,
	// under an overlay whose writes go to the instance's own clone) or
	// clone (the instance's own clone only).
	EnvRead string `yaml:"env_read"`
	// MemoryMerge: slots restored ahead share their identical pages.
	MemoryMerge MemoryMerge `yaml:"memory_merge"`
	// Frontend is the node's front end to the PoP's endpoints.
	Frontend Frontend `yaml:"frontend"`
}

// Environment read paths (Agent.EnvRead).
const (
	EnvReadShared = "shared"
	EnvReadClone  = "clone"
)

// Fetch policies (Agent.Fetch).
const (
	FetchFirstUse = "first-use"
	FetchSealed   = "sealed"
)

// SpareDiskBytes is Agent.SpareDisk in bytes.
func (a Agent) SpareDiskBytes() (int64, error) {
	if strings.TrimSpace(a.SpareDisk) == "" {
		return 0, nil
	}
	return layering.ParseSize("agent.spare_disk", a.SpareDisk)
}

// CheckpointCacheBytes is Agent.CheckpointCache in bytes (0: no limit).
func (a Agent) CheckpointCacheBytes() (int64, error) {
	if strings.TrimSpace(a.CheckpointCache) == "0" {
		return 0, nil
	}
	return layering.ParseSize("agent.checkpoint_cache", a.CheckpointCache)
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
		Agent: Agent{Capacity: 8, SpareSlots: 1, LeaseTTL: 5, ReconcileInterval: 10 * time.Second, KeepGenerations: 3, DMTCPDriver: spec.DriverContainer, CRIUDriver: spec.DriverContainer, Recycle: On, PoolAhead: On, RecycleKeep: 2 * time.Minute,
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
		return c, fmt.Errorf("config file %s: %w", path, err)
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
	if v := os.Getenv("FOGDEPLOY_CRIU_DRIVER"); v != "" {
		c.Agent.CRIUDriver = spec.DriverName(v)
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

// validate checks the agent section.
func (a Agent) validate() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if a.Capacity < 1 || a.Capacity > 1000 {
		add("agent.capacity %d: give the number of instances this node takes (1-1000)", a.Capacity)
	}
	if a.PoolSize < 0 || a.PoolSize > a.Capacity {
		add("agent.pool_size %d: give the idle slots per app this node keeps ready, 0 to agent.capacity (%d)", a.PoolSize, a.Capacity)
	}
	if a.SpareSlots < 0 || a.SpareSlots > a.Capacity {
		add("agent.spare_slots %d: give the spare slots per engine this node keeps, 0 to agent.capacity (%d)", a.SpareSlots, a.Capacity)
	}
	if a.SparePorts < 0 || a.SparePorts > 16 {
		add("agent.spare_ports %d: give the TCP ports a spare slot publishes, 1 to 16 (0: 4)", a.SparePorts)
	}
	if b, err := a.SpareDiskBytes(); err != nil {
		add("%v: give a size such as 4GiB", err)
	} else if b != 0 && b < 64<<20 {
		add("agent.spare_disk %s: give at least 64MiB, e.g. 4GiB", a.SpareDisk)
	}
	if a.ReconcileInterval < time.Second || a.ReconcileInterval > time.Hour {
		add("agent.reconcile_interval %s: give a duration between 1s and 1h, e.g. 10s", a.ReconcileInterval)
	}
	if a.KeepGenerations < 1 || a.KeepGenerations > 100 {
		add("agent.keep_generations %d: keep between 1 and 100 checkpoint generations per app", a.KeepGenerations)
	}
	errs = append(errs, a.MemoryMerge.validate()...)
	errs = append(errs, a.Frontend.validate()...)
	if a.LeaseTTL < 2 || a.LeaseTTL > 300 {
		add("agent.lease_ttl %d: give seconds between 2 and 300", a.LeaseTTL)
	}
	if _, err := a.CheckpointCacheBytes(); err != nil {
		add("agent.checkpoint_cache %q: give the bytes of checkpoints a node keeps, e.g. 4GiB, or 0 for no limit (%v)", a.CheckpointCache, err)
	}
	if a.Fetch != FetchFirstUse && a.Fetch != FetchSealed {
		add("agent.fetch %q: use first-use (copy a checkpoint to the node when a restore needs it) or sealed (as soon as it is sealed)", a.Fetch)
	}
	if a.EnvRead != EnvReadShared && a.EnvRead != EnvReadClone {
		add("agent.env_read %q: use shared (a restore reads its environment from the node's copy of its generation's) or clone (from its own clone only)", a.EnvRead)
	}
	if a.IfBusy != spec.PolicyWait && a.IfBusy != spec.PolicyBoot {
		add("agent.if_busy %q: use wait (for the first checkpoint) or boot (normally, meanwhile)", a.IfBusy)
	}
	if a.IfNoEngine != spec.PolicyBoot && a.IfNoEngine != spec.PolicyFail {
		add("agent.if_no_engine %q: use boot (normally, without a checkpoint) or fail", a.IfNoEngine)
	}
	if a.DMTCPDriver != spec.DriverContainer && a.DMTCPDriver != spec.DriverHost {
		add("agent.dmtcp_driver %q: use container or host", a.DMTCPDriver)
	}
	if a.CRIUDriver != spec.DriverContainer && a.CRIUDriver != spec.DriverHost {
		add("agent.criu_driver %q: use container or host", a.CRIUDriver)
	}
	for field, s := range map[string]Switch{"agent.recycle": a.Recycle, "agent.pool_ahead": a.PoolAhead, "agent.frontend.kernel": a.Frontend.Kernel} {
		if err := s.check(field); err != nil {
			errs = append(errs, err)
		}
	}
	if a.HitConcurrency < 0 || a.HitConcurrency > 1000 {
		add("agent.hit_concurrency %d: give how many pool hits run at once (1-1000), or 0 for the node's CPUs plus one", a.HitConcurrency)
	}
	if a.RecycleKeep < 0 || a.RecycleKeep > time.Hour {
		add("agent.recycle_keep %s: give a duration between 0s and 1h, e.g. 2m", a.RecycleKeep)
	}
	if (a.TLSCertFile == "") != (a.TLSKeyFile == "") {
		add("agent.tls_cert_file %q and agent.tls_key_file %q: give both (the PEM certificate of the agent's API and its key) or neither", a.TLSCertFile, a.TLSKeyFile)
	}
	if a.TokenFile != "" && a.TokenFile == a.TokensFile {
		add("agent.token_file and agent.tokens_file are both %s: token_file holds the operator's token in clear, tokens_file the clients' hashes; give two files", a.TokenFile)
	}
	return errs
}

// TLS says whether the agent's API is served over TLS.
func (a Agent) TLS() bool { return a.TLSCertFile != "" && a.TLSKeyFile != "" }

// CheckServe checks how a pop-agent would serve its API on listen
// (host:port): with TLS anywhere; without (agent.tls_cert_file and
// agent.tls_key_file empty) on a loopback address only; outside dev with
// a token (agent.token_file or agent.tokens_file).
func (a Agent) CheckServe(listen string, dev bool) error {
	var errs []error
	if !dev && a.TokenFile == "" && a.TokensFile == "" {
		errs = append(errs, errors.New("agent.token_file and agent.tokens_file are empty: the hook API needs bearer tokens outside --dev: "+
			"give the operator's token file (FOGDEPLOY_TOKEN_FILE) or the clients' tokens file (FOGDEPLOY_TOKENS_FILE; `pop-agent token` mints an entry)"))
	}
	if !a.TLS() && !Loopback(listen) {
		errs = append(errs, fmt.Errorf("--listen %s without TLS: plain HTTP is served on a loopback address only: "+
			"give agent.tls_cert_file and agent.tls_key_file (FOGDEPLOY_TLS_CERT_FILE, FOGDEPLOY_TLS_KEY_FILE), or listen on 127.0.0.1", listen))
	}
	return errors.Join(errs...)
}

// Loopback says whether hostport (host:port) is on a loopback address
// (127.0.0.0/8, ::1, localhost); an empty host (every interface) is not.
func Loopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// DefaultSizeBytes returns layering.default_size in bytes (0 = automatic).
func (c Config) DefaultSizeBytes() int64 {
	n, _ := layering.ParseSize("layering.default_size", c.Layering.DefaultSize)
	return n
}
