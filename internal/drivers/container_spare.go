// Spare instances of the light container: created for no app, at background priority, with a few
// generic ports published; a restore of any app that fits one takes it (Assign), so that it pays
// for no container of its own.

package drivers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/netredirect"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// ErrUnfit: a run cannot take a spare (its engine, ports, network, limits
// or stop signal differ from what the spare was made with).
var ErrUnfit = errors.New("the spare does not fit")

// ErrNoSpares: the driver, or its image, makes no spares.
var ErrNoSpares = errors.New("no spare instances")

// Spare is what a spare instance is made with.
type Spare struct {
	// ID names the instance (its container), as Run.ID.
	ID     string
	Engine engine.Name
	// MntPath is a shared mount on the host, bound into the instance with
	// slave propagation: the root of the run it is assigned is mounted at
	// MntPath/root and its generation bound under MntPath/ckpt after Create.
	MntPath string
	// CtlPath is the instance's control directory.
	CtlPath string
	// Ports is how many generic ports it publishes (at most
	// runtime.MaxSparePorts): a run takes it with as many of its own.
	Ports int
	// Limits are the instance's limits: a run takes it only with the same.
	Limits spec.Limits
}

// SpareRoot and SpareCkpt are where, under a spare's MntPath, the root of
// the run it is assigned is mounted and its checkpoint volume is.
func (sp Spare) SpareRoot() string { return filepath.Join(sp.MntPath, "root") }
func (sp Spare) SpareCkpt() string { return runtime.SpareCkptDir(sp.SpareRoot()) }

func (sp Spare) validate() error {
	var errs []error
	if sp.ID == "" {
		errs = append(errs, errors.New("no ID"))
	}
	if f, ok := engine.Lookup(sp.Engine); !ok || !f.SpareSlots {
		errs = append(errs, fmt.Errorf("engine %q: want %s", sp.Engine, engine.List(engine.NamesWith(func(f engine.Facts) bool { return f.SpareSlots }))))
	}
	if !filepath.IsAbs(sp.MntPath) || !filepath.IsAbs(sp.CtlPath) {
		errs = append(errs, fmt.Errorf("mount directory %q and control directory %q must be absolute paths", sp.MntPath, sp.CtlPath))
	}
	if sp.Ports < 0 || sp.Ports > runtime.MaxSparePorts {
		errs = append(errs, fmt.Errorf("ports %d: want 0 to %d", sp.Ports, runtime.MaxSparePorts))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("spare %q: %w: %w", sp.ID, err, spec.ErrInvalidSpec)
	}
	return nil
}

// Sparer is a Driver that makes spare instances and gives one to a run.
type Sparer interface {
	Driver
	// MakesSpares reports, wrapping ErrNoSpares, why this node's driver
	// makes no spares of engine eng (nil when it does).
	MakesSpares(ctx context.Context, eng engine.Name) error
	// CreateSpare creates a spare instance, waiting for its assignment.
	CreateSpare(ctx context.Context, sp Spare) (Handle, error)
	// Fits reports, wrapping ErrUnfit, why run r cannot take spare sp.
	Fits(sp Spare, r Run) error
	// Assign makes spare h (made with sp) the instance of restart r: it
	// points the app's ports at the spare's, sets the app's limits and
	// gives the spare the restart to become, which reads nothing before
	// Start orders it (as an instance created for r with Run.RootLater):
	// its root is mounted at sp.SpareRoot() and generation r.Gen put in
	// sp.SpareCkpt() meanwhile or before. The environment is checked at
	// r.EnvFiles (the same files; "": the root, mounted already).
	Assign(ctx context.Context, h Handle, sp Spare, r Run) (Handle, error)
}

var _ Sparer = (*Container)(nil)

// MakesSpares implements Sparer.
func (c *Container) MakesSpares(ctx context.Context, eng engine.Name) error {
	img, err := c.image(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoSpares, err)
	}
	switch {
	case !img.spare:
		return fmt.Errorf("%w: image %s has no spare mode (no label %s): rebuild it with `make dmtcp-image`", ErrNoSpares, img.ref, SpareLabel)
	case img.engines[eng] == "":
		return fmt.Errorf("%w of engine %s: image %s carries none (no label %s)", ErrNoSpares, eng, img.ref, engine.ImageLabel(eng))
	case engine.Of(eng).KernelCheck:
		if _, err := c.Check(ctx, eng); err != nil {
			return fmt.Errorf("%w of engine %s: %w", ErrNoSpares, eng, err)
		}
	}
	return nil
}

