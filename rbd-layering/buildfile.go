package layering

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// StepKind is the instruction of one build-file line.
type StepKind string

// Build-file instructions. FROM must come first and only once.
const (
	StepFrom    StepKind = "FROM"
	StepRun     StepKind = "RUN"
	StepCopy    StepKind = "COPY"
	StepEnv     StepKind = "ENV"
	StepWorkdir StepKind = "WORKDIR"
)

// Network is the network a RUN step (or an exec) runs with.
type Network string

// Networks of a RUN step.
const (
	// NetworkDefault, the default, what Docker gives a build: a network
	// namespace of the step's own whose only way out is a user-mode NAT
	// (slirp4netns, sandbox_net.go), for outbound connections and DNS;
	// the node's loopback, and so its etcd and agents, are not reachable,
	// and the step holds no capability over the node's network.
	NetworkDefault Network = ""
	// NetworkNone: a network namespace of the step's own with only the
	// loopback interface up (`RUN --network=none`).
	NetworkNone Network = "none"
	// NetworkHost: the node's network namespace and its /etc/resolv.conf
	// (bound read-only). Only where the operator allows it
	// (layering.build_host_network; ManagerConfig.HostNetwork).
	NetworkHost Network = "host"
)

// check says whether the step's network may be used by a manager of cfg.
func (n Network) check(cfg ManagerConfig) error {
	switch n {
	case NetworkDefault, NetworkNone:
		return nil
	case NetworkHost:
		if !cfg.HostNetwork {
			return hint.With(fmt.Errorf("network host: %w: a step on the node's own network could change its firewall and reach its etcd", ErrInvalid),
				"drop --network=host: the default network reaches the package mirror through NAT; an operator who trusts the build file sets layering.build_host_network: true")
		}
		return nil
	}
	return fmt.Errorf("network %q: want %q, %q or the default: %w", string(n), NetworkNone, NetworkHost, ErrInvalid)
}

// Step is one parsed instruction.
type Step struct {
	Kind StepKind
	Args []string // RUN: [command]; COPY: [src, dst]; ENV: [key, value]; WORKDIR: [dir]; FROM: [env]
	// Network is RUN's --network (NetworkDefault unless given). It
	// is not part of the step's cache key: a layer is what its command
	// made, whatever network it had.
	Network Network
	Line    int
}

// String renders the step as written (normalized).
func (s Step) String() string {
	switch {
	case s.Kind == StepEnv:
		return fmt.Sprintf("ENV %s=%s", s.Args[0], s.Args[1])
	case s.Kind == StepRun && s.Network != NetworkDefault:
		return "RUN --network=" + string(s.Network) + " " + strings.Join(s.Args, " ")
	default:
		return string(s.Kind) + " " + strings.Join(s.Args, " ")
	}
}

// Changes reports whether the step writes into the filesystem (and so
// makes a layer) rather than only changing the configuration.
func (s Step) Changes() bool { return s.Kind == StepRun || s.Kind == StepCopy }

// BuildFile is a parsed build file: a FROM and the steps on top of it.
type BuildFile struct {
	From  string
	Steps []Step
}

// MaxBuildFile bounds the size of a build file.
const MaxBuildFile = 1 << 20

// ParseBuildFile parses a build file. Lines are "INSTRUCTION args"; blank
// lines and lines starting with # are ignored, and a trailing backslash
// continues a line. Every error names the line and says how to fix it.
func ParseBuildFile(r io.Reader) (*BuildFile, error) {
	sc := bufio.NewScanner(io.LimitReader(r, MaxBuildFile+1))
	sc.Buffer(make([]byte, 64<<10), MaxBuildFile)
	bf := &BuildFile{}
	var cont strings.Builder
	start, lineNo, total := 0, 0, 0
	for sc.Scan() {
		lineNo++
		total += len(sc.Bytes()) + 1
		if total > MaxBuildFile {
			return nil, fmt.Errorf("build file is larger than %d bytes: %w", MaxBuildFile, ErrInvalid)
		}
		line := strings.TrimSpace(sc.Text())
		if cont.Len() == 0 {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			start = lineNo
		}
		if strings.HasSuffix(line, "\\") {
			cont.WriteString(strings.TrimSuffix(line, "\\"))
			cont.WriteString(" ")
			continue
		}
		cont.WriteString(line)
		full := cont.String()
		cont.Reset()
		if err := bf.add(full, start); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("build file: %w: %w", err, ErrInvalid)
	}
	if cont.Len() > 0 {
		return nil, fmt.Errorf("build file line %d: the file ends inside a continued line: remove the last backslash: %w", start, ErrInvalid)
	}
	if bf.From == "" {
		return nil, fmt.Errorf("build file: no FROM line: start with `FROM <environment>`: %w", ErrInvalid)
	}
	return bf, nil
}

