package spec

import (
	"bufio"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
)

// Platform is what a checkpointed process may depend on in its node.
type Platform struct {
	Arch   string `json:"arch"`
	Kernel string `json:"kernel,omitempty"`
	// CPUFlags are the CPU's feature flags (/proc/cpuinfo): a process may
	// have chosen code paths at start (glibc's ifuncs, a JIT) that need
	// them, so a restoring node must have every one.
	CPUFlags []string `json:"cpu_flags,omitempty"`
}

// HostPlatform reads this node's platform.
func HostPlatform() Platform {
	p := Platform{Arch: goruntime.GOARCH}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		var b strings.Builder
		for _, c := range u.Release {
			if c == 0 {
				break
			}
			b.WriteByte(byte(c))
		}
		p.Kernel = b.String()
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && (strings.TrimSpace(k) == "flags" || strings.TrimSpace(k) == "Features") {
				p.CPUFlags = strings.Fields(v)
				slices.Sort(p.CPUFlags)
				break
			}
		}
	}
	return p
}
