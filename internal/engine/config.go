package engine

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// Environment variables that name an engine's installation prefix when the
// Config does not.
const (
	EnvDMTCPPrefix = "FOGDEPLOY_DMTCP_PREFIX"
	EnvCRIUPrefix  = "FOGDEPLOY_CRIU_PREFIX"
)

// Default installation prefixes, tried after the environment variables and
// before PATH.
const (
	DefaultDMTCPPrefix = "/opt/dmtcp"
	DefaultCRIUPrefix  = "/opt/criu"
)

// Config configures one engine. The zero value works: it finds the engine
// and logs nowhere.
type Config struct {
	// Prefix is where the engine is installed (bin/ or sbin/ below it).
	// "" means: $FOGDEPLOY_<ENGINE>_PREFIX, then /opt/<engine>, then PATH.
	Prefix string
	// TempDir holds per-instance state directories (DMTCP's tmpdir,
	// coordinator log, CRIU logs); each is removed when its process is gone.
	// "" means os.TempDir().
	TempDir string
	// Logger receives the engine's log; nil discards it.
	Logger *slog.Logger
	// StopTimeout is how long Stop waits after SIGTERM before it kills.
	// 0 means 10 s.
	StopTimeout time.Duration
	// Timeout bounds each wait inside Launch, Checkpoint and Restore (on top
	// of the caller's context). 0 means 2 min.
	Timeout time.Duration
	// TCPClose (CRIU) dumps no state of the app's established TCP
	// connections and restores them closed (criu --tcp-close), instead of
	// dumping them locked by iptables and restoring them open
	// (--tcp-established). The light container sets it: a restored
	// instance has another address than the one its connections had, and
	// the container has no iptables to lock them with.
	TCPClose bool
	// Confine applies to apps in a Root: the app and the engine's
	// processes beside it (DMTCP's coordinator, its commands) hold no
	// capability and cannot gain one (no_new_privs), even as root, and the
	// root gets a private /dev (internal/devfs) instead of the host's. The
	// host driver's engines set it; the light container's entrypoint drops
	// its app's capabilities itself and sets PrivateDev.
	Confine bool
	// PrivateDev gives an app in a Root a private /dev (internal/devfs),
	// new for each launch and restore, instead of a bind of the caller's
	// /dev, which a root app could change for whoever comes next. Confine
	// implies it.
	PrivateDev bool
}

// Validate returns every problem with the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Prefix != "" && !filepath.IsAbs(c.Prefix) {
		errs = append(errs, fmt.Errorf("prefix %q is not absolute: %w", c.Prefix, ErrInvalid))
	}
	if c.TempDir != "" && !filepath.IsAbs(c.TempDir) {
		errs = append(errs, fmt.Errorf("temp dir %q is not absolute: %w", c.TempDir, ErrInvalid))
	}
	if c.StopTimeout < 0 || c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("negative timeout: %w", ErrInvalid))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 10 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.TempDir == "" {
		c.TempDir = os.TempDir()
	}
	return c
}

// locate finds an engine's binaries: under the configured prefix, then the
// prefix named by envVar, then def, then on PATH. It returns the prefix and
// the path of each binary.
func locate(configured, envVar, def string, bins []string) (string, map[string]string, error) {
	var tried []string
	for _, prefix := range []string{configured, os.Getenv(envVar), def} {
		if prefix == "" {
			continue
		}
		tried = append(tried, prefix)
		if paths, ok := underPrefix(prefix, bins); ok {
			return prefix, paths, nil
		}
	}
	if p, err := exec.LookPath(bins[0]); err == nil {
		if p, err = filepath.Abs(p); err == nil {
			prefix := filepath.Dir(filepath.Dir(p))
			if paths, ok := underPrefix(prefix, bins); ok {
				return prefix, paths, nil
			}
		}
	}
	tried = append(tried, "PATH")
	return "", nil, fmt.Errorf("%s not found (looked in %s): %w", bins[0], strings.Join(tried, ", "), ErrUnavailable)
}

func underPrefix(prefix string, bins []string) (map[string]string, bool) {
	paths := map[string]string{}
	for _, b := range bins {
		found := false
		for _, d := range []string{"bin", "sbin"} {
			p := filepath.Join(prefix, d, b)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				paths[b] = p
				found = true
				break
			}
		}
		if !found {
			return nil, false
		}
	}
	return paths, true
}

// needRoot reports ErrUnavailable unless we are root: the engines make
// namespaces and mounts.
func needRoot(engine Name) error {
	if os.Geteuid() != 0 {
		return hint.With(fmt.Errorf("%s engine needs root (namespaces, mounts), running as uid %d: %w",
			engine, os.Geteuid(), ErrUnavailable), "run the agent as root, or in a privileged container")
	}
	return nil
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// appEnv returns the app's environment before the engine's additions.
func appEnv(spec LaunchSpec) []string {
	if spec.Env != nil {
		return append([]string(nil), spec.Env...)
	}
	if spec.Root == "" {
		return os.Environ()
	}
	return []string{"PATH=" + defaultPath, "HOME=/"}
}

func getEnv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// resolveArgv0 finds the app's binary as the app will see it: in PATH of
// env, inside root. It returns the path inside root.
func resolveArgv0(root, argv0 string, env []string) (string, error) {
	where := "the host"
	if root != "" {
		where = "root " + root
	}
	check := func(p string) bool {
		st, err := os.Stat(filepath.Join(root, p))
		return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
	}
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			return "", fmt.Errorf("app binary %q: relative paths are not allowed: %w", argv0, ErrInvalid)
		}
		if check(p) {
			return p, nil
		}
		return "", hint.With(fmt.Errorf("app binary %q not found in %s: %w", argv0, where, ErrInvalid),
			"check the path, or install the app in the environment image")
	}
	path := getEnv(env, "PATH")
	if path == "" {
		path = defaultPath
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		if p := filepath.Join(d, argv0); check(p) {
			return p, nil
		}
	}
	return "", hint.With(fmt.Errorf("app binary %q not found in PATH=%s of %s: %w", argv0, path, where, ErrInvalid),
		"install the app in the environment image, or give an absolute path")
}

func validateLaunch(spec LaunchSpec, engine Name) error {
	var errs []error
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		errs = append(errs, fmt.Errorf("launch: empty Argv: %w", ErrInvalid))
	}
	if spec.Root != "" {
		if st, err := os.Stat(spec.Root); err != nil || !st.IsDir() || !filepath.IsAbs(spec.Root) {
			errs = append(errs, fmt.Errorf("launch: root %q is not an absolute directory: %w", spec.Root, ErrInvalid))
		}
	}
	if spec.Dir != "" && !filepath.IsAbs(spec.Dir) {
		errs = append(errs, fmt.Errorf("launch: dir %q is not absolute: %w", spec.Dir, ErrInvalid))
	}
	switch spec.Compression {
	case "", "none":
	case "gzip":
		if engine != NameDMTCP {
			errs = append(errs, fmt.Errorf("launch: compression gzip is DMTCP only: %w", ErrInvalid))
		}
	default:
		errs = append(errs, fmt.Errorf("launch: unknown compression %q (none, gzip): %w", spec.Compression, ErrInvalid))
	}
	return errors.Join(errs...)
}

func validateRoot(root string) error {
	if root == "" {
		return nil
	}
	if st, err := os.Stat(root); err != nil || !st.IsDir() || !filepath.IsAbs(root) {
		return fmt.Errorf("root %q is not an absolute directory: %w", root, ErrInvalid)
	}
	return nil
}
