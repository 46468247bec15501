package spec

// Limits are what an instance may use: the app spec's resources where it
// gives them, the node's defaults (the agent's `limits:` config) where it
// is silent. Zero means no limit.
type Limits struct {
	// CPUs is a number of CPUs (0.5 = half of one).
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryBytes bounds the instance's memory.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pids bounds its processes and threads.
	Pids int64 `json:"pids,omitempty"`
	// OpenFiles is its RLIMIT_NOFILE (soft and hard).
	OpenFiles uint64 `json:"open_files,omitempty"`
	// LogBytes bounds one file of its output that the node keeps, and
	// LogFiles how many such files (the oldest goes first).
	LogBytes int64 `json:"log_bytes,omitempty"`
	LogFiles int   `json:"log_files,omitempty"`
}

// LimitsOver returns the limits of an instance of a: its resources where
// the spec gives them, def elsewhere.
func (a App) LimitsOver(def Limits) Limits {
	l := def
	if a.Resources.CPUs > 0 {
		l.CPUs = a.Resources.CPUs
	}
	if m := a.MemoryBytes(); m > 0 {
		l.MemoryBytes = m
	}
	return l
}