// CreateSpare implements Sparer: the light container, started, its
// entrypoint in its spare mode.
func (c *Container) CreateSpare(ctx context.Context, sp Spare) (Handle, error) {
	if err := sp.validate(); err != nil {
		return Handle{}, err
	}
	if err := c.MakesSpares(ctx, sp.Engine); err != nil {
		return Handle{}, err
	}
	img, err := c.image(ctx)
	if err != nil {
		return Handle{}, err
	}
	if err := os.MkdirAll(sp.SpareCkpt(), 0o755); err != nil { // bound at runtime.SpareCkptPath
		return Handle{}, fmt.Errorf("spare %s checkpoint volume: %w", sp.ID, err)
	}
	dc := runtime.DMTCPContainer{Image: img.ref, Deployment: sp.ID, App: spareApp, Name: "fd-" + sp.ID, EnvPath: sp.SpareRoot(),
		CtlPath: sp.CtlPath, Engine: sp.Engine, NanoCPUs: int64(sp.Limits.CPUs * 1e9), MemoryBytes: sp.Limits.MemoryBytes,
		Network: IsolatedNetwork, PidsLimit: sp.Limits.Pids, OpenFiles: sp.Limits.OpenFiles, LogBytes: sp.Limits.LogBytes,
		LogFiles: sp.Limits.LogFiles, CPUShares: backgroundShares, Labels: map[string]string{"io.fogdeploy.gen": "0"}}
	rs := dc.Spare(sp.Ports)
	h := Handle{Driver: c.Name(), EnvPath: sp.SpareRoot(), CkptPath: sp.SpareCkpt(), CtlPath: sp.CtlPath, Background: true, RootLater: true,
		CkptShared: true} // its checkpoint volume is bound with slave propagation
	h, err = c.started(ctx, h, rs)
	if err != nil {
		return Handle{}, err
	}
	// What the kernel takes longest for, paid before any request.
	if err := netredirect.Prepare(h.Pid); err != nil {
		return Handle{}, errors.Join(fmt.Errorf("spare %s: %w", sp.ID, err), c.Remove(context.WithoutCancel(ctx), h))
	}
	return h, nil
}

// spareApp is the app label of a spare container.
const spareApp = "spare"

// Fits implements Sparer.
func (c *Container) Fits(sp Spare, r Run) error {
	no := func(format string, args ...any) error {
		return fmt.Errorf("app %s: "+format+": %w", append(append([]any{r.App.Name}, args...), ErrUnfit)...)
	}
	app := r.App
	eng := engineOf(app)
	switch {
	case r.Mode != RunRestart:
		return no("a spare serves restores only, not %s", r.Mode)
	case eng != sp.Engine:
		return no("engine %s, the spare's is %s", eng, sp.Engine)
	case app.Network != "":
		return no("network group %q: spares are on the isolated network", app.Network)
	case len(app.Ports) > sp.Ports:
		return no("%d ports, the spare publishes %d", len(app.Ports), sp.Ports)
	}
	lim := app.LimitsOver(r.Limits)
	if c.limits() {
		// CPUs, memory and processes are set when it is assigned.
		lim.CPUs, lim.MemoryBytes, lim.Pids = sp.Limits.CPUs, sp.Limits.MemoryBytes, sp.Limits.Pids
	}
	if lim != sp.Limits {
		return no("limits %+v, the spare's are %+v", app.LimitsOver(r.Limits), sp.Limits)
	}
	for _, p := range app.Ports {
		if p.Proto != "" && p.Proto != "tcp" {
			return no("port %d/%s: a spare publishes TCP ports only", p.Port, p.Proto)
		}
		if p.Port >= runtime.SparePortBase && p.Port < runtime.SparePortBase+runtime.MaxSparePorts {
			return no("port %d is one of a spare's own (%d-%d)", p.Port, runtime.SparePortBase, runtime.SparePortBase+runtime.MaxSparePorts-1)
		}
	}
	return nil
}

