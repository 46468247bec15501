// Package mountinfo reads the kernel's mount table (/proc/<pid>/mountinfo).
package mountinfo

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Unescape undoes the octal escapes (\040 for a space, \011, \012, \134)
// the kernel writes into mountinfo's paths.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Under returns the mount points of the calling thread's mount namespace that
// are dir or below it.
func Under(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	dir = strings.TrimSuffix(dir, "/")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		if t := Unescape(f[4]); t == dir || strings.HasPrefix(t, dir+"/") {
			out = append(out, t)
		}
	}
	return out, nil
}

// ErrMounted: RemoveAll found something mounted under the directory.
var ErrMounted = errors.New("something is mounted under it")

// RemoveAll removes dir and what it holds, unless something is mounted at
// or under it (ErrMounted): removing through a mount would delete what the
// mounted filesystem holds, and a build step's /dev is the host's.
func RemoveAll(dir string) error {
	mounts, err := Under(dir)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return fmt.Errorf("%s is not removed: %w: %s", dir, ErrMounted, strings.Join(mounts, ", "))
	}
	return os.RemoveAll(dir)
}

// Empty removes what dir holds, keeping dir (as an unmount leaves an empty
// mount point), unless something is mounted under it (ErrMounted). The
// directories under it are made writable first, so that one copied
// read-only (a root file system's /proc, 0555) is emptied too. A dir that
// does not exist is empty.
func Empty(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	mounts, err := Under(dir)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return fmt.Errorf("%s is not emptied: %w: %s", dir, ErrMounted, strings.Join(mounts, ", "))
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		_ = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(path, 0o700)
			}
			return nil
		})
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}
