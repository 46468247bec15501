package mapper

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Backend names accepted in Config.Backend.
const (
	BackendAuto = "auto" // probe krbd, then nbd, then fuse; take the first usable one
	BackendKRBD = "krbd" // kernel RBD client: rbd device map
	BackendNBD  = "nbd"  // rbd-nbd daemon + nbd kernel module
	BackendFuse = "fuse" // rbd-fuse (one process per image) + loop device
	BackendFile = "file" // loop device over a local file (tests, fakes)
)

// DefaultTimeout bounds each external step when Config.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// Image names an RBD image, or one of its snapshots when Snap is set. A
// snapshot is always mapped read-only.
type Image struct {
	Pool string `json:"pool"`
	Name string `json:"name"`
	Snap string `json:"snap,omitempty"`
}

// String returns "pool/name" or "pool/name@snap", the spec the rbd CLI takes.
func (i Image) String() string {
	s := i.Pool + "/" + i.Name
	if i.Snap != "" {
		s += "@" + i.Snap
	}
	return s
}

// ReadOnly reports whether the image can only be mapped read-only.
func (i Image) ReadOnly() bool { return i.Snap != "" }

// Validate checks that every part is set (Snap may be empty) and free of
// characters the rbd CLI would read as separators.
func (i Image) Validate() error {
	var errs []error
	check := func(field, v string, required bool) {
		switch {
		case v == "" && required:
			errs = append(errs, fmt.Errorf("image %s is empty: name the %s: %w", field, strings.ToLower(field), ErrInvalid))
		case strings.ContainsAny(v, "/@ \t\n\x00"):
			errs = append(errs, fmt.Errorf("image %s %q holds '/', '@' or whitespace: give the bare name: %w", field, v, ErrInvalid))
		}
	}
	check("Pool", i.Pool, true)
	check("Name", i.Name, true)
	check("Snap", i.Snap, false)
	return errors.Join(errs...)
}

// Config configures a Mapper. The zero value is not usable: StateDir is
// required, and so are CephConf (ceph backends) or FilePath (file backend).
type Config struct {
	// Backend is "auto" (the default when empty), "krbd", "nbd", "fuse" or
	// "file". "auto" never picks "file".
	Backend string
	// StateDir holds the mapping records (StateDir/mappings/<id>.json) and
	// the rbd-fuse mount directories (StateDir/fuse/<id>). It must be an
	// absolute path, private to one node, and survive restarts of the
	// process so that Recover can undo what a killed process left.
	StateDir string
	// CephConf is the ceph.conf passed with -c to rbd, rbd-nbd and rbd-fuse.
	CephConf string
	// Keyring is the path of the cephx keyring (--keyring). It is passed
	// on, never read or logged. Empty: whatever CephConf says.
	Keyring string
	// ID is the cephx user without "client." (--id). Empty: "admin".
	ID string
	// FilePath resolves an Image to a local file for the file backend.
	// It should return an error wrapping fs.ErrNotExist (or ErrImageNotFound)
	// for an image that does not exist.
	FilePath func(Image) (string, error)
	// Timeout bounds each external step (one command, or the wait for an
	// rbd-fuse mount). A step doing I/O on an rbd-fuse mapping that
	// overruns it has its rbd-fuse killed (ErrStalled), since a process
	// blocked on that I/O cannot be killed. Zero means DefaultTimeout.
	Timeout time.Duration
}

var backendNames = []string{BackendAuto, BackendKRBD, BackendNBD, BackendFuse, BackendFile}

// Validate returns every problem of c at once (errors.Join), each wrapping
// ErrInvalid and naming the field and how to fix it. It checks that the
// files named exist, but never reads the keyring.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf(format+": %w", append(a, ErrInvalid)...))
	}
	backend := c.backend()
	known := false
	for _, n := range backendNames {
		known = known || backend == n
	}
	if !known {
		add("Config.Backend %q is unknown: use one of %s", c.Backend, strings.Join(backendNames, ", "))
	}
	switch {
	case c.StateDir == "":
		add("Config.StateDir is empty: set it to a node-local directory for mapping records, e.g. /var/lib/fogdeploy/mapper")
	case !filepath.IsAbs(c.StateDir):
		add("Config.StateDir %q is relative: give an absolute path", c.StateDir)
	}
	if backend == BackendFile {
		if c.FilePath == nil {
			add("Config.FilePath is nil but Config.Backend is %q: supply a func that resolves an Image to a local file", BackendFile)
		}
	} else if known {
		switch {
		case c.CephConf == "":
			add("Config.CephConf is empty but Config.Backend is %q: set it to a ceph.conf path (for the dev cluster: devenv.CephConf())", backend)
		case !fileExists(c.CephConf):
			add("Config.CephConf %q does not exist: start the cluster (make dev-up) or point it at an existing ceph.conf", c.CephConf)
		}
		if strings.ContainsAny(c.Keyring, " \t\n") {
			add("Config.Keyring %q holds whitespace, which CEPH_ARGS (how rbd-fuse gets it) cannot carry: move the keyring to a path without spaces", c.Keyring)
		} else if c.Keyring != "" && !fileExists(c.Keyring) {
			add("Config.Keyring %q does not exist: point it at the keyring of client.%s, or leave it empty to use ceph.conf's", c.Keyring, c.id())
		}
	}
	if strings.HasPrefix(c.ID, "client.") {
		add("Config.ID %q starts with \"client.\": give the bare user name, e.g. %q", c.ID, strings.TrimPrefix(c.ID, "client."))
	}
	if strings.ContainsAny(c.ID, " \t\n") {
		add("Config.ID %q holds whitespace: give a cephx user name such as \"admin\"", c.ID)
	}
	if c.Timeout < 0 {
		add("Config.Timeout %s is negative: use 0 for the default (%s) or a positive duration", c.Timeout, DefaultTimeout)
	}
	return errors.Join(errs...)
}

func (c Config) backend() string {
	if c.Backend == "" {
		return BackendAuto
	}
	return c.Backend
}

func (c Config) id() string {
	if c.ID == "" {
		return "admin"
	}
	return c.ID
}

func (c Config) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// cephArgs are the connection flags shared by the rbd and rbd-nbd CLIs.
func (c Config) cephArgs() []string {
	args := []string{"-c", c.CephConf, "--id", c.id()}
	if c.Keyring != "" {
		args = append(args, "--keyring", c.Keyring)
	}
	return args
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidateID checks a mapping ID.
func ValidateID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("mapping ID %q must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit: %w", id, ErrInvalid)
	}
	return nil
}
