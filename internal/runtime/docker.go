package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/docker/go-connections/nat"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/fogdeploy/fogdeploy/internal/docker"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/procfs"
)

// DockerClient is the part of the moby client (*client.Client) that Docker
// uses.
type DockerClient interface {
	Ping(ctx context.Context) (types.Ping, error)
	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig, networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, containerName string) (container.CreateResponse, error)
	ContainerStart(ctx context.Context, containerID string, options container.StartOptions) error
	ContainerStop(ctx context.Context, containerID string, options container.StopOptions) error
	ContainerRemove(ctx context.Context, containerID string, options container.RemoveOptions) error
	ContainerInspect(ctx context.Context, containerID string) (container.InspectResponse, error)
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ContainerLogs(ctx context.Context, containerID string, options container.LogsOptions) (io.ReadCloser, error)
	ContainerWait(ctx context.Context, containerID string, condition container.WaitCondition) (<-chan container.WaitResponse, <-chan error)
	ContainerKill(ctx context.Context, containerID, signal string) error
	ContainerUpdate(ctx context.Context, containerID string, updateConfig container.UpdateConfig) (container.UpdateResponse, error)
	ImageImport(ctx context.Context, source image.ImportSource, ref string, options image.ImportOptions) (io.ReadCloser, error)
	ImageInspect(ctx context.Context, imageID string, inspectOpts ...client.ImageInspectOption) (image.InspectResponse, error)
	ImageList(ctx context.Context, options image.ListOptions) ([]image.Summary, error)
	ImageRemove(ctx context.Context, imageID string, options image.RemoveOptions) ([]image.DeleteResponse, error)
	NetworkInspect(ctx context.Context, networkID string, options network.InspectOptions) (network.Inspect, error)
	NetworkCreate(ctx context.Context, name string, options network.CreateOptions) (network.CreateResponse, error)
	NetworkList(ctx context.Context, options network.ListOptions) ([]network.Summary, error)
	NetworkRemove(ctx context.Context, networkID string) error
	ContainerExecCreate(ctx context.Context, containerID string, options container.ExecOptions) (container.ExecCreateResponse, error)
	ContainerExecAttach(ctx context.Context, execID string, config container.ExecAttachOptions) (types.HijackedResponse, error)
	ContainerExecInspect(ctx context.Context, execID string) (container.ExecInspect, error)
}

var _ DockerClient = (*client.Client)(nil)

// Docker is the Runtime over dockerd, through the moby client.
type Docker struct {
	api DockerClient
	log *slog.Logger

	mu      sync.Mutex
	network string // resolved by Network
	// made are fogdeploy's networks known to exist (ensureNetwork).
	made map[string]bool
}

var (
	_ Runtime        = (*Docker)(nil)
	_ Signaler       = (*Docker)(nil)
	_ ImageImporter  = (*Docker)(nil)
	_ ImageInspector = (*Docker)(nil)
	_ Execer         = (*Docker)(nil)
)

// NewDocker returns a Runtime that uses api (a *client.Client made with API
// version negotiation, e.g. by internal/docker.Connect).
func NewDocker(api DockerClient, log *slog.Logger) *Docker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Docker{api: api, log: log}
}

// Dial connects to dockerd at host (e.g. unix:///path/docker.sock; "" = the
// moby defaults, DOCKER_HOST), checks that it answers, and returns the
// Runtime. The error wraps ErrUnavailable when the daemon cannot be reached.
//
// Implements: GET /_ping with API version negotiation.
func Dial(ctx context.Context, host string, log *slog.Logger) (*Docker, error) {
	c, err := docker.Connect(host)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if _, err := c.Ping(ctx); err != nil {
		_ = c.Close()
		return nil, hint.With(fmt.Errorf("dockerd at %s: %w (%w)", host, ErrUnavailable, err),
			"start one with `make dev-up` (scripts/dev-docker.sh) or set DOCKER_HOST")
	}
	return NewDocker(c, log), nil
}

// Network returns the network mode containers get by default: NetworkBridge
// when the daemon has its default "bridge" network, else NetworkNone (a
// daemon started with --bridge=none), which is logged once as a warning.
//
// Implements: GET /networks/bridge.
func (d *Docker) Network(ctx context.Context) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.network != "" {
		return d.network, nil
	}
	_, err := d.api.NetworkInspect(ctx, NetworkBridge, network.InspectOptions{})
	switch {
	case err == nil:
		d.network = NetworkBridge
	case cerrdefs.IsNotFound(err):
		d.network = NetworkNone
		d.log.Warn("dockerd has no bridge network: containers get network none and cannot publish ports",
			"hint", "start dockerd without --bridge=none")
	default:
		return "", d.wrap("inspect network", NetworkBridge, err)
	}
	return d.network, nil
}

