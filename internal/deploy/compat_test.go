package deploy

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

func TestHostPlatform(t *testing.T) {
	p := spec.HostPlatform()
	if p.Arch != runtime.GOARCH || p.Kernel == "" {
		t.Fatalf("HostPlatform = %+v; want this arch and a kernel release", p)
	}
	if runtime.GOARCH == "amd64" && len(p.CPUFlags) == 0 {
		t.Fatal("no CPU flags read from /proc/cpuinfo")
	}
}

func TestRestorableOn(t *testing.T) {
	node := spec.Platform{Arch: "amd64", Kernel: "6.1.0", CPUFlags: []string{"avx", "avx2", "sse4_2"}}
	gen := func(p *spec.Platform, v string) spec.Generation {
		return spec.Generation{Gen: 3, Engine: "dmtcp", EngineVersion: v, Platform: p}
	}
	for _, tc := range []struct {
		name string
		g    spec.Generation
		want string // "" = restorable
	}{
		{"same", gen(&spec.Platform{Arch: "amd64", CPUFlags: []string{"avx", "sse4_2"}}, "4.2.0"), ""},
		{"old record without platform", gen(nil, "4.2.0"), ""},
		{"another kernel is fine", gen(&spec.Platform{Arch: "amd64", Kernel: "5.10"}, "4.2.0"), ""},
		{"engine version", gen(nil, "5.0"), "checkpointed by dmtcp 5.0, this node has dmtcp 4.2.0"},
		{"arch", gen(&spec.Platform{Arch: "arm64"}, "4.2.0"), "checkpointed on arm64, this node is amd64"},
		{"cpu flags", gen(&spec.Platform{Arch: "amd64", CPUFlags: []string{"avx", "avx512f", "sha_ni"}}, "4.2.0"), "lacks (avx512f, sha_ni)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := restorableOn(tc.g, node, "4.2.0")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("restorableOn = %v; want restorable", err)
				}
				return
			}
			if !errors.Is(err, ErrIncompatible) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restorableOn = %v; want ErrIncompatible saying %q", err, tc.want)
			}
		})
	}
	many := make([]string, 10)
	for i := range many {
		many[i] = "zz" + string(rune('a'+i))
	}
	err := restorableOn(gen(&spec.Platform{Arch: "amd64", CPUFlags: many}, ""), node, "4.2.0")
	if err == nil || !strings.Contains(err.Error(), "and 4 more") {
		t.Fatalf("ten missing flags: %v; want six named and 'and 4 more'", err)
	}
}
