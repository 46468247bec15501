package mapper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"time"
)

// runner runs external commands, each bounded by timeout, and returns
// their stdout. A failure carries the command line and its stderr.
type runner struct {
	log     *slog.Logger
	timeout time.Duration
}

// cmdError is a failed command with its stderr, kept so that backends can
// classify failures at the edge (see classify in each backend).
type cmdError struct {
	cmd    string
	err    error
	stderr string
}

func (e *cmdError) Error() string {
	if e.stderr == "" {
		return fmt.Sprintf("%s: %v", e.cmd, e.err)
	}
	return fmt.Sprintf("%s: %v: %s", e.cmd, e.err, e.stderr)
}

func (e *cmdError) Unwrap() error { return e.err }

// exitCode returns the exit status of a failed command, or -1.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// stderrOf returns the captured stderr of a failed command, or "".
func stderrOf(err error) string {
	var ce *cmdError
	if errors.As(err, &ce) {
		return ce.stderr
	}
	return ""
}

func (r runner) run(ctx context.Context, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = env
	}
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	line := strings.Join(append([]string{name}, args...), " ")
	r.log.Debug("exec", "cmd", line, "ms", time.Since(start).Milliseconds(), "err", err)
	if err != nil {
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w after %s", ctx.Err(), r.timeout)
		}
		return stdout.String(), &cmdError{cmd: line, err: err, stderr: lastLines(stderr.String(), 5)}
	}
	return stdout.String(), nil
}

// lastLines returns the last n non-empty lines of s, joined by "; ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

var lookPath = exec.LookPath
