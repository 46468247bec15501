package drivers

import (
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/ctlfs"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// libcPaths are where a glibc-based root file system keeps libc.so.6
// (multiarch Debian/Ubuntu first, then the lib64 layouts).
var libcPaths = []string{
	"lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libc.so.6",
	"lib/aarch64-linux-gnu/libc.so.6", "usr/lib/aarch64-linux-gnu/libc.so.6",
	"lib64/libc.so.6", "usr/lib64/libc.so.6", "lib/libc.so.6", "usr/lib/libc.so.6",
}

// maxLibcBytes bounds the libc.so.6 that EnvGlibc reads (glibc 2.36's
// is about 2 MiB).
const maxLibcBytes = 32 << 20

var (
	glibcBanner  = regexp.MustCompile(`GNU C Library [^\n]*release version ([0-9]+\.[0-9]+)`)
	glibcVersion = regexp.MustCompile(`GLIBC_([0-9]+\.[0-9]+)`)
)

// EnvGlibc returns the version of the GNU C library in the root file
// system at root ("2.36"), or an error saying it has none.
func EnvGlibc(root string) (string, error) {
	for _, p := range libcPaths {
		// The root holds what the app wrote at its first boot: its links
		// stay inside, and a FIFO or a sparse giant is refused unread.
		b, err := ctlfs.ReadInRoot(root, p, maxLibcBytes)
		if err != nil {
			continue
		}
		if m := glibcBanner.FindSubmatch(b); m != nil {
			return string(m[1]), nil
		}
		// No banner: the newest symbol version the library defines.
		best := ""
		for _, m := range glibcVersion.FindAllSubmatch(b, -1) {
			if v := string(m[1]); best == "" || versionLess(best, v) {
				best = v
			}
		}
		if best != "" {
			return best, nil
		}
	}
	return "", fmt.Errorf("no GNU C library (libc.so.6) in the environment: %w", fs.ErrNotExist)
}

// checkEnvForDMTCP reports, wrapping spec.ErrInvalidSpec, why the environment
// mounted at root cannot run DMTCP's tools, which run on the environment's
// own C library: it has no glibc, or one older than need ("" skips the
// version check).
func checkEnvForDMTCP(root, env, need string) error {
	have, err := EnvGlibc(root)
	if err != nil {
		return hint.With(fmt.Errorf("%w: environment %s cannot run under DMTCP: %w", spec.ErrInvalidSpec, env, err),
			"DMTCP runs on the environment's glibc: build the environment FROM a glibc distribution (e.g. debian-bookworm), "+
				"or deploy it with --mode boot")
	}
	if need != "" && versionLess(have, need) {
		return hint.With(fmt.Errorf("%w: environment %s has glibc %s, DMTCP here needs %s or newer", spec.ErrInvalidSpec, env, have, need),
			"rebuild the environment on a newer distribution, build DMTCP against an older glibc, or deploy with --mode boot")
	}
	return nil
}

// versionLess compares dotted numeric versions ("2.9" < "2.36").
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}
