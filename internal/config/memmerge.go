package config

import (
	"fmt"

	"github.com/fogdeploy/fogdeploy/internal/ksm"
)

// MemoryMerge is the agent's use of the kernel's same-page merging
// (internal/ksm): the slots of a warm pool restored ahead share the pages
// they hold alike (their app's, restored from one checkpoint) instead of
// holding a copy each. Off by default: merged pages are a timing side
// channel among the instances that opted in (docs/security.md).
type MemoryMerge struct {
	// Enabled turns the node's scanner on at the agent's start and makes
	// every slot restored ahead opt in.
	Enabled bool `yaml:"enabled"`
	// PagesToScan is the scanner's pages per wake-up (every 20 ms):
	// DefaultMergePages by default; 0 leaves the kernel's (100, about
	// 20 MiB a second). More merges a new slot sooner, for more of a CPU.
	PagesToScan int `yaml:"pages_to_scan"`
}

// DefaultMergePages is MemoryMerge.PagesToScan's default: about 200 MiB
// scanned a second, a slot of PostgreSQL (460 MiB) merged in a few
// seconds.
const DefaultMergePages = 1000

// Settings is what the agent sets on the node's scanner.
func (m MemoryMerge) Settings() ksm.Settings { return ksm.Settings{PagesToScan: m.PagesToScan} }

func (m MemoryMerge) validate() []error {
	if m.PagesToScan < 0 || m.PagesToScan > ksm.MaxPagesToScan {
		return []error{fmt.Errorf("agent.memory_merge.pages_to_scan %d: give the pages the scanner reads every 20 ms, 1 to %d (0: the kernel's, 100)", m.PagesToScan, ksm.MaxPagesToScan)}
	}
	return nil
}