// Create implements Runtime.
//
// Implements: POST /containers/create (never pulls).
func (d *Docker) Create(ctx context.Context, spec Spec) (string, error) {
	if err := spec.Validate(); err != nil {
		return "", err
	}
	netMode, err := d.Network(ctx)
	if err != nil {
		return "", err
	}
	if spec.Network != "" && spec.Network != NetworkBridge && netMode != NetworkNone {
		netMode = spec.Network
	}
	if spec.Network == NetworkNone {
		netMode = NetworkNone
	}
	if ValidNetworkName(netMode) {
		if err := d.ensureNetwork(ctx, netMode, spec.NetworkOpen); err != nil {
			return "", err
		}
	}
	if netMode == NetworkNone && len(spec.Ports) > 0 {
		return "", hint.With(fmt.Errorf("container for app %q publishes %d port(s): %w", spec.App, len(spec.Ports), ErrNoNetwork),
			"start dockerd with its default bridge (not --bridge=none)")
	}
	cfg, host := dockerConfig(spec, netMode)
	resp, err := d.api.ContainerCreate(ctx, cfg, host, nil, nil, spec.Name)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return "", hint.With(fmt.Errorf("image %q: %w (docker: %w)", spec.Image, ErrImageNotFound, err),
				"no registry is reached: build or import the image on this node (`docker images` lists them)")
		}
		return "", d.wrap("create container from", spec.Image, err)
	}
	for _, w := range resp.Warnings {
		d.log.Warn("docker create", "id", shortID(resp.ID), "app", spec.App, "warning", w)
	}
	d.log.Debug("container created", "id", shortID(resp.ID), "app", spec.App, "deploy", spec.Deployment, "image", spec.Image)
	return resp.ID, nil
}

func dockerConfig(spec Spec, netMode string) (*container.Config, *container.HostConfig) {
	exposed := nat.PortSet{}
	bindings := nat.PortMap{}
	for _, p := range spec.Ports {
		port := nat.Port(fmt.Sprintf("%d/%s", p.ContainerPort, protoOrTCP(p.Proto)))
		exposed[port] = struct{}{}
		hp := ""
		if p.HostPort != 0 {
			hp = strconv.Itoa(int(p.HostPort))
		}
		bindings[port] = append(bindings[port], nat.PortBinding{HostIP: hostIPOrDefault(p.HostIP), HostPort: hp})
	}
	mounts := make([]mount.Mount, 0, len(spec.Binds))
	for _, b := range spec.Binds {
		m := mount.Mount{Type: mount.TypeBind, Source: b.HostPath, Target: b.ContainerPath, ReadOnly: b.ReadOnly}
		if b.Propagation != "" {
			m.BindOptions = &mount.BindOptions{Propagation: mount.Propagation(b.Propagation)}
		}
		mounts = append(mounts, m)
	}
	devices := make([]container.DeviceMapping, 0, len(spec.Devices))
	for _, dv := range spec.Devices {
		dm := container.DeviceMapping{PathOnHost: dv.HostPath, PathInContainer: dv.ContainerPath, CgroupPermissions: dv.Permissions}
		if dm.PathInContainer == "" {
			dm.PathInContainer = dm.PathOnHost
		}
		if dm.CgroupPermissions == "" {
			dm.CgroupPermissions = "rwm"
		}
		devices = append(devices, dm)
	}
	noInit := false
	cfg := &container.Config{
		Image:        spec.Image,
		Cmd:          spec.Cmd,
		Entrypoint:   spec.Entrypoint,
		Env:          spec.Env,
		WorkingDir:   spec.WorkingDir,
		Labels:       spec.labels(),
		ExposedPorts: exposed,
		StopSignal:   spec.StopSignal,
	}
	host := &container.HostConfig{
		Mounts:         mounts,
		PortBindings:   bindings,
		NetworkMode:    container.NetworkMode(netMode),
		CapAdd:         spec.CapAdd,
		CapDrop:        spec.CapDrop,
		SecurityOpt:    spec.SecurityOpt,
		Tmpfs:          spec.Tmpfs,
		Privileged:     false,
		ReadonlyRootfs: spec.ReadOnlyRoot,
		MaskedPaths:    maskedPaths(),
		ReadonlyPaths:  readonlyPaths(),
		Init:           &noInit,
		AutoRemove:     false,
		Resources: container.Resources{
			NanoCPUs:  spec.NanoCPUs,
			Memory:    spec.MemoryBytes,
			CPUShares: spec.CPUShares,
			Devices:   devices,
		},
	}
	if spec.PidsLimit > 0 {
		host.PidsLimit = &spec.PidsLimit
	}
	if spec.OpenFiles > 0 {
		n := int64(spec.OpenFiles)
		host.Ulimits = []*container.Ulimit{{Name: "nofile", Soft: n, Hard: n}}
	}
	if spec.LogBytes > 0 {
		files := max(spec.LogFiles, 1)
		host.LogConfig = container.LogConfig{Type: "json-file", Config: map[string]string{
			"max-size": strconv.FormatInt(spec.LogBytes, 10), "max-file": strconv.Itoa(files)}}
	}
	return cfg, host
}

