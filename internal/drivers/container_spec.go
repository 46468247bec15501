// The light container of a run: its image, limits and engine, checked before it is created.

package drivers

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

// spec is the light container of run r on image, with its limits.
func (c *Container) spec(r Run, image string) runtime.DMTCPContainer {
	lim := r.App.LimitsOver(r.Limits)
	dc := runtime.DMTCPContainer{
		Image:      image,
		Deployment: r.ID,
		App:        r.App.Name,
		Name:       "fd-" + r.ID,
		EnvPath:    r.EnvPath,
		CkptPath:   r.CkptPath,
		CkptSource: r.CkptSource,
		// Read after the order, which Start gives once it is whole.
		SourceLater: r.SourceLater,
		RootLater:   r.RootLater,
		CkptShared:  r.CkptShared,
		Env:         appEnv(r.ImageEnv, r.App.Environment),
		WorkingDir:  firstNonEmpty(r.App.WorkDir, r.WorkDir),
		User:        r.App.User,
		StopSignal:  r.App.StopSignal,
		// Waited for inside the container, after SIGUSR1.
		CheckpointDelay: time.Duration(r.App.CheckpointDelay),
		NanoCPUs:        int64(lim.CPUs * 1e9),
		MemoryBytes:     lim.MemoryBytes,
		Network:         networkOf(r.App),
		NetworkOpen:     r.App.Network != "",
		PidsLimit:       lim.Pids,
		OpenFiles:       lim.OpenFiles,
		LogBytes:        lim.LogBytes,
		LogFiles:        lim.LogFiles,
		Labels:          map[string]string{"io.fogdeploy.gen": strconv.Itoa(r.Gen)},
	}
	for _, p := range r.App.Ports {
		dc.Ports = append(dc.Ports, runtime.Port{ContainerPort: uint16(p.Port), Proto: p.Proto})
	}
	if rd := r.App.Ready; probedInside(rd) {
		dc.ReadyAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(rd.Port))
		if rd.Kind == spec.ReadyHTTP {
			dc.ReadyHTTPPath, dc.ReadyStatus = rd.Path, rd.Status
		} else {
			dc.ReadySend, dc.ReadyExpect = escape(rd.Send), escape(rd.Expect)
		}
	}
	return dc
}

// containerSpec is the container of run r (container). recycle says
// whether the instance serves again after its app ends.
func (c *Container) containerSpec(ctx context.Context, r Run) (_ runtime.Spec, recycle bool, err error) {
	dc, err := c.container(ctx, r)
	if err != nil {
		return runtime.Spec{}, false, err
	}
	var spec runtime.Spec
	switch r.Mode {
	case RunLaunch:
		spec = dc.Launch(r.App.Command)
		spec.Cmd = append(spec.Cmd[:1:1], append([]string{"-gen", strconv.Itoa(r.Gen)}, spec.Cmd[1:]...)...)
	case RunRestart:
		if r.CkptSource != "" {
			// The mount point of the generation's read-only bind.
			if err := os.MkdirAll(GenDir(r.CkptPath, r.Gen), 0o755); err != nil {
				return runtime.Spec{}, false, fmt.Errorf("checkpoint directory of %s: %w", r.ID, err)
			}
		}
		spec = dc.Restart(r.Gen)
	case RunBoot:
		spec = dc.Boot(r.App.Command)
	}
	return spec, dc.Recycle, nil
}

// container is the light container of run r, checked: the boot image's,
// or the DMTCP image's with the engine's checks (DMTCP: the environment's
// glibc; CRIU: the image carries it).
func (c *Container) container(ctx context.Context, r Run) (runtime.DMTCPContainer, error) {
	var dc runtime.DMTCPContainer
	recyclable := false
	if r.Mode == RunBoot {
		dc = c.spec(r, c.BootImage)
	} else {
		img, err := c.image(ctx)
		if err != nil {
			return runtime.DMTCPContainer{}, err
		}
		dc = c.spec(r, img.ref)
		eng := engineOf(r.App)
		recyclable = img.recycles(eng)
		switch {
		case r.RootLater && !img.rootLater:
			return runtime.DMTCPContainer{}, fmt.Errorf("%w: image %s cannot take a root mounted after it is created (no label %s): rebuild it with `make dmtcp-image`", ErrDriver, img.ref, RootLaterLabel)
		case img.engines[eng] == "":
			return runtime.DMTCPContainer{}, fmt.Errorf("%w: app %s (engine %s): image %s carries no %s (no label %s)", ErrDriver, r.App.Name, eng, img.ref, eng, engine.ImageLabel(eng))
		case !engine.Of(eng).DumpsFromOutside:
			// The engine's libraries run in the app's processes.
			envFiles := r.EnvPath
			if r.RootLater {
				envFiles = r.EnvFiles // the root is not mounted yet
			}
			if err := checkEnvForDMTCP(envFiles, r.App.Env, img.glibc); err != nil {
				return runtime.DMTCPContainer{}, err
			}
		default:
			dc.Engine, dc.Lazy = eng, r.App.Lazy && r.Mode == RunRestart && engine.Of(eng).LazyRestore
		}
	}
	// A restore whose root the deployer can reset serves again after its
	// app ends (Recycle), where the image's entrypoint can for its engine.
	dc.Recycle = r.Resettable && r.Mode == RunRestart && recyclable
	dc.CtlPath, dc.Wait = r.CtlPath, true
	if r.Background {
		dc.CPUShares = backgroundShares
	}
	return dc, nil
}

// backgroundShares is the CPU weight (cpu.shares) of a waiting slot's
// container: the lowest, so that the pool's refill never competes with the
// serving instances.
const backgroundShares = 2
