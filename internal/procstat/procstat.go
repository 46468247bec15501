// Package procstat tells whether a process still runs, from /proc/PID/stat,
// so that what a killed process left (mappings, scratch directories) can
// be told from what a running one uses, even after its PID was reused.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Start returns the start time (in clock ticks since boot) of a live,
// non-zombie process, or ok=false.
func Start(pid int) (start uint64, ok bool) {
	if pid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// Fields after "comm" (which may hold spaces) start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), starttime is field 22.
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, err == nil
}

// Alive reports whether pid still runs and is the process that started
// at start.
func Alive(pid int, start uint64) bool {
	s, ok := Start(pid)
	return ok && s == start
}
