package runtime

import (
	"bufio"
	"encoding/json"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// Paths inside the DMTCP container (dmtcp-image/README.md).
const (
	// DMTCPRootPath is where the mounted environment clone is bound; the
	// app runs chrooted into it.
	DMTCPRootPath = "/fog/root"
	// DMTCPEntrypoint is the entrypoint's binary in the DMTCP and boot
	// images; its keep mode runs a command in the root as the app does.
	DMTCPEntrypoint = "/fog/entrypoint"
	// DMTCPCkptPath is where the checkpoint clone is bound; generation N of
	// the checkpoint is written to DMTCPCkptPath/N.
	DMTCPCkptPath = "/fog/ckpt"
	// DMTCPCtlPath is where a pre-started container's control directory
	// is bound (DMTCPContainer.CtlPath).
	DMTCPCtlPath = "/fog/ctl"
	// DMTCPMntPath is where a recyclable container's mount directory is
	// bound (DMTCPContainer.Recycle): the root is its subdirectory, which
	// the host unmounts and mounts again between two instances.
	DMTCPMntPath = "/fog/mnt"
)

// DMTCPCapabilities returns the capabilities the DMTCP container needs,
// measured on Docker 20.10 with the default seccomp profile: SYS_ADMIN (to
// mount proc, /dev, tmpfs and the DMTCP prefix into the clone), SYS_CHROOT
// (to chroot the app into it) and SETPCAP (to drop all three from the
// bounding set before the app starts, so the app runs with no capability at
// all). Without SETPCAP the container still works, but the app keeps
// SYS_ADMIN and SYS_CHROOT. DMTCP itself needs none (no SYS_PTRACE).
// Use them with CapDrop: {"ALL"}.
func DMTCPCapabilities() []string { return []string{"SYS_ADMIN", "SYS_CHROOT", "SETPCAP"} }

// CRIUCapabilities returns the capabilities the light container needs
// to run an app under CRIU (DMTCPContainer.Engine "criu"), where criu dump
// and criu restore run inside the container, measured on Docker 20.10:
// those of DMTCP plus what criu needs to read and rebuild a process tree
// (SYS_PTRACE, DAC_READ_SEARCH and the app's own, CRIUAppCapabilities),
// its TCP sockets (NET_ADMIN: repair mode), the System V IPC of the app's
// IPC namespace whatever its owner and mode (IPC_OWNER: PostgreSQL's
// shared memory segment, 0600 and its user's) and the time namespace
// it always restores into (SYS_TIME: the clock offsets; the entrypoint
// drops it once the app is restored). SYS_RESOURCE (which would let criu
// raise RLIMIT_NOFILE) is left out: hosts whose bounding set lacks it
// refuse to create the container. The app itself is started with only
// CRIUAppCapabilities (the entrypoint's nocaps mode), so its image records
// no more and the restored app holds no more. Use them with
// CRIUSecurityOpt and CRIUDevices.
func CRIUCapabilities() []string {
	return append(append(DMTCPCapabilities(), "SYS_PTRACE", "DAC_READ_SEARCH", "NET_ADMIN", "IPC_OWNER", "SYS_TIME"),
		CRIUAppCapabilities()...)
}

// CRIUAppCapabilities returns the capabilities a CRIU container's app
// keeps: what a daemon started as root needs to give its workers another
// user and to own its files (nginx: a root master, www-data workers),
// which Docker gives every root container by default; never SYS_ADMIN,
// SYS_PTRACE, NET_ADMIN or SYS_TIME. (A DMTCP app keeps none; one that
// needs a user has DMTCPContainer.User.)
func CRIUAppCapabilities() []string {
	return []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE"}
}

// CRIUSecurityOpt returns the security options of a CRIU container:
// no-new-privileges, and no seccomp filter, since criu cannot suspend the
// app's filter while it runs under one itself ("suspending seccomp failed:
// Operation not permitted").
func CRIUSecurityOpt() []string { return []string{"no-new-privileges", "seccomp=unconfined"} }

// CRIUDevices returns the devices of a CRIU container: /dev/net/tun,
// which `criu check` opens (Docker's default device rules allow it).
func CRIUDevices() []Device { return []Device{{HostPath: "/dev/net/tun"}} }

// CRIUTmpfs is the tmpfs a CRIU container gets at /run, where criu keeps
// its kernel-feature cache (criu.kdat, kept on tmpfs only): the check a
// slot runs while it waits fills it, and its restore reads it instead of
// probing the kernel again.
func CRIUTmpfs() map[string]string { return map[string]string{"/run": "size=1m,mode=0755"} }

// DMTCPUserCapabilities returns what a container whose app runs as a user
// of its environment (DMTCPContainer.User) needs on top of
// DMTCPCapabilities: SETUID and SETGID, used by the entrypoint's keeper to
// start the app as that user and dropped from every set, the bounding set
// included, before the app runs.
func DMTCPUserCapabilities() []string { return []string{"SETUID", "SETGID"} }

// DMTCPContainer describes the DMTCP container of one app instance: the
// image built by dmtcp-image/build.sh, run with the environment clone and the
// checkpoint clone bind-mounted. Launch and Restart return the Spec to
// Create.
type DMTCPContainer struct {
	// Image is the DMTCP image, e.g. "fogdeploy/dmtcp:4.2.0".
	Image      string
	Deployment string
	App        string
	Name       string
	// EnvPath is the host path where the environment clone is mounted.
	EnvPath string
	// CkptPath is the host path where the checkpoint clone is mounted.
	CkptPath string
	// CkptSource, when set, is a host directory holding the generation
	// Restart restores; it is bound read-only over that generation's
	// directory inside CkptPath (the node's one copy of it, shared by
	// every restore of the generation).
	CkptSource string
	// SourceLater: CkptSource is whole only once the order is given (Wait):
	// the entrypoint reads it after the order (-source-later).
	SourceLater bool
	// RootLater: the root at EnvPath is mounted, and CkptPath filled with
	// the generation to restore, only before the order (Wait): EnvPath's
	// parent, a shared mount on the host, is bound with slave propagation
	// as for Recycle, and the entrypoint reads nothing of either before
	// the order (-root-later).
	RootLater bool
	// CkptShared: CkptPath lies in a shared mount on the host, and is
	// bound with slave propagation: a directory the host mounts in it
	// later (a checkpoint written into memory) shows up inside.
	CkptShared bool
	// sourceGen is the generation CkptSource is bound as.
	sourceGen int
	// userCaps gives the container DMTCPUserCapabilities without a User
	// (a spare: Spare).
	userCaps bool
	// Ports are the app's ports to publish.
	Ports []Port
	// ReadyAddr, if set, is an address inside the container
	// ("127.0.0.1:6379") that the entrypoint probes to report the
	// launch_ready / restart_ready / boot_ready timing.
	ReadyAddr string
	// ReadySend and ReadyExpect make the probe protocol-aware: ReadySend is
	// written on each connection and the app is ready once the reply starts
	// with ReadyExpect. Both may use the escapes \r \n \t \\ as text
	// (e.g. `PING\r\n` and `+PONG` for redis). Without them, the first
	// accepted connection counts, which is optimistic after a restart: a
	// restored listening socket accepts before the app runs again.
	ReadySend   string
	ReadyExpect string
	// ReadyHTTPPath, instead of ReadySend and ReadyExpect, makes the probe
	// an HTTP GET of this path, ready once it is answered with ReadyStatus
	// (0: any 2xx).
	ReadyHTTPPath string
	ReadyStatus   int
	// User, if set, is the user of the environment the app runs as
	// (NAME, UID, NAME:GROUP or UID:GID, resolved in the environment's
	// /etc/passwd and /etc/group); "" runs it as root. Either way the app
	// holds no capability.
	User string
	// Env is the app's environment (KEY=VALUE). It goes to the entrypoint
	// as -env flags, for the app alone: the container's own environment
	// is the image's, so that no variable of the app's steers the
	// entrypoint, which runs with the container's capabilities. The
	// entrypoint adds LC_ALL=C.
	Env         []string
	WorkingDir  string
	NanoCPUs    int64
	MemoryBytes int64
	// Network and NetworkOpen are Spec's: the instance's network.
	Network     string
	NetworkOpen bool
	// PidsLimit, OpenFiles, LogBytes and LogFiles are Spec's.
	PidsLimit int64
	OpenFiles uint64
	LogBytes  int64
	LogFiles  int
	Labels    map[string]string
	// StopSignal is the signal that stops the app ("SIGTERM" when ""): the
	// container's stop signal, which the entrypoint forwards to the app
	// (SIGTERM, SIGINT, SIGQUIT or SIGHUP).
	StopSignal string
	// CheckpointDelay is how long the entrypoint waits between a
	// checkpoint request and the checkpoint, for apps that are still
	// closing connections right after they served (0: none).
	CheckpointDelay time.Duration
	// CtlPath, if set, is a host directory bound at DMTCPCtlPath.
	CtlPath string
	// Wait makes the entrypoint prepare everything (the root, the
	// coordinator) and then wait until instancectl.Order appears in CtlPath
	// before it starts the app: a pre-started slot. Needs CtlPath.
	Wait bool
	// CPUShares is the container's CPU weight at creation (0: the
	// runtime's default).
	CPUShares int64
	// AfterCheckpoint is "exit" (default: the app is stopped by the
	// checkpoint and the container exits 0) or "continue" (DMTCP only).
	AfterCheckpoint string
	// Engine is the checkpoint engine that runs in the container:
	// "" or "dmtcp" (its coordinator), or "criu" (criu dump and restore
	// run by the entrypoint; the image must carry CRIU, see
	// CRIUVersionLabel). A CRIU container gets CRIUCapabilities and
	// CRIUTmpfs; its app runs as root (User must be "").
	Engine engine.Name
	// Lazy restores with CRIU's lazy pages (Engine "criu", Restart only).
	Lazy bool
	// Recycle makes the container serve instance after instance (DMTCP,
	// Restart with Wait): EnvPath's parent directory, a shared mount on
	// the host, is bound at DMTCPMntPath with PropagationSlave and the root
	// is EnvPath's name under it, so that the host can reset the root
	// between two instances (instancectl.Release).
	Recycle bool
}

// Launch returns the spec of a container that runs argv under DMTCP. It
// checkpoints into the next generation on SIGUSR1 or instancectl.CheckpointRequest.
func (c DMTCPContainer) Launch(argv []string) Spec {
	c.Recycle, c.RootLater = false, false
	return c.spec(append(append(c.flags(0), "--"), argv...), "launch")
}

// Restart returns the spec of a container that restores generation gen of
// the checkpoint (0: the newest complete one).
func (c DMTCPContainer) Restart(gen int) Spec {
	c.sourceGen = gen
	return c.spec(c.flags(gen), "restart")
}

// Boot returns the spec of a container that runs argv with no checkpoint
// engine (the entrypoint's boot mode), e.g. from the boot image built by
// `dmtcp-image/build.sh -b`. CkptPath is not bound; the ready probe reports
// boot_ready.
func (c DMTCPContainer) Boot(argv []string) Spec {
	c.CkptPath, c.AfterCheckpoint, c.CheckpointDelay, c.Engine, c.Lazy, c.Recycle, c.RootLater = "", "", 0, "", false, false, false
	return c.spec(append(append(c.flags(0), "--"), argv...), "boot")
}

// Check returns the spec of a container that only checks that its engine
// can run (for CRIU: criu check, with a CRIU instance's capabilities) and
// exits 0 if so. Nothing is bound and no network is needed.
func (c DMTCPContainer) Check() Spec {
	c.EnvPath, c.CkptPath, c.CtlPath, c.Ports, c.ReadyAddr, c.Wait, c.Recycle, c.RootLater = "", "", "", nil, "", false, false, false
	s := c.spec(c.flags(0), "check")
	s.Network = NetworkNone
	return s
}

func (c DMTCPContainer) flags(from int) []string {
	var f []string
	for _, kv := range c.Env {
		f = append(f, "-env", kv)
	}
	if c.ReadyAddr != "" {
		f = append(f, "-ready", c.ReadyAddr)
		if c.ReadySend != "" {
			f = append(f, "-ready-send", c.ReadySend)
		}
		if c.ReadyExpect != "" {
			f = append(f, "-ready-expect", c.ReadyExpect)
		}
		if c.ReadyHTTPPath != "" {
			f = append(f, "-ready-http", c.ReadyHTTPPath)
		}
		if c.ReadyStatus != 0 {
			f = append(f, "-ready-status", strconv.Itoa(c.ReadyStatus))
		}
	}
	if c.WorkingDir != "" {
		f = append(f, "-workdir", c.WorkingDir)
	}
	if c.User != "" {
		f = append(f, "-user", c.User)
	}
	if c.AfterCheckpoint != "" {
		f = append(f, "-after-checkpoint", c.AfterCheckpoint)
	}
	if c.CheckpointDelay > 0 {
		f = append(f, "-checkpoint-delay", c.CheckpointDelay.String())
	}
	if from > 0 {
		f = append(f, "-from", strconv.Itoa(from))
	}
	if c.Wait {
		f = append(f, "-wait", DMTCPCtlPath+"/"+instancectl.Order)
		if c.SourceLater && from > 0 && c.CkptSource != "" {
			f = append(f, "-source-later")
		}
	}
	if c.Recycle && c.EnvPath != "" {
		f = append(f, "-recycle")
	}
	if c.underMnt() {
		f = append(f, "-root", DMTCPRoot(c.EnvPath, true))
	}
	if c.RootLater && c.Wait && c.EnvPath != "" {
		f = append(f, "-root-later")
	}
	if eng := engineOr(c.Engine); eng != engine.Default() {
		f = append(f, "-engine", string(eng))
	}
	if c.Lazy && engine.Of(c.Engine).LazyRestore {
		f = append(f, "-lazy")
	}
	return f
}

func (c DMTCPContainer) spec(args []string, mode string) Spec {
	labels := map[string]string{"io.fogdeploy.role": "dmtcp-" + mode}
	stopSignal := c.StopSignal
	if stopSignal == "" {
		stopSignal = "SIGTERM"
	}
	caps := DMTCPCapabilities()
	if c.User != "" || c.userCaps {
		caps = append(caps, DMTCPUserCapabilities()...)
	}
	var (
		tmpfs   map[string]string
		devices []Device
	)
	secOpt := []string{"no-new-privileges"}
	if engine.Of(c.Engine).DumpsFromOutside && mode != "boot" {
		caps, tmpfs, devices, secOpt = CRIUCapabilities(), CRIUTmpfs(), CRIUDevices(), CRIUSecurityOpt()
	}
	// The image's files are read-only: an app that reaches the container's
	// root (through a supervisor's /proc/PID/root) cannot replace the
	// entrypoint that later runs with capabilities. Its writable places
	// are the binds and this /tmp (the coordinator's).
	tmpfs = maps.Clone(tmpfs)
	if tmpfs == nil {
		tmpfs = map[string]string{}
	}
	tmpfs["/tmp"] = "size=16m,mode=1777"
	for k, v := range c.Labels {
		labels[k] = v
	}
	return Spec{
		Name:         c.Name,
		Deployment:   c.Deployment,
		App:          c.App,
		Image:        c.Image,
		Cmd:          append([]string{mode}, args...),
		Binds:        c.binds(),
		Ports:        c.Ports,
		CapDrop:      []string{"ALL"},
		CapAdd:       caps,
		SecurityOpt:  secOpt,
		Tmpfs:        tmpfs,
		ReadOnlyRoot: true,
		Devices:      devices,
		NanoCPUs:     c.NanoCPUs,
		MemoryBytes:  c.MemoryBytes,
		Network:      c.Network,
		NetworkOpen:  c.NetworkOpen,
		PidsLimit:    c.PidsLimit,
		OpenFiles:    c.OpenFiles,
		LogBytes:     c.LogBytes,
		LogFiles:     c.LogFiles,
		CPUShares:    c.CPUShares,
		Labels:       labels,
		StopSignal:   stopSignal,
	}
}

func (c DMTCPContainer) binds() []Bind {
	var b []Bind
	switch {
	case c.underMnt():
		b = append(b, Bind{HostPath: filepath.Dir(c.EnvPath), ContainerPath: DMTCPMntPath, Propagation: PropagationSlave})
	case c.EnvPath != "":
		b = append(b, Bind{HostPath: c.EnvPath, ContainerPath: DMTCPRootPath})
	}
	if c.CkptPath != "" {
		ck := Bind{HostPath: c.CkptPath, ContainerPath: DMTCPCkptPath}
		if c.CkptShared {
			ck.Propagation = PropagationSlave
		}
		b = append(b, ck)
		if c.CkptSource != "" && c.sourceGen > 0 {
			b = append(b, Bind{HostPath: c.CkptSource, ContainerPath: DMTCPGenerationDir(DMTCPCkptPath, c.sourceGen), ReadOnly: true})
		}
	}
	if c.CtlPath != "" {
		b = append(b, Bind{HostPath: c.CtlPath, ContainerPath: DMTCPCtlPath})
	}
	return b
}

// underMnt: the root is mounted under EnvPath's parent, bound with slave
// propagation (Recycle, RootLater).
func (c DMTCPContainer) underMnt() bool {
	return c.EnvPath != "" && (c.Recycle || c.RootLater)
}

// DMTCPRoot is the path inside the container of the root mounted at host
// path envPath: DMTCPRootPath, or, in a recyclable container
// (DMTCPContainer.Recycle), envPath's name under DMTCPMntPath.
func DMTCPRoot(envPath string, recycle bool) string {
	if recycle {
		return DMTCPMntPath + "/" + filepath.Base(envPath)
	}
	return DMTCPRootPath
}

// DMTCPGenerationDir is the host directory of checkpoint generation gen.
func DMTCPGenerationDir(ckptPath string, gen int) string {
	return filepath.Join(ckptPath, strconv.Itoa(gen))
}

// Timing is one phase reported by the DMTCP container's entrypoint as a
// JSON line on its stdout: mount, coordinator, launch_ready,
// restart_ready, checkpoint (with Bytes, the image size) and exit.
type Timing struct {
	Phase string  `json:"phase"`
	Mode  string  `json:"mode"`
	Gen   int     `json:"gen,omitempty"`
	MS    float64 `json:"ms"`
	Bytes int64   `json:"bytes,omitempty"`
	Error string  `json:"error,omitempty"`
}

// ParseTimings extracts the entrypoint's timing lines from container logs.
func ParseTimings(logs string) []Timing {
	var out []Timing
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") || !strings.Contains(line, `"phase"`) {
			continue
		}
		var t Timing
		if json.Unmarshal([]byte(line), &t) == nil && t.Phase != "" {
			out = append(out, t)
		}
	}
	return out
}
