package layering

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/hint"
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
		return hint.With(fmt.Errorf("the files of %s do not fit in %s: %w", dir, FormatSize(size), ErrInvalid), "pass a larger --size")
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
