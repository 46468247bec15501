package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Linux capability numbers of the user switch (linux/capability.h).
const (
	capSetgid = 6
	capSetuid = 7
)

// account is the user the app runs as (-user), resolved in the
// environment's /etc/passwd and /etc/group.
type account struct {
	uid, gid uint32
	groups   []uint32 // supplementary groups, the primary one included
	home     string
}

// lookupUser resolves spec ("name", "uid", "name:group" or "uid:gid") in
// root's /etc/passwd and /etc/group. A name must exist; a numeric uid that
// passwd lacks runs with gid 0 unless a group is given, and with no home.
// uid 0 is refused: an app without -user already runs as root, and with
// no capability at all.
func lookupUser(root, spec string) (account, error) {
	name, group, _ := strings.Cut(spec, ":")
	if name == "" || strings.Contains(group, ":") {
		return account{}, fmt.Errorf("-user %q: want NAME, UID, NAME:GROUP or UID:GID", spec)
	}
	users, err := readIDFile(filepath.Join(root, "etc", "passwd"), 7)
	if err != nil && !(errors.Is(err, os.ErrNotExist) && isNumber(name)) {
		return account{}, fmt.Errorf("-user %q: %w", spec, err)
	}
	var a account
	var userName string
	u, ok := findEntry(users, name)
	if !ok && isNumber(name) {
		u, ok = findByID(users, name)
	}
	if ok {
		uid, err1 := strconv.ParseUint(u[2], 10, 32)
		gid, err2 := strconv.ParseUint(u[3], 10, 32)
		if err1 != nil || err2 != nil {
			return account{}, fmt.Errorf("-user %q: bad passwd entry %q", spec, strings.Join(u, ":"))
		}
		a.uid, a.gid, a.home, userName = uint32(uid), uint32(gid), u[5], u[0]
	} else if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		a.uid = uint32(n)
	} else {
		return account{}, fmt.Errorf("-user %q: no user %q in the environment's /etc/passwd", spec, name)
	}
	if a.uid == 0 {
		return account{}, fmt.Errorf("-user %q is root: leave -user out to run the app as root (it has no capability either way)", spec)
	}
	groups, err := readIDFile(filepath.Join(root, "etc", "group"), 4)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return account{}, fmt.Errorf("-user %q: %w", spec, err)
	}
	if group != "" {
		if g, ok := findEntry(groups, group); ok {
			gid, err := strconv.ParseUint(g[2], 10, 32)
			if err != nil {
				return account{}, fmt.Errorf("-user %q: bad group entry %q", spec, strings.Join(g, ":"))
			}
			a.gid = uint32(gid)
		} else if n, err := strconv.ParseUint(group, 10, 32); err == nil {
			a.gid = uint32(n)
		} else {
			return account{}, fmt.Errorf("-user %q: no group %q in the environment's /etc/group", spec, group)
		}
	}
	a.groups = []uint32{a.gid}
	if userName != "" && group == "" {
		for _, g := range groups {
			gid, err := strconv.ParseUint(g[2], 10, 32)
			if err != nil || uint32(gid) == a.gid {
				continue
			}
			for _, m := range strings.Split(g[3], ",") {
				if m == userName {
					a.groups = append(a.groups, uint32(gid))
					break
				}
			}
		}
	}
	return a, nil
}

// readIDFile reads a passwd- or group-style file: one entry per line,
// fields separated by ':', at least minFields of them.
func readIDFile(path string, minFields int) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if fields := strings.Split(line, ":"); len(fields) >= minFields {
			out = append(out, fields)
		}
	}
	return out, sc.Err()
}

// findEntry returns the entry whose name is key.
func findEntry(entries [][]string, key string) ([]string, bool) {
	for _, e := range entries {
		if e[0] == key {
			return e, true
		}
	}
	return nil, false
}

// findByID returns the first entry whose id (third field) is id.
func findByID(entries [][]string, id string) ([]string, bool) {
	for _, e := range entries {
		if e[2] == id {
			return e, true
		}
	}
	return nil, false
}

func isNumber(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil
}

// withHome returns env with HOME set to home (when home is not "").
func withHome(env []string, home string) []string {
	if home == "" {
		return env
	}
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "HOME=") {
			out = append(out, kv)
		}
	}
	return append(out, "HOME="+home)
}

// openDir creates dir (and its parents) and makes it writable by everyone.
func openDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Chmod(dir, 0o777)
}

// shareOutput lets every user write to the container's stdout and stderr
// pipes, which Docker creates for root with mode 0600. An app that reopens
// them by path (/dev/stderr, /proc/self/fd/2) as another user is refused
// otherwise, and so is DMTCP, which logs to JALIB_STDERR_PATH=/dev/stderr.
// Docker's runc chowns them to a container's user; this process may not
// chown (no CAP_CHOWN), but as their owner it may add write permission.
func shareOutput(files ...*os.File) {
	for _, f := range files {
		st, err := f.Stat()
		if err != nil || st.Mode()&os.ModeNamedPipe == 0 {
			continue
		}
		_ = f.Chmod(st.Mode().Perm() | 0o022)
	}
}

// becomeUser makes this process (every thread) user of the root it runs
// in, with no capability left: CAP_SETUID and CAP_SETGID leave the
// bounding set first, every other capability goes, and the switch away
// from uid 0 clears the last two.
func becomeUser(user string) (account, error) {
	acct, err := lookupUser("/", user)
	if err != nil {
		return acct, err
	}
	if err := dropBounding(capSetuid, capSetgid); err != nil {
		return acct, err
	}
	if err := dropCaps(allCapsBut(true)...); err != nil {
		return acct, err
	}
	groups := make([]int, len(acct.groups))
	for i, g := range acct.groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return acct, fmt.Errorf("-user %q: setgroups: %w (the container needs CAP_SETGID)", user, err)
	}
	if err := syscall.Setresgid(int(acct.gid), int(acct.gid), int(acct.gid)); err != nil {
		return acct, fmt.Errorf("-user %q: setresgid: %w (the container needs CAP_SETGID)", user, err)
	}
	if err := syscall.Setresuid(int(acct.uid), int(acct.uid), int(acct.uid)); err != nil {
		return acct, fmt.Errorf("-user %q: setresuid: %w (the container needs CAP_SETUID)", user, err)
	}
	return acct, nil
}
