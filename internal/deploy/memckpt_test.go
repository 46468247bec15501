package deploy

import (
	"strings"
	"testing"
)

// TestMemCkptFits: a checkpoint goes into memory only within the
// instance's memory bound, which counts its files beside what the
// instance uses, and leaving the node its reserve.
func TestMemCkptFits(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name                      string
		used, bound, avail, total int64
		ok                        bool
		why                       string
	}{
		{"no bound, room", 300 * mib, 0, 8192 * mib, 16384 * mib, true, ""},
		{"bound with room", 300 * mib, 1024 * mib, 8192 * mib, 16384 * mib, true, ""},
		{"bound too tight", 300 * mib, 512 * mib, 8192 * mib, 16384 * mib, false, "memory bound leaves 212 MiB"},
		{"node short", 300 * mib, 0, 900 * mib, 4096 * mib, false, "node has 900 MiB available"},
		{"a tenth of a big node stays free", 300 * mib, 0, 6400 * mib, 65536 * mib, false, "6553 MiB stay free"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok, why := memCkptFits(c.used, c.bound, memCkptNeed(c.used), c.avail, c.total)
			if ok != c.ok || !strings.Contains(why, c.why) {
				t.Errorf("memCkptFits = %v, %q; want %v, %q", ok, why, c.ok, c.why)
			}
		})
	}
	if n := memCkptNeed(256 << 20); n < 256<<20 {
		t.Errorf("memCkptNeed(256 MiB) = %d; want at least what it uses", n)
	}
}