// maskedPaths are the paths a container's processes can neither read nor
// write: the project's procfs.Masked under /proc, which hold Docker's
// current defaults (an older daemon, such as Debian's 20.10, masks fewer:
// not /proc/interrupts), and Docker's defaults under /sys. Given, they
// replace the daemon's own list.
func maskedPaths() []string {
	paths := []string{"/sys/firmware", "/sys/devices/virtual/powercap"}
	for _, p := range procfs.Masked {
		paths = append(paths, "/proc/"+p)
	}
	return paths
}

// readonlyPaths are the paths a container's processes may read but not
// write: procfs.ReadOnly under /proc, as Docker's defaults.
func readonlyPaths() []string {
	var paths []string
	for _, p := range procfs.ReadOnly {
		paths = append(paths, "/proc/"+p)
	}
	return paths
}

// Start implements Runtime.
//
// Implements: POST /containers/{id}/start.
//
// dockerd picks a published port's host port among the free ones it knows
// of, not among those another process of the node bound meanwhile: a start
// that finds its port taken (its userland proxy cannot bind it) is tried
// again, up to startAttempts times, and dockerd picks another.
func (d *Docker) Start(ctx context.Context, id string) error {
	var err error
	for i := range startAttempts {
		if err = d.api.ContainerStart(ctx, id, container.StartOptions{}); err == nil || !portTaken(err) || ctx.Err() != nil {
			break
		}
		if i+1 < startAttempts {
			d.log.Info("a port published for the container was taken by another process; starting it again on another", "container", shortID(id), "err", err)
		}
	}
	if err != nil {
		return d.wrap("start container", id, err)
	}
	return nil
}

// startAttempts bounds Start's attempts when a published port is taken.
const startAttempts = 3

// portTaken says whether dockerd refused a start because a published
// host port was bound by another process.
func portTaken(err error) bool {
	return strings.Contains(err.Error(), "address already in use")
}

// Stop implements Runtime. The timeout is rounded up to whole seconds.
//
// Implements: POST /containers/{id}/stop?t=N.
func (d *Docker) Stop(ctx context.Context, id string, timeout time.Duration) error {
	secs := int(math.Ceil(timeout.Seconds()))
	if err := d.api.ContainerStop(ctx, id, container.StopOptions{Timeout: &secs}); err != nil {
		return d.wrap("stop container", id, err)
	}
	return nil
}

// Remove implements Runtime.
//
// Implements: DELETE /containers/{id}?force=1&v=1.
func (d *Docker) Remove(ctx context.Context, id string) error {
	err := d.api.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	return d.wrap("remove container", id, err)
}

// Inspect implements Runtime.
//
// Implements: GET /containers/{id}/json.
func (d *Docker) Inspect(ctx context.Context, id string) (State, error) {
	r, err := d.api.ContainerInspect(ctx, id)
	if err != nil {
		return State{}, d.wrap("inspect container", id, err)
	}
	return stateFromInspect(r), nil
}

// List implements Runtime.
//
// Implements: GET /containers/json?all=1&filters={"label":[...]}, then
// Inspect for each.
func (d *Docker) List(ctx context.Context, labels map[string]string) ([]State, error) {
	args := filters.NewArgs(filters.Arg("label", LabelManaged+"=true"))
	for k, v := range labels {
		args.Add("label", k+"="+v)
	}
	sums, err := d.api.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return nil, d.wrap("list containers", "", err)
	}
	out := make([]State, 0, len(sums))
	for _, s := range sums {
		st, err := d.Inspect(ctx, s.ID)
		if errors.Is(err, ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// Logs implements Runtime.
//
// Implements: GET /containers/{id}/logs?stdout=1&stderr=1&tail=N.
func (d *Docker) Logs(ctx context.Context, id string, tail int) (string, error) {
	t := "all"
	if tail > 0 {
		t = strconv.Itoa(tail)
	}
	rc, err := d.api.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: t})
	if err != nil {
		return "", d.wrap("logs of container", id, err)
	}
	defer rc.Close()
	buf := &tailBuffer{max: MaxLogBytes}
	if _, err := stdcopy.StdCopy(buf, buf, rc); err != nil {
		return buf.String(), fmt.Errorf("read logs of container %s: %w", id, err)
	}
	return buf.String(), nil
}

