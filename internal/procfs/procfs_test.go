package procfs

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Docker's default profile (moby's oci.DefaultSpec) masks and makes
// read-only these paths under /proc; the lists cover them all.
func TestListsCoverDockerDefaults(t *testing.T) {
	for _, p := range []string{"asound", "acpi", "kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "scsi"} {
		if !slices.Contains(Masked, p) {
			t.Errorf("Masked lacks /proc/%s", p)
		}
	}
	for _, p := range []string{"bus", "fs", "irq", "sys", "sysrq-trigger"} {
		if !slices.Contains(ReadOnly, p) {
			t.Errorf("ReadOnly lacks /proc/%s", p)
		}
	}
}

// Hidden reads a mount table: a fresh procfs alone leaves every path of
// the running kernel open; covered and read-only mounts close them.
func TestHidden(t *testing.T) {
	fresh := "22 1 0:5 / /proc rw,nosuid,nodev,noexec shared:1 - proc proc rw\n"
	open := Hidden(fresh, "/proc")
	for _, p := range []string{"/proc/sys (not read-only)", "/proc/irq (not read-only)", "/proc/timer_list (not masked)"} {
		if _, err := os.Stat(strings.Fields(p)[0]); err == nil && !slices.Contains(open, p) {
			t.Errorf("Hidden(a fresh procfs) = %v; want %s among them", open, p)
		}
	}
	var b strings.Builder
	b.WriteString(fresh)
	for _, p := range Masked {
		b.WriteString("30 22 0:1 /null /proc/" + p + " rw,nosuid - devtmpfs udev rw\n")
	}
	for _, p := range ReadOnly {
		b.WriteString("31 22 0:5 /" + p + " /proc/" + p + " ro,nosuid,nodev,noexec - proc proc rw\n")
	}
	if open := Hidden(b.String(), "/proc"); len(open) != 0 {
		t.Errorf("Hidden(everything covered) = %v; want none", open)
	}
	// A read-only path bound read-write is still open.
	rw := strings.Replace(b.String(), "/proc/sys ro,", "/proc/sys rw,", 1)
	if open := Hidden(rw, "/proc"); !slices.Contains(open, "/proc/sys (not read-only)") {
		t.Errorf("Hidden(/proc/sys rw) = %v; want it open", open)
	}
}

// Script is valid shell, and names every path.
func TestScript(t *testing.T) {
	s := Script()
	if out, err := exec.Command("sh", "-n", "-c", s).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s\n%s", err, out, s)
	}
	for _, p := range append(slices.Clone(Masked), ReadOnly...) {
		if !strings.Contains(s, `"$PROC/`+p+`"`) {
			t.Errorf("Script does not name %s", p)
		}
	}
}
