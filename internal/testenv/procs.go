package testenv

import (
	"os"
	"strconv"
	"strings"
)

// Proc is one process of the machine, as /proc shows it.
type Proc struct {
	PID, PPID, PGRP int
	// State is the one-letter state (Z for a zombie).
	State string
	Comm  string
	// Cmdline is the command line, arguments joined by spaces ("" for
	// kernel threads and zombies).
	Cmdline string
}

// Procs reads every process of the machine from /proc, by PID.
func Procs() map[int]Proc {
	out := map[int]Proc{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		j := strings.IndexByte(s, '(')
		if i < 0 || j < 0 || j > i {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		cl, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out[pid] = Proc{PID: pid, PPID: ppid, PGRP: pgrp, State: f[0], Comm: s[j+1 : i],
			Cmdline: strings.TrimSpace(strings.ReplaceAll(string(cl), "\x00", " "))}
	}
	return out
}

// Descendants lists the processes below this (test) process, zombies
// included.
func Descendants() []Proc { return DescendantsOf(os.Getpid()) }

// DescendantsOf lists the processes below process self, zombies included.
func DescendantsOf(self int) []Proc {
	all := Procs()
	var out []Proc
	for pid, p := range all {
		for q, hops := p, 0; q.PPID != 0 && hops < 64; hops++ {
			if q.PPID == self {
				if pid != self {
					out = append(out, p)
				}
				break
			}
			next, ok := all[q.PPID]
			if !ok {
				break
			}
			q = next
		}
	}
	return out
}
