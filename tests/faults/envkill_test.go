//go:build !no_ceph

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/gc"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// TestEnvCommandsKilled kills (SIGKILL) `fogctl env build` while its RUN
// step runs, and `fogctl env exec` while its command runs: each leaves its
// clone mapped and mounted, and nothing mounted inside it (the step's
// /proc and /dev were in its own mount namespace, gone with it). The next
// fogctl on the node releases all of it (the build's), and so does the
// node's agent at its next reconcile (the exec's); the same build then
// succeeds, and `fogctl gc` removes the exec's throwaway clone.
func TestEnvCommandsKilled(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newPoP(ctx, t, s) // etcd, for gc and the agent started below
	node := filepath.Join(p.dir, "node")
	p.env = append(p.env, "FOGDEPLOY_STATE_DIR="+node)
	sfx := strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	name := "killed-" + sfx
	file := filepath.Join(p.dir, "build")
	if err := os.WriteFile(file, []byte("FROM "+envName+"\nRUN echo "+sfx+" > /built && sleep 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		p.fogctl(cctx, "env", "rm", name)
		p.fogctl(cctx, "env", "prune")
	})

	// The build, killed in its step.
	killIn(ctx, t, p, node, "env", "build", name, "-f", file)
	// The next fogctl releases what it left.
	if _, errOut, code := p.fogctl(ctx, "env", "ls"); code != 0 {
		t.Fatalf("fogctl env ls after a killed build: exit %d: %s", code, errOut)
	}
	noneLeft(t, node, "after the killed build, the next fogctl")
	out, errOut, code := p.fogctl(ctx, "env", "build", name, "-f", file)
	if code != 0 {
		t.Fatalf("the same build after the killed one: exit %d: %s%s", code, out, errOut)
	}
	out, errOut, code = p.fogctl(ctx, "env", "exec", name, "--", "cat", "/built")
	if code != 0 || !strings.Contains(out, sfx) {
		t.Fatalf("the rebuilt environment's /built: exit %d, %q; want %q\n%s", code, out, sfx, errOut)
	}

	// An exec, killed while its command runs, on a node whose agent runs:
	// the agent releases what it left at its next reconcile, with no
	// fogctl run meanwhile; its clone stays in the pool until gc.
	p.startAgent(ctx, "n1", node)
	killIn(ctx, t, p, node, "env", "exec", name, "--", "sleep", "30")
	waitFor(ctx, t, 5*reconcileInterval, "the node's agent to release what the killed exec left", func() error {
		recs, _ := filepath.Glob(filepath.Join(node, "mapper", "mappings", "*.json"))
		var left []string
		for _, r := range recs {
			// The agent's own mappings (its pool) are not the exec's.
			if b, err := os.ReadFile(r); err == nil && strings.Contains(string(b), layering.ExecPrefix+name+"-") {
				left = append(left, r)
			}
		}
		if len(left) > 0 || len(chrootedUnder(node)) > 0 {
			return fmt.Errorf("records %v", left)
		}
		for _, m := range mountsUnder(node) {
			if strings.Contains(m, "/work/") {
				return fmt.Errorf("still mounted: %s", m)
			}
		}
		return nil
	})
	clones := func() []string {
		out, errOut, code := p.fogctl(ctx, "gc", "--dry-run", "--min-age", "0s", "-o", "json")
		var plan []gc.Item
		if err := json.Unmarshal([]byte(out), &plan); code != 0 || err != nil {
			t.Fatalf("fogctl gc --dry-run -o json: exit %d, %v: %s%s", code, err, out, errOut)
		}
		var names []string
		for _, it := range plan {
			if it.Kind == gc.KindExec && strings.HasPrefix(it.Name, layering.ExecPrefix+name+"-") {
				names = append(names, it.Name)
			}
		}
		return names
	}
	if c := clones(); len(c) != 1 {
		t.Fatalf("after a killed exec, gc plans to remove %v; want its one clone", c)
	}
	// Its clone holds the environment, and the refusal says what to do.
	if _, errOut, code := p.fogctl(ctx, "env", "rm", name); code == 0 || !strings.Contains(errOut, "fogctl gc") {
		t.Errorf("fogctl env rm %s with a killed exec's clone: exit %d, %q; want a refusal that points to fogctl gc", name, code, errOut)
	}
	out, errOut, code = p.fogctl(ctx, "gc", "--min-age", "0s")
	if code != 0 || !strings.Contains(out, "exec-clone") {
		t.Fatalf("fogctl gc: exit %d, %s%s; want the exec's clone removed", code, out, errOut)
	}
	if c := clones(); len(c) != 0 {
		t.Errorf("after gc, the exec's clones %v remain", c)
	}
	// With nothing left of the killed commands, the environment goes.
	if _, errOut, code := p.fogctl(ctx, "env", "rm", name); code != 0 {
		t.Errorf("fogctl env rm %s: exit %d: %s", name, code, errOut)
	}
}

