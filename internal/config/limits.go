package config

import (
	"fmt"
	"math"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Limits are what an instance on this node gets where its app spec is
// silent (`limits:` in the agent's config): an app of strangers runs with
// bounds whether or not its spec asks for them. An app's `resources`
// (cpus, memory) win over cpus and memory. "0" or 0 is no limit.
type Limits struct {
	// CPUs is a number of CPUs (default 1).
	CPUs float64 `yaml:"cpus"`
	// Memory is a size (default "2GiB").
	Memory string `yaml:"memory"`
	// Pids bounds an instance's processes and threads (default 1024).
	Pids int64 `yaml:"pids"`
	// OpenFiles is an instance's RLIMIT_NOFILE (default 16384). It must
	// not exceed dockerd's own hard limit: raising it needs
	// CAP_SYS_RESOURCE.
	OpenFiles uint64 `yaml:"open_files"`
	// LogSize bounds one file of an instance's output that dockerd keeps
	// (default "10MiB"), LogFiles how many (default 2).
	LogSize  string `yaml:"log_size"`
	LogFiles int    `yaml:"log_files"`
}

// DefaultLimits are the defaults of Limits.
func DefaultLimits() Limits {
	return Limits{CPUs: 1, Memory: "2GiB", Pids: 1024, OpenFiles: 16384, LogSize: "10MiB", LogFiles: 2}
}

// Spec returns l as the deployer takes it. It assumes Validate passed.
func (l Limits) Spec() spec.Limits {
	mem, _ := sizeOrNone("limits.memory", l.Memory)
	log, _ := layering.ParseSize("limits.log_size", l.LogSize)
	return spec.Limits{CPUs: l.CPUs, MemoryBytes: mem, Pids: l.Pids, OpenFiles: l.OpenFiles, LogBytes: log, LogFiles: l.LogFiles}
}

// validate reports each bad field.
func (l Limits) validate() []error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c := l.CPUs; c < 0 || c > 0 && c < spec.MinCPUs || math.IsNaN(c) || c > 1024 {
		add("limits.cpus %v: give a number of CPUs from %v to 1024 (0.5 = half of one), or 0 for no limit", c, spec.MinCPUs)
	}
	if n, err := sizeOrNone("limits.memory", l.Memory); err != nil {
		errs = append(errs, err)
	} else if n != 0 && n < 6<<20 {
		add("limits.memory %q: give at least 6MiB (Docker's smallest), or 0 for no limit", l.Memory)
	}
	if l.Pids < 0 || l.Pids > 0 && l.Pids < 16 {
		add("limits.pids %d: give at least 16 processes, or 0 for no limit", l.Pids)
	}
	if l.OpenFiles > 0 && l.OpenFiles < 64 || l.OpenFiles > 1<<20 {
		add("limits.open_files %d: give 64 to 1048576 open files, or 0 to keep dockerd's", l.OpenFiles)
	}
	if n, err := layering.ParseSize("limits.log_size", l.LogSize); err != nil {
		errs = append(errs, err)
	} else if n < 64<<10 {
		add("limits.log_size %q: give at least 64KiB: an instance's output is always bounded", l.LogSize)
	}
	if l.LogFiles < 1 || l.LogFiles > 10 {
		add("limits.log_files %d: give 1 to 10 files", l.LogFiles)
	}
	return errs
}

// sizeOrNone parses a size where "0" (or "") is none.
func sizeOrNone(field, s string) (int64, error) {
	if s == "" || s == "0" {
		return 0, nil
	}
	return layering.ParseSize(field, s)
}