// Assign implements Sparer.
func (c *Container) Assign(ctx context.Context, h Handle, sp Spare, r Run) (Handle, error) {
	if err := c.Fits(sp, r); err != nil {
		return Handle{}, err
	}
	if r.EnvFiles == "" {
		r.EnvFiles = sp.SpareRoot() // mounted already
	}
	r.EnvPath, r.CkptPath, r.CtlPath, r.CkptSource, r.SourceLater, r.RootLater = sp.SpareRoot(), sp.SpareCkpt(), sp.CtlPath, "", false, true
	if err := r.validate(); err != nil {
		return Handle{}, err
	}
	dc, err := c.container(ctx, r)
	if err != nil {
		return Handle{}, err
	}
	if h.Pid <= 0 || !c.ownsPid(h) {
		return Handle{}, fmt.Errorf("spare %s: its container's main process (%d) is gone: the container was stopped or removed", sp.ID, h.Pid)
	}
	ports := map[string]string{}
	var rules []netredirect.Rule
	for i, p := range r.App.Ports {
		generic := PortKey(runtime.SparePortBase+i, "tcp")
		addr, ok := h.Ports[generic]
		if !ok {
			return Handle{}, fmt.Errorf("spare %s publishes no port %s", sp.ID, generic)
		}
		ports[PortKey(p.Port, "tcp")] = addr
		rules = append(rules, netredirect.Rule{From: uint16(runtime.SparePortBase + i), To: uint16(p.Port)})
	}
	// Its entrypoint becomes the app's restart first, while the rest is
	// done (the restart reads nothing before Start orders it), at the
	// normal weight: at the background one, the deploy's own work would
	// starve it. A spare whose Assign fails is not given again.
	h, err = c.raise(h.Pid, h)
	if err != nil {
		return Handle{}, err
	}
	if err := writeCtl(h.CtlPath, instancectl.Assign, instancectl.AssignBody{Args: dc.Assignment(r.Gen)}); err != nil {
		return Handle{}, err
	}
	// The redirects and the limits at once: each waits on the kernel, or
	// dockerd, for a moment.
	var limits error
	done := make(chan struct{})
	go func() {
		defer close(done)
		if lim := r.App.LimitsOver(r.Limits); lim != sp.Limits {
			if err := c.limit(ctx, h, dc); err != nil {
				limits = fmt.Errorf("spare %s: the limits of app %s: %w", sp.ID, r.App.Name, err)
			}
		}
	}()
	redirects := netredirect.Set(h.Pid, rules)
	<-done
	if redirects != nil {
		redirects = fmt.Errorf("spare %s: %w", sp.ID, redirects)
	}
	if err := errors.Join(redirects, limits); err != nil {
		return Handle{}, err
	}
	h.Ports, h.Gen, h.EnvPath, h.CkptPath = ports, r.Gen+1, r.EnvPath, r.CkptPath
	if r.App.StopSignal != "" && r.App.StopSignal != "SIGTERM" {
		h.StopSignal = r.App.StopSignal // the spare's container stops with SIGTERM
	}
	return h, nil
}

// limits reports whether a spare's CPU, memory and processes bounds can
// change when it is assigned.
func (c *Container) limits() bool {
	_, ok := c.RT.(runtime.Updater)
	return ok || c.Limiter != nil
}

// limit gives spare h the CPU, memory and processes bounds of container
// dc: in its cgroup's files where c.Limiter can, else through the runtime.
// Swap is as at create: as much again as the memory.
func (c *Container) limit(ctx context.Context, h Handle, dc runtime.DMTCPContainer) error {
	if c.Limiter != nil {
		return c.Limiter.Limit(h.Pid, cgroup.Limits{MemoryBytes: dc.MemoryBytes, SwapBytes: dc.MemoryBytes, Pids: dc.PidsLimit,
			CPUs: float64(dc.NanoCPUs) / 1e9})
	}
	up, _ := c.RT.(runtime.Updater) // Fits checked it can
	return up.Update(ctx, h.Ref, runtime.Resources{NanoCPUs: dc.NanoCPUs, MemoryBytes: dc.MemoryBytes, PidsLimit: dc.PidsLimit})
}

// Memory reads what instance h's memory bound leaves it: the memory its
// cgroup uses now and its bound (0: none), in the kernel's cgroup files
// (c.Limiter; without one, an error).
func (c *Container) Memory(h Handle) (used, bound int64, err error) {
	if c.Limiter == nil || h.Pid <= 0 {
		return 0, 0, fmt.Errorf("memory of instance %s: no cgroup to read it in", h.Ref)
	}
	if used, err = c.Limiter.MemoryUsed(h.Pid); err != nil {
		return 0, 0, fmt.Errorf("memory of instance %s: %w", h.Ref, err)
	}
	lim, err := c.Limiter.Limits(h.Pid)
	if err != nil {
		return 0, 0, fmt.Errorf("memory of instance %s: %w", h.Ref, err)
	}
	return used, lim.MemoryBytes, nil
}
