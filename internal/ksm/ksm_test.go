package ksm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParseProcess(t *testing.T) {
	// As Linux 6.18 writes it: the last two lines with a colon.
	p, err := parseProcess("ksm_rmap_items 12\nksm_zero_pages 0\nksm_merging_pages 7\nksm_process_profit 100\nksm_merge_any: yes\nksm_mergeable: yes\n")
	if err != nil || !p.MergeAny || p.MergingPages != 7 {
		t.Fatalf("parseProcess = %+v, %v; want merge_any and 7 merging pages", p, err)
	}
	if _, err := parseProcess("ksm_merging_pages x\n"); err == nil {
		t.Fatal("a count that is no number was accepted")
	}
}

func TestEnableAndStats(t *testing.T) {
	dir := t.TempDir()
	for name, v := range map[string]string{"run": "0\n", "pages_to_scan": "100\n", "smart_scan": "1\n", "pages_shared": "3\n", "pages_sharing": "9\n", "full_scans": "4\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n := Node{Dir: dir}
	if err := n.Enable(Settings{PagesToScan: MaxPagesToScan + 1}); err == nil {
		t.Fatal("pages_to_scan beyond the bound was accepted")
	}
	if err := n.Enable(Settings{PagesToScan: 2000}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"run": "1\n", "pages_to_scan": "2000\n", "smart_scan": "0\n"} {
		if b, _ := os.ReadFile(filepath.Join(dir, name)); string(b) != want {
			t.Errorf("%s = %q, want %q", name, b, want)
		}
	}
	s, err := n.Stats()
	if err != nil || s != (Stats{PagesShared: 3, PagesSharing: 9, FullScans: 4}) {
		t.Fatalf("Stats = %+v, %v", s, err)
	}
	if s.SavedBytes() != 9*uint64(os.Getpagesize()) {
		t.Errorf("SavedBytes = %d", s.SavedBytes())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		time.Sleep(100 * time.Millisecond)
		// Replaced whole, as the kernel's file reads: never empty.
		tmp := filepath.Join(t.TempDir(), "full_scans")
		if err := os.WriteFile(tmp, []byte("6\n"), 0o644); err == nil {
			_ = os.Rename(tmp, filepath.Join(dir, "full_scans"))
		}
	}()
	if err := n.AwaitScans(ctx, 2); err != nil {
		t.Fatalf("AwaitScans: %v", err)
	}
	if err := (Node{Dir: filepath.Join(dir, "none")}).Enable(Settings{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Enable without the scanner's files = %v, want ErrUnavailable", err)
	}
}

// TestMergeSelf opts a process in on the real kernel and reads it back from its
// ksm_stat; skipped where the kernel has no per-process merging.
func TestMergeSelf(t *testing.T) {
	if err := SetSelf(true); errors.Is(err, ErrUnavailable) {
		t.Skipf("this kernel: %v", err)
	}
	defer func() { _ = SetSelf(false) }()
	on, err := Self()
	if err != nil || !on {
		t.Fatalf("Self = %v, %v after SetSelf(true)", on, err)
	}
	p, err := ReadProcess("", os.Getpid())
	if err != nil || !p.MergeAny {
		t.Fatalf("ksm_stat = %+v, %v: want ksm_merge_any", p, err)
	}
	if err := SetSelf(false); err != nil {
		t.Fatal(err)
	}
	if on, _ := Self(); on {
		t.Fatal("still opted in after SetSelf(false)")
	}
}
