package layering

import (
	"errors"
	"strings"
	"testing"
)

func TestParseBuildFile(t *testing.T) {
	bf, err := ParseBuildFile(strings.NewReader(`# redis on debian
FROM debian-min
ENV LANG=C.UTF-8
RUN apt-get update && \
    apt-get install -y redis-server
COPY conf/redis.conf /etc/redis/
WORKDIR /srv
`))
	if err != nil {
		t.Fatal(err)
	}
	if bf.From != "debian-min" || len(bf.Steps) != 4 {
		t.Fatalf("parsed %+v", bf)
	}
	if got := bf.Steps[1].String(); got != "RUN apt-get update &&  apt-get install -y redis-server" {
		t.Errorf("continued RUN = %q", got)
	}
	if bf.Steps[1].Line != 4 || bf.Steps[2].Args[0] != "conf/redis.conf" {
		t.Errorf("steps = %+v", bf.Steps)
	}
}

// TestParseRunNetwork: RUN --network=host gives the step the host's
// network; it shows in the step as written, not in its cache key.
func TestParseRunNetwork(t *testing.T) {
	bf, err := ParseBuildFile(strings.NewReader("FROM a\nRUN --network=host\tapt-get update\nRUN --network=none true\nRUN apt-get update\nRUN --network=default true\n"))
	if err != nil {
		t.Fatal(err)
	}
	host, none, plain, def := bf.Steps[0], bf.Steps[1], bf.Steps[2], bf.Steps[3]
	if host.Network != NetworkHost || host.Args[0] != "apt-get update" || host.String() != "RUN --network=host apt-get update" {
		t.Errorf("RUN --network=host apt-get update = %+v (%s)", host, host)
	}
	if none.Network != NetworkNone || none.String() != "RUN --network=none true" {
		t.Errorf("RUN --network=none true = %+v (%s)", none, none)
	}
	if plain.Network != NetworkDefault || plain.String() != "RUN apt-get update" || def.Network != NetworkDefault || def.String() != "RUN true" {
		t.Errorf("RUN apt-get update = %+v (%s), RUN --network=default true = %+v (%s); want the default network", plain, plain, def, def)
	}
	// The node's own network only where the manager allows it.
	if err := host.Network.check(DefaultManagerConfig("/w")); !errors.Is(err, ErrInvalid) {
		t.Errorf("--network=host without HostNetwork: %v; want ErrInvalid", err)
	}
	if err := host.Network.check(ManagerConfig{HostNetwork: true}); err != nil {
		t.Errorf("--network=host with HostNetwork: %v", err)
	}
	parent := SnapRef{Image: "fdl-x", Snap: SealedSnap}
	if cacheKey(parent, host, ImageConfig{}, "") != cacheKey(parent, plain, ImageConfig{}, "") {
		t.Error("--network=host changes the step's cache key: a layer is what its command made")
	}
}

func TestParseBuildFileErrors(t *testing.T) {
	cases := map[string]string{
		"RUN true\n":                            "line 1: RUN before FROM",
		"FROM a\nFROM b\n":                      "line 2: a second FROM",
		"FROM a\nFOO bar\n":                     `line 2: unknown step "FOO"`,
		"FROM a\nCOPY ../x /y\n":                "leaves the build context",
		"FROM a\nCOPY x y\n":                    "is not absolute",
		"FROM a\nENV\n":                         "ENV takes KEY=VALUE",
		"FROM a\nWORKDIR rel\n":                 "not an absolute path",
		"FROM a\nRUN\n":                         "RUN needs a command",
		"FROM a\nRUN --network=host\n":          "RUN needs a command",
		"FROM a\nRUN --network=bridge x\n":      `line 2: RUN flag "--network=bridge"`,
		"FROM a\nRUN --network host x\n":        `line 2: RUN flag "--network"`,
		"# nothing\n":                           "no FROM line",
		"FROM Bad/Name\n":                       "may only hold",
		"FROM a\nRUN x \\\n":                    "ends inside a continued line",
		"FROM a\n" + strings.Repeat("#", 2<<20): "larger than",
	}
	for in, want := range cases {
		_, err := ParseBuildFile(strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseBuildFile(%.30q) = %v, want an ErrInvalid containing %q", in, err, want)
		}
	}
}

func FuzzParseBuildFile(f *testing.F) {
	f.Add("FROM a\nRUN echo hi\nCOPY x /y\nENV A=B\nWORKDIR /w\n")
	f.Add("FROM a\nRUN x \\\n y\n")
	f.Fuzz(func(t *testing.T, s string) {
		bf, err := ParseBuildFile(strings.NewReader(s))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if ValidateName("FROM", bf.From) != nil {
			t.Fatalf("accepted FROM %q", bf.From)
		}
		for _, st := range bf.Steps {
			if st.Kind == StepCopy && (strings.HasPrefix(st.Args[0], "/") || strings.HasPrefix(st.Args[0], "..")) {
				t.Fatalf("accepted COPY source %q", st.Args[0])
			}
		}
	})
}

func TestNamesAndSizes(t *testing.T) {
	for _, bad := range []string{"", "a/b", "has space", "UPPER", "-lead", strings.Repeat("a", 64)} {
		if ValidateName("name", bad) == nil {
			t.Errorf("ValidateName(%q) accepted", bad)
		}
	}
	for _, good := range []string{"redis", "debian-12.min", "a"} {
		if err := ValidateName("name", good); err != nil {
			t.Errorf("ValidateName(%q) = %v", good, err)
		}
	}
	sizes := map[string]int64{"1G": 1 << 30, "512M": 512 << 20, "1.5GiB": 3 << 29, "4096": 4096, "2g": 2 << 30}
	for in, want := range sizes {
		if got, err := ParseSize("--size", in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1G", "0", "abc", "", "1X", "NaN"} {
		if _, err := ParseSize("--size", bad); err == nil || !strings.Contains(err.Error(), "--size") {
			t.Errorf("ParseSize(%q) = %v, want an error naming --size", bad, err)
		}
	}
}

// A RUN that fails to resolve a name says what its network is and how to
// give it one.
func TestDNSFailedHint(t *testing.T) {
	out := "Err:1 http://deb.debian.org/debian bookworm InRelease\n  Temporary failure resolving 'deb.debian.org'\nE: Unable to locate package redis-server\n"
	for network, want := range map[Network]string{NetworkNone: "--network=none", NetworkDefault: stepDNS, NetworkHost: "node's resolver"} {
		if h, ok := dnsFailed(out, network); !ok || !strings.Contains(h, want) {
			t.Errorf("dnsFailed(network %q) = %q, %v; want a hint naming %q", network, h, ok, want)
		}
	}
	if h, ok := dnsFailed("E: Sub-process /usr/bin/dpkg returned an error code (1)\n", NetworkDefault); ok {
		t.Errorf("dnsFailed(a dpkg failure) = %q; want none", h)
	}
}
