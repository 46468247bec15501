// The agent's section (agent.*): its keys, defaults' helpers and checks, and how it serves its API.

package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

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
	// Drivers maps a checkpoint engine to the driver that runs its apps
	// on this node: "container" (the default for an engine not listed:
	// the engine in the light container, whose image carries it) or
	// "host" (the agent runs the engine; each app in namespaces and a
	// cgroup of its own; its instances end with the agent under CRIU).
	Drivers map[engine.Name]spec.DriverName `yaml:"drivers"`
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
	for _, eng := range slices.Sorted(maps.Keys(a.Drivers)) {
		if _, ok := engine.Lookup(eng); !ok {
			add("agent.drivers: %q is not a checkpoint engine of this build: use %s", eng, engine.List(engine.Names()))
		}
		if dr := a.Drivers[eng]; dr != spec.DriverContainer && dr != spec.DriverHost {
			add("agent.drivers.%s %q: use container or host", eng, dr)
		}
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
