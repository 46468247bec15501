//go:build !no_ceph

package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestAgentKilledHostInstances: on a node whose CRIU engine runs under the
// host driver, the agent is SIGKILLed with two instances running. Their
// processes outlive it; at its restart it kills them, removes their
// cgroups, and deploys both again under the same IDs, which answer at
// their new addresses.
func TestAgentKilledHostInstances(t *testing.T) {
	ctx, p, _, app := redisOnPoP(t, "hkill", engine.NameCRIU, nil)
	node := "hk" + strconv.FormatInt(time.Now().UnixNano()%1e5, 36)
	p.env = append(p.env, "FOGDEPLOY_DRIVERS=criu=host")
	p.startAgent(node, "")
	for range 2 {
		if _, err := createDeployment(ctx, p.st, app.Name); err != nil {
			t.Fatal(err)
		}
	}
	before := p.waitAll(ctx, app.Name, 2)
	groups := "/sys/fs/cgroup/pids/fogdeploy-host-" + node
	old := groupProcs(t, groups)
	if len(old) == 0 {
		t.Fatalf("no process in the host instances' cgroups under %s", groups)
	}

	p.stopAgent(node, syscall.SIGKILL)
	for _, pid := range old {
		if !running(pid) {
			t.Fatalf("pid %d of a host instance went with the agent: nothing to recover", pid)
		}
	}
	p.startAgent(node, "")

	// Deployed again: the same IDs, Running, answering at new addresses.
	var after []state.Deployment
	deadline := time.Now().Add(2 * time.Minute)
	for {
		after = p.waitAll(ctx, app.Name, 2)
		moved := 0
		for _, d := range after {
			for _, b := range before {
				if d.ID == b.ID && d.Status.Ports["6379/tcp"] != b.Status.Ports["6379/tcp"] {
					moved++
				}
			}
		}
		if moved == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deployments were not deployed again after the agent's restart: %+v", after)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, d := range after {
		if got, err := testenv.RedisDo(ctx, nil, d.Status.Ports["6379/tcp"], "PING"); err != nil || got != "PONG" {
			t.Errorf("%s after the agent's restart: PING = %q, %v", d.ID, got, err)
		}
	}
	// What the killed agent's instances left is gone: their processes
	// (reaped by the node's init, which may take a moment), and every
	// cgroup but the new instances'.
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if !slices.ContainsFunc(old, running) {
			break
		}
	}
	for _, pid := range old {
		if running(pid) {
			cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			cg, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
			st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			t.Errorf("pid %d of an instance of the killed agent still runs: %q %q %q", pid, cmd, cg, st)
		}
	}
	now := groupProcs(t, groups)
	if slices.ContainsFunc(now, func(pid int) bool { return slices.Contains(old, pid) }) {
		t.Errorf("processes of the killed agent's instances still in %s: %v", groups, now)
	}
	// Each group left holds a process of a running instance (a deploy
	// again may also boot in the container, without a group here). A
	// group goes once its instance's processes are gone: mode auto's
	// measurement in the background may have just undeployed one.
	var empty []string
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		empty = emptyGroups(groups)
		if len(empty) == 0 || time.Now().After(end) {
			break
		}
	}
	for _, g := range empty {
		t.Errorf("cgroup %s of no process stays", g)
	}
}

// emptyGroups are the cgroups under dir that hold no process.
func emptyGroups(dir string) []string {
	var out []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if b, _ := os.ReadFile(filepath.Join(dir, e.Name(), "cgroup.procs")); len(strings.Fields(string(b))) == 0 {
			out = append(out, e.Name())
		}
	}
	return out
}

// running says whether process pid exists and is not a zombie (the test
// process may be the subreaper of the killed agent's orphans).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

// groupProcs lists the processes of every cgroup below dir.
func groupProcs(t *testing.T, dir string) []int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("the host driver's cgroups: %v", err)
	}
	var pids []int
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(dir, e.Name(), "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
