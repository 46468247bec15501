// What criu restore is given: the root it checks, its arguments and inherited pipes, and the child it leaves.

package engine

import (
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// checkRestoreRoot checks that img can be restored with spec's root:
// CRIU restores a root at the path it had at checkpoint time.
func checkRestoreRoot(img Image, spec RestoreSpec) error {
	if err := validateRoot(spec.Root); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	switch {
	case img.Root == "" && spec.Root != "":
		return fmt.Errorf("restore %s: the image ran on the host, not in a root: %w", img.Dir, ErrInvalid)
	case img.Root != "" && spec.Root == "":
		return hint.With(fmt.Errorf("restore %s: the image ran in root %s; give RestoreSpec.Root: %w", img.Dir, img.Root, ErrInvalid),
			"mount the environment the app ran in and pass it as Root")
	case img.Root != "" && spec.Root != img.Root:
		if err := validateRoot(img.Root); err != nil {
			return hint.With(fmt.Errorf("restore %s: CRIU needs the root at its checkpoint path %s: %w", img.Dir, img.Root, err),
				"create that directory (it is only used as a mount point) or mount the environment there")
		}
	}
	return nil
}

// restoreArgs are criu restore's arguments and extra files: fd 3, the
// image directory dir; fd 4 (and 5), the new stdout (stderr) pipes that
// replace the ones the app had at checkpoint time.
func (c *CRIU) restoreArgs(img Image, inst string, dir *os.File, out *output) (extra []*os.File, args []string) {
	extra = []*os.File{dir, out.stdout()}
	errFD := 4
	if out.stderr() != out.stdout() {
		extra = append(extra, out.stderr())
		errFD = 5
	}
	args = []string{"restore", "-d", "-S", "-D", "/proc/self/fd/3", "--work-dir", inst, "-o", "restore.log",
		c.tcpFlag(), "--file-locks", c.cgroupFlag()}
	seen := map[string]bool{}
	for _, fd := range slices.Sorted(maps.Keys(img.Stdio)) {
		pipe := img.Stdio[fd]
		if seen[pipe] || fd == 0 {
			continue
		}
		seen[pipe] = true
		n := 4
		if fd == 2 {
			n = errFD
		}
		args = append(args, "--inherit-fd", fmt.Sprintf("fd[%d]:%s", n, pipe))
	}
	return extra, args
}

// reapRestored kills and reaps this process's children in init's PID
// namespace (the root task of a restore that failed, which
// --restore-sibling made our child): the namespace's init cannot finish
// dying while one of them is a zombie we have not reaped.
func reapRestored(init int) {
	pidNS := nsID(init, "pid")
	if pidNS == "" {
		return
	}
	for _, pid := range childrenOf(os.Getpid()) {
		if pid == init || nsID(pid, "pid") != pidNS {
			continue
		}
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
			_, _ = p.Wait()
		}
	}
}

// restoredChild finds the app criu restored: --restore-sibling made it a
// child of this process, inside the PID namespace of init.
func restoredChild(init int) (*os.Process, error) {
	pidNS := nsID(init, "pid")
	for _, pid := range childrenOf(os.Getpid()) {
		if pid != init && nsID(pid, "pid") == pidNS {
			return os.FindProcess(pid)
		}
	}
	return nil, fmt.Errorf("criu succeeded but the restored app is not a child of pid %d", os.Getpid())
}