// killIn runs fogctl ARGS, waits until a process runs chrooted under
// node (the build step's or the exec's command), kills fogctl with
// SIGKILL, and checks that it left a mapping behind.
func killIn(ctx context.Context, t *testing.T, p *pop, node string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(p.s.bin, "fogctl"), args...)
	cmd.Env = p.env
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, time.Minute, "a command chrooted under the node's state", func() error {
		if len(chrootedUnder(node)) == 0 {
			return fmt.Errorf("none yet; fogctl said: %s", out.String())
		}
		return nil
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	recs, _ := filepath.Glob(filepath.Join(node, "mapper", "mappings", "*.json"))
	if len(recs) == 0 || len(mountsUnder(node)) == 0 {
		t.Fatalf("fogctl %s killed in its command left no mapping (records %v, mounts %v): the test did not kill it halfway",
			strings.Join(args, " "), recs, mountsUnder(node))
	}
	waitFor(ctx, t, 10*time.Second, "the killed command's own processes to end", func() error {
		if c := chrootedUnder(node); len(c) > 0 {
			return fmt.Errorf("still running: %v", c)
		}
		return nil
	})
	// The step's mounts were in its own namespace: none is left on the
	// host inside the clone.
	mounts := mountsUnder(node)
	for _, m := range mounts {
		for _, outer := range mounts {
			if strings.HasPrefix(m, outer+"/") {
				t.Errorf("fogctl %s killed in its command left %s mounted inside %s on the host", strings.Join(args, " "), m, outer)
			}
		}
	}
}

// noneLeft fails the test if anything of a mapping is left under node:
// records, mounts, rbd-fuse processes.
func noneLeft(t *testing.T, node, when string) {
	t.Helper()
	recs, _ := filepath.Glob(filepath.Join(node, "mapper", "mappings", "*.json"))
	if len(recs) > 0 {
		t.Errorf("%s left mapping records %v", when, recs)
	}
	if m := mountsUnder(node); len(m) > 0 {
		t.Errorf("%s left mounts %v", when, m)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range procs {
		b, _ := os.ReadFile(c)
		if strings.HasPrefix(string(b), "rbd-fuse\x00") && strings.Contains(string(b), node) {
			t.Errorf("%s left %s", when, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// chrootedUnder returns the PIDs whose root directory is the root of a
// file system mounted under dir (a build step's or an exec's clone: the
// step runs with the clone as the root of its own mount namespace, so
// that its root is compared by device and inode, not by path).
func chrootedUnder(dir string) []string {
	type fileID struct{ dev, ino uint64 }
	clones := map[fileID]bool{}
	for _, m := range mountsUnder(dir) {
		var st syscall.Stat_t
		if syscall.Stat(m, &st) == nil {
			clones[fileID{st.Dev, st.Ino}] = true
		}
	}
	var out []string
	roots, _ := filepath.Glob("/proc/[0-9]*/root")
	for _, r := range roots {
		var st syscall.Stat_t
		if len(clones) > 0 && syscall.Stat(r, &st) == nil && clones[fileID{st.Dev, st.Ino}] {
			out = append(out, filepath.Base(filepath.Dir(r)))
		}
	}
	return out
}
