// A migration's checkpoint written into memory: the directory its engine writes the instance's
// checkpoint into is mounted in memory first, where the instance and its node have room for it,
// so that neither the checkpoint nor the hand-over's read of it writes to a disk while the app
// answers nothing. The hand-over keeps that mount (Handoffs.keep), and its files go with it.

package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

// memCkptReserve is the node's memory a checkpoint in memory leaves free
// beyond itself: this much, or a tenth of the node's memory if more.
const memCkptReserve = 512 << 20

// memCkptNeed is the memory a checkpoint of an instance whose cgroup uses
// used bytes is taken to need: the engines write the app's memory and
// what it maps, uncompressed, and its cgroup also counts the files it
// cached, which the checkpoint leaves out.
func memCkptNeed(used int64) int64 { return used + used/4 + 64<<20 }

// memCkptFits says whether a checkpoint needing need bytes fits in
// memory, and why not: within the instance's memory bound (0: none), which
// counts the files its engine writes from inside its cgroup, beside the
// used bytes; and leaving the node's reserve of what it has available
// (avail, of total).
func memCkptFits(used, bound, need, avail, total int64) (bool, string) {
	if bound > 0 && bound-used < need {
		return false, fmt.Sprintf("its memory bound leaves %d MiB, its checkpoint needs about %d MiB", max(0, bound-used)>>20, need>>20)
	}
	reserve := nodeReserve(total)
	if avail-need < reserve {
		return false, fmt.Sprintf("the node has %d MiB available, its checkpoint needs about %d MiB and %d MiB stay free", avail>>20, need>>20, reserve>>20)
	}
	return true, ""
}

// nodeReserve is what a checkpoint in memory leaves free of a node's
// total memory: memCkptReserve, or a tenth of it if more.
func nodeReserve(total int64) int64 { return max(int64(memCkptReserve), total/10) }

// memCkptProbe is the file by which the host checks that the instance
// sees what it mounted.
const memCkptProbe = ".fogdeploy-memory"

// prepareHandoff makes the directory a migration's checkpoint of rec is
// written into, the hand-over's own (Handoffs.prepare), and reports
// whether it is in memory: it is, when the instance's driver can tell its
// memory and it and the node have room (memCkptFits); on the node's disk
// otherwise. It takes an instance whose checkpoint volume shows a mount
// made after it (Handle.CkptShared); a mount the instance does not see is
// undone, and its checkpoint is then written where it was before, into
// its own volume, and moved (Handoffs.take).
func (sx *Suspensions) prepareHandoff(rec Deployment) (memory bool) {
	h := rec.Handle
	if h == nil || !h.CkptShared || h.CkptPath == "" || h.Gen <= 0 {
		return false
	}
	ctr, ok := sx.drv.driverByName(h.Driver).(*drivers.Container)
	if !ok {
		return false
	}
	size, why, err := memCkptSize(ctr, *h)
	if size == 0 {
		sx.log.Info("a migration's checkpoint goes to the node's disk", "deployment", rec.ID, "why", why, "err", err)
	}
	genDir := drivers.GenDir(h.CkptPath, h.Gen)
	err = sx.handoffs.prepare(rec.ID, h.Gen, genDir, size)
	if err != nil && size > 0 {
		sx.log.Warn("a migration's checkpoint cannot go into memory; to the node's disk", "deployment", rec.ID, "err", err)
		size, err = 0, sx.handoffs.prepare(rec.ID, h.Gen, genDir, 0)
	}
	if err == nil {
		if err = seenInside(genDir, h.Pid, h.Gen); err != nil {
			_ = sx.deps.Roots.Unbind(genDir)
			sx.handoffs.removeFiles(rec.ID)
		}
	}
	if err != nil {
		sx.log.Warn("a migration's checkpoint goes into its instance's own volume, then is moved", "deployment", rec.ID, "err", err)
		return false
	}
	if size > 0 {
		sx.log.Info("a migration's checkpoint goes into memory", "deployment", rec.ID)
	}
	return size > 0
}

