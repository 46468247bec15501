package layering

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/fogdeploy/fogdeploy/internal/mountinfo"
	"github.com/fogdeploy/fogdeploy/internal/procstat"
)

// Scratch directories are where one call of a process works in
// ManagerConfig.WorkDir: a build step's or an exec's mount target, an
// import's unpacked root filesystem and filesystem image (as large as the
// environment). Each call removes its own; a process killed meanwhile
// cannot, so the name of each says which process made it, and the next
// manager on the node removes those of processes that are gone.

// Kinds of scratch directory.
const (
	scratchBuild  = "build-"
	scratchExec   = "exec-"
	scratchImport = "import-"
)

// scratchName matches "<kind><pid>-<start>-<random>".
var scratchName = regexp.MustCompile(`^(build-|exec-|import-)([0-9]+)-([0-9]+)-[0-9]+$`)

// scratch makes a scratch directory of kind for this process.
func (m *Manager) scratch(kind string) (string, error) {
	return os.MkdirTemp(m.cfg.WorkDir, fmt.Sprintf("%s%d-%d-", kind, os.Getpid(), m.start))
}

// sweepScratch removes the scratch directories of processes that are
// gone, and returns their names. One with a mount at or under it stays
// (its mapping's release unmounts it first): a mount target is removed
// only while empty, an import's with what it holds.
func (m *Manager) sweepScratch() ([]string, error) {
	ents, err := os.ReadDir(m.cfg.WorkDir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		g := scratchName.FindStringSubmatch(e.Name())
		if g == nil || !e.IsDir() {
			continue
		}
		pid, _ := strconv.Atoi(g[2])
		start, _ := strconv.ParseUint(g[3], 10, 64)
		if procstat.Alive(pid, start) {
			continue
		}
		dir := filepath.Join(m.cfg.WorkDir, e.Name())
		if g[1] == scratchImport {
			err = mountinfo.RemoveAll(dir)
		} else {
			err = os.Remove(dir) // a mount target: never through a mount
		}
		if err != nil {
			m.log.Warn("removing the scratch directory of a process that is gone", "dir", dir, "err", err)
			continue
		}
		removed = append(removed, e.Name())
	}
	if len(removed) > 0 {
		m.log.Info("removed the scratch directories of processes that are gone", "dirs", removed)
	}
	return removed, nil
}
