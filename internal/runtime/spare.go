// Spare containers: light containers created for no app. A spare waits with its mount directory
// bound (slave propagation) and a few generic ports published; the host later mounts an app's root
// and checkpoint under that directory, points the ports at the app's, and assigns it the restart it
// becomes (instancectl.Assign), which its entrypoint then runs as if it had been created for it.

package runtime

import (
	"context"
	"path/filepath"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// SparePortBase is the first container port a spare publishes: its ports
// are SparePortBase, SparePortBase+1, ... (TCP). An app's ports are
// redirected to them inside the container's network namespace once it
// takes the spare.
const SparePortBase = 61000

// MaxSparePorts bounds the generic ports of one spare.
const MaxSparePorts = 16

// SpareCkptPath is the checkpoint volume of an instance that took a
// spare: DMTCPCkptPath, as in a container made for its app, because a
// DMTCP checkpoint names the files it saved beside its image
// (ckpt_*_files/) by their absolute paths there. It is the mount
// directory's ckpt, bound with slave propagation, so that the generation
// the host binds there after the container was created shows inside it.
const SpareCkptPath = DMTCPCkptPath

// SpareCkptDir is the host directory, beside a spare's root at envPath
// under its mount directory, that is bound at SpareCkptPath: the host
// binds the generation a spare is assigned in it (as its number).
func SpareCkptDir(envPath string) string { return filepath.Join(filepath.Dir(envPath), "ckpt") }

// SpareRole is the io.fogdeploy.role label of a spare container.
const SpareRole = "dmtcp-spare"

// SparePorts returns the n generic ports of a spare.
func SparePorts(n int) []Port {
	ports := make([]Port, n)
	for i := range ports {
		ports[i] = Port{ContainerPort: uint16(SparePortBase + i), Proto: "tcp"}
	}
	return ports
}

// Spare returns the spec of a spare container for c.Engine: c's image,
// name, limits, network, CPU weight and control directory; EnvPath's
// parent, a shared mount on the host, bound with slave propagation at
// DMTCPMntPath; ports generic ports published. Its capabilities are those
// every app of the engine may need (under DMTCP, an app's user: the
// entrypoint drops SETUID and SETGID when the app it becomes has none).
// Its entrypoint reads nothing before it is assigned.
func (c DMTCPContainer) Spare(ports int) Spec {
	c.User, c.Ports, c.ReadyAddr, c.Recycle, c.CkptPath, c.CkptSource = "", SparePorts(ports), "", false, "", ""
	c.RootLater, c.Wait = true, true
	c.userCaps = !engine.Of(engineOr(c.Engine)).DumpsFromOutside
	s := c.spec([]string{"-assign", DMTCPCtlPath + "/" + instancectl.Assign, "-engine", string(engineOr(c.Engine))}, "spare")
	s.Binds = append(s.Binds, Bind{HostPath: SpareCkptDir(c.EnvPath), ContainerPath: SpareCkptPath, Propagation: PropagationSlave})
	s.Labels["io.fogdeploy.role"] = SpareRole
	return s
}

// Assignment returns the entrypoint arguments of the restart of
// generation gen that a spare container becomes (instancectl.AssignBody):
// the restart's flags as Restart gives them, its root and checkpoint
// volume under the spare's mount directory (EnvPath's name and
// SpareCkptPath), read only once ordered.
func (c DMTCPContainer) Assignment(gen int) []string {
	c.RootLater, c.Wait, c.Recycle, c.CkptSource = true, true, false, ""
	return append([]string{"restart"}, append(c.flags(gen), "-ckpt", SpareCkptPath)...)
}

// engineOr is eng, or the default engine when unset.
func engineOr(eng engine.Name) engine.Name {
	if eng == "" {
		return engine.Default()
	}
	return eng
}

// Resources are the limits Updater changes on a created container (0:
// none, as at Create).
type Resources struct {
	NanoCPUs    int64
	MemoryBytes int64
	PidsLimit   int64
}

// Updater is a Runtime that changes a running container's CPU, memory
// and process limits (a spare's, to the limits of the app it becomes).
type Updater interface {
	Update(ctx context.Context, id string, r Resources) error
}

var (
	_ Updater = (*Docker)(nil)
	_ Updater = (*Fake)(nil)
)