// memCkptSize is how big a file system in memory the checkpoint of
// instance h of driver ctr may take (0: none, and why).
func memCkptSize(ctr *drivers.Container, h drivers.Handle) (int64, string, error) {
	used, bound, err := ctr.Memory(h)
	if err != nil {
		return 0, "its memory use is unknown", err
	}
	avail, total, err := nodeMemory()
	if err != nil {
		return 0, "the node's memory is unknown", err
	}
	need := memCkptNeed(used)
	if ok, why := memCkptFits(used, bound, need, avail, total); !ok {
		return 0, why, nil
	}
	// Bounded by what the node can spare: the instance's cgroup bounds
	// what its engine writes.
	return avail - nodeReserve(total), "", nil
}

// seenInside checks that the container whose main process is pid sees
// the host's directory dir at its checkpoint generation gen's, by a file
// written on the host side and looked for on the other.
func seenInside(dir string, pid, gen int) error {
	probe := filepath.Join(dir, memCkptProbe)
	if err := os.WriteFile(probe, nil, 0o600); err != nil {
		return err
	}
	defer os.Remove(probe)
	inside := filepath.Join(fmt.Sprintf("/proc/%d/root", pid), runtime.DMTCPGenerationDir(runtime.DMTCPCkptPath, gen), memCkptProbe)
	if _, err := os.Stat(inside); err != nil {
		return fmt.Errorf("not seen inside: %w", err)
	}
	return nil
}

// nodeMemory reads the node's available and total memory.
func nodeMemory() (avail, total int64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemAvailable":
			avail = n << 10
		case "MemTotal":
			total = n << 10
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if avail == 0 || total == 0 {
		return 0, 0, errors.New("/proc/meminfo: no MemAvailable or MemTotal")
	}
	return avail, total, nil
}

// readDir makes dst an empty directory to read a checkpoint into: what an
// earlier read left there goes, its memory too.
func (sx *Suspensions) readDir(dst string) error {
	if err := sx.deps.Roots.Unbind(dst); err != nil {
		return err
	}
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return os.Mkdir(dst, 0o755)
}

// readIntoMemory mounts dst, where deployment id's checkpoint of bytes
// bytes is about to be read, in memory, where the node has room for it
// beside its reserve: the agent writes it (its own cgroup counts it), and
// the engine restores it from memory. It reports whether it did.
func (sx *Suspensions) readIntoMemory(id, dst string, bytes int64) bool {
	avail, total, err := nodeMemory()
	if err != nil || bytes <= 0 {
		return false
	}
	// No cgroup bound counts it but the agent's own.
	size := bytes + bytes/8 + 64<<20
	if ok, why := memCkptFits(0, 0, size, avail, total); !ok {
		sx.log.Info("a migration's checkpoint is read to the node's disk", "deployment", id, "why", why)
		return false
	}
	if err := sx.deps.Roots.MountMemory(dst, size); err != nil {
		sx.log.Warn("a migration's checkpoint cannot be read into memory; to the node's disk", "deployment", id, "err", err)
		return false
	}
	return true
}

// releaseRead lets go of the memory a prepared resume of deployment id
// read its checkpoint into (gen, under the instance's checkpoint volume
// ckptPath), once its instance runs: the engine restored it whole.
func (sx *Suspensions) releaseRead(id, ckptPath string, gen int) {
	sx.early.mu.Lock()
	inMemory := sx.early.memory[id]
	delete(sx.early.memory, id)
	sx.early.mu.Unlock()
	if !inMemory {
		return
	}
	if err := sx.deps.Roots.Unbind(drivers.GenDir(ckptPath, gen)); err != nil {
		sx.log.Warn("letting go of a resumed checkpoint's memory; it goes with the instance", "deployment", id, "err", err)
	}
}