// Exec implements Execer.
//
// Implements: POST /containers/{id}/exec, POST /exec/{id}/start (attached),
// GET /exec/{id}/json.
func (d *Docker) Exec(ctx context.Context, id string, spec ExecSpec) (ExecResult, error) {
	if len(spec.Cmd) == 0 {
		return ExecResult{}, fmt.Errorf("exec in container %s: no command: %w", id, ErrInvalidSpec)
	}
	st, err := d.Inspect(ctx, id)
	if err != nil {
		return ExecResult{}, err
	}
	if !st.Running {
		return ExecResult{}, fmt.Errorf("exec in container %s: %w: it is %s", id, ErrConflict, st.Status)
	}
	created, err := d.api.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: spec.Cmd, Env: spec.Env,
		AttachStdout: true, AttachStderr: true})
	if err != nil {
		return ExecResult{}, d.wrap("exec in container", id, err)
	}
	att, err := d.api.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return ExecResult{}, d.wrap("exec in container", id, err)
	}
	defer att.Close()
	// The stream ends when the command exits; ctx ends it sooner.
	stop := context.AfterFunc(ctx, func() { _ = att.Conn.Close() })
	defer stop()
	out := &cappedBuffer{max: MaxExecOutput}
	if _, err := stdcopy.StdCopy(out, out, att.Reader); err != nil && ctx.Err() == nil {
		return ExecResult{Output: out.String()}, fmt.Errorf("exec in container %s: read its output: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		return ExecResult{Output: out.String()}, fmt.Errorf("exec in container %s: %w", id, err)
	}
	insp, err := d.api.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		return ExecResult{Output: out.String()}, d.wrap("exec in container", id, err)
	}
	return ExecResult{ExitCode: insp.ExitCode, Output: out.String()}, nil
}

// cappedBuffer keeps the first max bytes written to it and drops the rest.
type cappedBuffer struct {
	bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Wait implements Runtime.
//
// Implements: POST /containers/{id}/wait?condition=not-running.
func (d *Docker) Wait(ctx context.Context, id string) (int, error) {
	resp, errs := d.api.ContainerWait(ctx, id, container.WaitConditionNotRunning)
	select {
	case r := <-resp:
		if r.Error != nil && r.Error.Message != "" {
			return int(r.StatusCode), fmt.Errorf("wait for container %s: %s", id, r.Error.Message)
		}
		return int(r.StatusCode), nil
	case err := <-errs:
		return 0, d.wrap("wait for container", id, err)
	}
}

// Signal implements Signaler.
//
// Implements: POST /containers/{id}/kill?signal=SIG.
func (d *Docker) Signal(ctx context.Context, id, signal string) error {
	if err := d.api.ContainerKill(ctx, id, signal); err != nil {
		return d.wrap("signal "+signal+" to container", id, err)
	}
	return nil
}

// Update implements Updater.
func (d *Docker) Update(ctx context.Context, id string, r Resources) error {
	res := container.Resources{NanoCPUs: r.NanoCPUs, Memory: r.MemoryBytes}
	if r.MemoryBytes > 0 {
		// As at create: swap up to the memory again (dockerd's default).
		res.MemorySwap = 2 * r.MemoryBytes
	}
	if r.PidsLimit > 0 {
		res.PidsLimit = &r.PidsLimit
	}
	if _, err := d.api.ContainerUpdate(ctx, id, container.UpdateConfig{Resources: res}); err != nil {
		return d.wrap("update the limits of container", id, err)
	}
	return nil
}

// wrap maps a moby error onto this package's sentinels, keeping both.
func (d *Docker) wrap(op, what string, err error) error {
	target := what
	if target != "" {
		target = " " + target
	}
	switch {
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%s%s: %w (docker: %w)", op, target, ErrNotFound, err)
	case cerrdefs.IsConflict(err):
		return fmt.Errorf("%s%s: %w (docker: %w)", op, target, ErrConflict, err)
	case cerrdefs.IsInvalidArgument(err):
		return fmt.Errorf("%s%s: %w (docker: %w)", op, target, ErrInvalidSpec, err)
	case client.IsErrConnectionFailed(err):
		return hint.With(fmt.Errorf("%s%s: %w (docker: %w)", op, target, ErrUnavailable, err),
			"start dockerd with `make dev-up` or set DOCKER_HOST")
	default:
		return fmt.Errorf("%s%s: %w", op, target, err)
	}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func jsonArray(ss []string) (string, error) {
	b, err := json.Marshal(ss)
	if err != nil {
		return "", fmt.Errorf("encode %q: %w", ss, err)
	}
	return string(b), nil
}
