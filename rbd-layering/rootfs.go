package layering

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// runCmd runs a command and returns its combined output in the error.
func runCmd(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLines(out, 5))
	}
	return nil
}

// lastLines returns the last n lines of out, trimmed.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// dirSize returns the apparent size of the files below dir.
func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			total += fi.Size()
		}
		return nil
	})
	return total, err
}

// makeFS writes an ext4 filesystem of size bytes holding the files of dir
// into a sparse file at out (mkfs.ext4 -d).
func makeFS(ctx context.Context, dir, out string, size int64) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	f.Close()
	err = runCmd(ctx, "mkfs.ext4", "-q", "-F", "-L", "fogenv", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0", "-d", dir, out)
	if err != nil && (strings.Contains(err.Error(), "No space left") || strings.Contains(err.Error(), "Could not allocate block")) {
		return WithHint(fmt.Errorf("the files of %s do not fit in %s: %w", dir, FormatSize(size), ErrInvalid), "pass a larger --size")
	}
	return err
}

// extractTar unpacks a tar stream into dir, keeping owners, modes and
// device nodes (GNU tar as root).
func extractTar(ctx context.Context, r io.Reader, dir string) error {
	cmd := exec.CommandContext(ctx, "tar", "-x", "-p", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", dir, "-f", "-")
	cmd.Stdin = r
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("unpack tar: %w: %s: %w", err, lastLines(out.Bytes(), 5), ErrInvalid)
	}
	return nil
}

// chrootMounts are the API filesystems a RUN step sees.
var chrootMounts = []struct{ src, dst, fstype string }{
	{"proc", "proc", "proc"},
	{"/dev", "dev", "bind"},
	{"/dev/pts", "dev/pts", "bind"},
	{"/etc/resolv.conf", "etc/resolv.conf", "bind"},
}

// withChroot mounts proc, dev and resolv.conf into root, stops packages
// from starting services (policy-rc.d), calls fn, and undoes all of it.
func withChroot(ctx context.Context, root string, fn func() error) (err error) {
	var mounted []string
	var created []string
	defer func() {
		for i := len(mounted) - 1; i >= 0; i-- {
			if uerr := syscall.Unmount(mounted[i], 0); uerr != nil {
				if uerr2 := syscall.Unmount(mounted[i], syscall.MNT_DETACH); uerr2 != nil {
					err = errors.Join(err, fmt.Errorf("unmount %s: %w", mounted[i], uerr))
				}
			}
		}
		for _, p := range created {
			_ = os.Remove(p)
		}
	}()
	policy := filepath.Join(root, "usr/sbin/policy-rc.d")
	if _, err := os.Lstat(policy); errors.Is(err, os.ErrNotExist) {
		if os.MkdirAll(filepath.Dir(policy), 0o755) == nil && os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755) == nil {
			created = append(created, policy)
		}
	}
	for _, mnt := range chrootMounts {
		dst := filepath.Join(root, mnt.dst)
		if mnt.fstype == "bind" {
			st, err := os.Stat(mnt.src)
			if err != nil {
				continue
			}
			if st.IsDir() {
				if err := os.MkdirAll(dst, 0o755); err != nil {
					return err
				}
			} else if _, err := os.Lstat(dst); errors.Is(err, os.ErrNotExist) {
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(dst, nil, 0o644); err != nil {
					return err
				}
				created = append([]string{dst}, created...)
			} else if fi, _ := os.Lstat(dst); fi != nil && fi.Mode()&os.ModeSymlink != 0 {
				continue // e.g. resolv.conf pointing into /run: leave it
			}
			if err := syscall.Mount(mnt.src, dst, "", syscall.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s into the build root: %w", mnt.src, err)
			}
		} else {
			if err := os.MkdirAll(dst, 0o555); err != nil {
				return err
			}
			if err := syscall.Mount(mnt.src, dst, mnt.fstype, 0, ""); err != nil {
				return fmt.Errorf("mount %s into the build root: %w", mnt.fstype, err)
			}
		}
		mounted = append(mounted, dst)
	}
	return fn()
}

// runInChroot runs a shell command in root with the environment's config.
// Its output goes to out; the error carries the last lines.
func runInChroot(ctx context.Context, root, command string, cfg ImageConfig, out io.Writer) error {
	wd := cfg.WorkDir
	if wd == "" {
		wd = "/"
	}
	script := fmt.Sprintf("mkdir -p %s && cd %s && %s", shellQuote(wd), shellQuote(wd), command)
	cmd := exec.CommandContext(ctx, "chroot", root, "/bin/sh", "-c", script)
	// A PID namespace of its own: when the command ends, the kernel kills
	// whatever it left running in the background (a daemon started by a
	// RUN step or by `env exec`), so the clone can be unmounted and removed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "DEBIAN_FRONTEND=noninteractive", "LANG=C.UTF-8",
	}, cfg.Env...)
	var tail tailBuffer
	w := io.MultiWriter(&tail, out)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("RUN %s: %w: %w\n%s", command, ErrBuildStep, err, tail.String())
	}
	return nil
}

// copyInto copies src (file or directory contents) to dst inside root.
func copyInto(ctx context.Context, src, root, dst string) error {
	target := filepath.Join(root, filepath.Clean("/"+dst))
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("COPY source: %w: %w", err, ErrInvalid)
	}
	if st.IsDir() {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		return runCmd(ctx, "cp", "-a", "--no-preserve=ownership", src+"/.", target+"/")
	}
	if strings.HasSuffix(dst, "/") {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		target = filepath.Join(target, filepath.Base(src))
	} else if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	return runCmd(ctx, "cp", "-a", "--no-preserve=ownership", src, target)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// ShellJoin makes a shell command line that runs argv as it is: each
// argument that the shell would split, expand or reinterpret is quoted.
// Exec and RUN steps take command lines; commands given as argument lists
// (fogctl env exec NAME -- ARGV) go through it.
func ShellJoin(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@%+,") == "" {
			parts[i] = a
		} else {
			parts[i] = shellQuote(a)
		}
	}
	return strings.Join(parts, " ")
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return lastLines(t.b, 10) }
