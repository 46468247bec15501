// Compatibility: what a checkpoint generation needs of the node that
// restores it (its engine at the same version, the architecture, the CPU
// features the checkpointed process may use), and the node's own platform.
// A node that cannot restore a generation boots the app instead, saying why.

package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
)

// ErrIncompatible: this node cannot restore a generation (another engine
// version, architecture or missing CPU features); the error says which.
var ErrIncompatible = errors.New("generation cannot be restored on this node")

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

// restorableOn reports, wrapping ErrIncompatible, why generation g cannot
// be restored on a node with platform p whose engine g.Engine is at
// version engineVersion. Generations that recorded no platform are only
// checked for the engine version.
func (g Generation) restorableOn(p Platform, engineVersion string) error {
	if g.EngineVersion != "" && engineVersion != "" && g.EngineVersion != engineVersion {
		return fmt.Errorf("%w: generation %d was checkpointed by %s %s, this node has %s %s",
			ErrIncompatible, g.Gen, g.Engine, g.EngineVersion, g.Engine, engineVersion)
	}
	if g.Platform == nil {
		return nil
	}
	if g.Platform.Arch != "" && g.Platform.Arch != p.Arch {
		return fmt.Errorf("%w: generation %d was checkpointed on %s, this node is %s", ErrIncompatible, g.Gen, g.Platform.Arch, p.Arch)
	}
	var missing []string
	for _, f := range g.Platform.CPUFlags {
		if _, found := slices.BinarySearch(p.CPUFlags, f); !found {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		shown := missing
		if len(shown) > 6 {
			shown = append(shown[:6:6], fmt.Sprintf("and %d more", len(missing)-6))
		}
		return fmt.Errorf("%w: generation %d needs CPU features this node lacks (%s)", ErrIncompatible, g.Gen, strings.Join(shown, ", "))
	}
	return nil
}