func (bf *BuildFile) add(line string, n int) error {
	word, rest, _ := strings.Cut(line, " ")
	kind := StepKind(strings.ToUpper(word))
	rest = strings.TrimSpace(rest)
	bad := func(format string, a ...any) error {
		return fmt.Errorf("build file line %d: %s: %w", n, fmt.Sprintf(format, a...), ErrInvalid)
	}
	if bf.From == "" && kind != StepFrom {
		return bad("%s before FROM: the first step must be `FROM <environment>`", word)
	}
	switch kind {
	case StepFrom:
		if bf.From != "" {
			return bad("a second FROM: a build file has exactly one")
		}
		if err := ValidateName("FROM", rest); err != nil {
			return bad("%v", err)
		}
		bf.From = rest
		return nil
	case StepRun:
		network := NetworkDefault
		for strings.HasPrefix(rest, "--") {
			flag, after := rest, ""
			if i := strings.IndexAny(rest, " \t"); i >= 0 {
				flag, after = rest[:i], rest[i+1:]
			}
			switch flag {
			case "--network=host":
				network = NetworkHost
			case "--network=none":
				network = NetworkNone
			case "--network=default":
				network = NetworkDefault
			default:
				return bad("RUN flag %q: RUN takes only --network=none (no network), --network=default (outbound through NAT, as without the flag) or --network=host (the node's network, where the operator allows it)", flag)
			}
			rest = strings.TrimSpace(after)
		}
		if rest == "" {
			return bad("RUN needs a command, e.g. `RUN apt-get install -y redis-server`")
		}
		bf.Steps = append(bf.Steps, Step{Kind: kind, Args: []string{rest}, Network: network, Line: n})
	case StepCopy:
		f := strings.Fields(rest)
		if len(f) != 2 {
			return bad("COPY takes a source in the build context and an absolute destination, e.g. `COPY app/ /srv/app/`")
		}
		src := path.Clean(f[0])
		if path.IsAbs(src) || src == ".." || strings.HasPrefix(src, "../") {
			return bad("COPY source %q leaves the build context: use a path relative to the context directory", f[0])
		}
		if !path.IsAbs(f[1]) {
			return bad("COPY destination %q is not absolute: write e.g. /srv/app/", f[1])
		}
		bf.Steps = append(bf.Steps, Step{Kind: kind, Args: []string{src, f[1]}, Line: n})
	case StepEnv:
		k, v, ok := strings.Cut(rest, "=")
		if !ok {
			k, v, ok = strings.Cut(rest, " ")
		}
		k, v = strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"`)
		if !ok || k == "" || strings.ContainsAny(k, " \t=") {
			return bad("ENV takes KEY=VALUE, e.g. `ENV LANG=C.UTF-8`")
		}
		bf.Steps = append(bf.Steps, Step{Kind: kind, Args: []string{k, v}, Line: n})
	case StepWorkdir:
		if !path.IsAbs(rest) {
			return bad("WORKDIR %q is not an absolute path: write e.g. /srv/app", rest)
		}
		bf.Steps = append(bf.Steps, Step{Kind: kind, Args: []string{path.Clean(rest)}, Line: n})
	default:
		return bad("unknown step %q: use FROM, RUN, COPY, ENV or WORKDIR", word)
	}
	return nil
}
