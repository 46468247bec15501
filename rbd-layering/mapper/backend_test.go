package mapper

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// probeOnly is a Backend whose Probe returns err; it attaches nothing.
type probeOnly struct {
	name  string
	err   error
	calls *int
}

func (b probeOnly) Name() string { return b.name }
func (b probeOnly) Probe(context.Context) error {
	*b.calls++
	return b.err
}
func (b probeOnly) Attach(context.Context, Image, *Record, func() error) (string, error) {
	return "", errors.ErrUnsupported
}
func (b probeOnly) Detach(context.Context, Record) error { return nil }

func TestChoose(t *testing.T) {
	noMod := errors.New("no module")
	tests := []struct {
		name     string
		want     string
		probes   map[string]error // absent = usable
		chosen   string
		probed   []string
		sentinel error
	}{
		{"auto prefers krbd", "auto", nil, "krbd", []string{"krbd"}, nil},
		{"auto falls back to nbd", "auto", map[string]error{"krbd": noMod}, "nbd", []string{"krbd", "nbd"}, nil},
		{"auto falls back to fuse (this machine)", "auto", map[string]error{"krbd": noMod, "nbd": noMod}, "fuse", []string{"krbd", "nbd", "fuse"}, nil},
		{"auto never picks file", "auto", map[string]error{"krbd": noMod, "nbd": noMod, "fuse": noMod}, "", []string{"krbd", "nbd", "fuse"}, ErrNoBackend},
		{"explicit usable", "nbd", nil, "nbd", []string{"nbd"}, nil},
		{"explicit unusable", "krbd", map[string]error{"krbd": noMod}, "", []string{"krbd"}, ErrBackendUnavailable},
		{"explicit file", "file", nil, "file", []string{"file"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := map[string]*int{}
			all := map[string]Backend{}
			for _, n := range []string{"krbd", "nbd", "fuse", "file"} {
				calls[n] = new(int)
				all[n] = probeOnly{name: n, err: tt.probes[n], calls: calls[n]}
			}
			b, c, err := choose(t.Context(), tt.want, all)
			if tt.sentinel != nil {
				if !errors.Is(err, tt.sentinel) || b != nil {
					t.Fatalf("choose = %v, %v; want %v", b, err, tt.sentinel)
				}
				if !errors.Is(err, noMod) || !strings.Contains(err.Error(), "hint:") {
					t.Errorf("error %q should carry the probe failures and a hint", err)
				}
			} else {
				if err != nil || b.Name() != tt.chosen || c.Backend != tt.chosen || c.Reason == "" {
					t.Fatalf("choose = %v, %+v, %v; want %s with a reason", b, c, err, tt.chosen)
				}
			}
			var probed []string
			for _, p := range c.Probes {
				probed = append(probed, p.Backend)
				if !errors.Is(p.Err, tt.probes[p.Backend]) {
					t.Errorf("probe result of %s = %v, want %v", p.Backend, p.Err, tt.probes[p.Backend])
				}
			}
			if strings.Join(probed, ",") != strings.Join(tt.probed, ",") {
				t.Errorf("probed %v, want %v", probed, tt.probed)
			}
			for n, k := range calls {
				want := 0
				for _, p := range tt.probed {
					if p == n {
						want = 1
					}
				}
				if *k != want {
					t.Errorf("%s probed %d times, want %d", n, *k, want)
				}
			}
		})
	}
}

func TestChooseReasonNamesSkipped(t *testing.T) {
	calls := new(int)
	all := map[string]Backend{
		"krbd": probeOnly{"krbd", errors.New("no rbd kernel module"), calls},
		"nbd":  probeOnly{"nbd", errors.New("no nbd kernel module"), calls},
		"fuse": probeOnly{"fuse", nil, calls},
	}
	_, c, err := choose(t.Context(), "auto", all)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"fuse", "no rbd kernel module", "no nbd kernel module"} {
		if !strings.Contains(c.Reason, w) {
			t.Errorf("Reason %q does not mention %q", c.Reason, w)
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	in := `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
98 22 7:3 / /tmp/a\040b rw,relatime shared:50 - ext4 /dev/loop3 rw
99 22 0:55 / /st/fuse/x rw,nosuid,nodev,relatime shared:51 - fuse rbd-fuse rw,user_id=0,group_id=0
`
	got := parseMountinfo(in)
	if len(got) != 3 {
		t.Fatalf("parsed %d entries: %+v", len(got), got)
	}
	if got[1] != (mountEntry{Dev: "7:3", Target: "/tmp/a b", FSType: "ext4", Source: "/dev/loop3"}) {
		t.Errorf("entry 1 = %+v", got[1])
	}
	if got[2].FSType != "fuse" || got[2].Target != "/st/fuse/x" {
		t.Errorf("entry 2 = %+v", got[2])
	}
}

func TestCmdlineMatches(t *testing.T) {
	argv := []string{"/usr/bin/rbd-fuse", "-c", "/c", "-p", "p", "-r", "img", "-f", "/st/fuse/abc"}
	if !cmdlineMatches(argv, "rbd-fuse", "/st/fuse/abc") {
		t.Error("exact mount dir did not match")
	}
	if cmdlineMatches(argv, "rbd-fuse", "/st/fuse/ab") || cmdlineMatches(argv, "rbd-nbd", "/st/fuse/abc") {
		t.Error("prefix or other program matched")
	}
}

func TestStoreCreateIsExclusive(t *testing.T) {
	s := newStore(t.TempDir(), nil)
	rec := &Record{Version: recordVersion, ID: "x1", Backend: "file"}
	if err := s.create(rec); err != nil {
		t.Fatal(err)
	}
	if err := s.create(rec); !errors.Is(err, ErrBusy) {
		t.Fatalf("second create = %v, want ErrBusy", err)
	}
	rec.Device = "/dev/loop9"
	if err := s.save(rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.load("x1")
	if err != nil || got.Device != "/dev/loop9" {
		t.Fatalf("load = %+v, %v", got, err)
	}
	ids, err := s.ids()
	if err != nil || len(ids) != 1 || ids[0] != "x1" {
		t.Fatalf("ids = %v, %v (temp files must not show)", ids, err)
	}
	if err := s.remove("x1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.load("x1"); !errors.Is(err, ErrNotMapped) {
		t.Fatalf("load after remove = %v, want ErrNotMapped", err)
	}
}
