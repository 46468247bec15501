// What the engines read of the host's processes in /proc: a status field,
// children, namespaces.

package engine

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procStatus reads one field of /proc/PID/status.
func procStatus(pid int, field string) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// childrenOf lists the PIDs whose parent is ppid.
func childrenOf(ppid int) []int {
	parent := strconv.Itoa(ppid)
	return procsWhere(func(pid int) bool {
		v, err := procStatus(pid, "PPid")
		return err == nil && v == parent
	})
}

// kernelChildren lists the children of pid from its main thread's list (the
// kernel's, without a scan of /proc), or by a scan where the kernel keeps
// none.
func kernelChildren(pid int) []int {
	p := strconv.Itoa(pid)
	b, err := os.ReadFile("/proc/" + p + "/task/" + p + "/children")
	if err != nil {
		return childrenOf(pid)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if c, err := strconv.Atoi(f); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// procsWhere lists the processes of the host for which keep is true.
func procsWhere(keep func(pid int) bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && keep(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// ZombieChildren lists the children of ppid that have exited and wait to
// be reaped (state Z).
func ZombieChildren(ppid int) []int {
	var out []int
	for _, pid := range childrenOf(ppid) {
		if st, err := procStatus(pid, "State"); err == nil && strings.HasPrefix(st, "Z") {
			out = append(out, pid)
		}
	}
	return out
}

// nsID returns the namespace link of a process, e.g. "mnt:[4026532]".
func nsID(pid int, ns string) string {
	s, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
	return s
}

// procRealIDs is the real uid and gid of process pid (0, 0 if unknown).
func procRealIDs(pid int) (uid, gid int) {
	if v, err := procStatus(pid, "Uid"); err == nil {
		if f := strings.Fields(v); len(f) > 0 {
			uid, _ = strconv.Atoi(f[0])
		}
	}
	if v, err := procStatus(pid, "Gid"); err == nil {
		if f := strings.Fields(v); len(f) > 0 {
			gid, _ = strconv.Atoi(f[0])
		}
	}
	return uid, gid
}

// InPIDNamespace lists the processes in the PID namespace of pid (as the
// host sees them), pid's own included; none if pid is gone.
func InPIDNamespace(pid int) []int {
	ns := nsID(pid, "pid")
	if ns == "" {
		return nil
	}
	return procsWhere(func(p int) bool { return nsID(p, "pid") == ns })
}
