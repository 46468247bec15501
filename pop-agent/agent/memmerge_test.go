package agent

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/ksm"
)

// TestStartMemoryMerge: agent.memory_merge turns the node's scanner on
// with its settings and exports what it saves; off, it touches nothing; on
// a kernel without the scanner, the agent does not start.
func TestStartMemoryMerge(t *testing.T) {
	dir := t.TempDir()
	for name, v := range map[string]string{"run": "0", "pages_to_scan": "100", "smart_scan": "1", "pages_shared": "2", "pages_sharing": "10", "full_scans": "1"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	if err := startMemoryMerge(config.MemoryMerge{PagesToScan: 1000}, ksm.Node{Dir: dir}, reg, log); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "run")); string(b) != "0\n" {
		t.Fatalf("off: run = %q, want it untouched", b)
	}
	if err := startMemoryMerge(config.MemoryMerge{Enabled: true, PagesToScan: 1000}, ksm.Node{Dir: dir}, reg, log); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"run": "1\n", "pages_to_scan": "1000\n", "smart_scan": "0\n"} {
		if b, _ := os.ReadFile(filepath.Join(dir, name)); string(b) != want {
			t.Errorf("%s = %q, want %q", name, b, want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "fogdeploy_memory_merged_bytes" {
		t.Fatalf("metrics gathered: %v, %v; want fogdeploy_memory_merged_bytes alone", mfs, err)
	}
	if got := mfs[0].GetMetric()[0].GetGauge().GetValue(); got != float64(10*os.Getpagesize()) {
		t.Errorf("fogdeploy_memory_merged_bytes = %v, want 10 pages", got)
	}
	err = startMemoryMerge(config.MemoryMerge{Enabled: true}, ksm.Node{Dir: filepath.Join(dir, "absent")}, prometheus.NewRegistry(), log)
	if !errors.Is(err, ksm.ErrUnavailable) {
		t.Fatalf("on a kernel without the scanner: %v, want ErrUnavailable", err)
	}
}
