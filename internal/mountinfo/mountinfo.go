// Package mountinfo reads the kernel's mount table (/proc/<pid>/mountinfo).
package mountinfo

import (
	"errors"
	"fmt"
	"os"
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

// Under returns the mount points of this process's mount namespace that
// are dir or below it.
func Under(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
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
