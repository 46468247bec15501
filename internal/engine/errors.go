package engine

import (
	"errors"
	"fmt"
	"strings"
)

// Errors returned by engines. Every error wraps one of these, so callers
// branch with errors.Is; the message names the app, file or directory and
// ends with a one-line hint where there is one.
var (
	// ErrUnavailable: the engine (or something it needs: root, a binary,
	// kernel support) is missing on this machine.
	ErrUnavailable = errors.New("checkpoint engine unavailable")
	// ErrInvalid: the request itself is wrong (empty Argv, a binary that is
	// not in the root, a non-empty checkpoint directory, an image of another
	// engine, a Process of another engine).
	ErrInvalid = errors.New("invalid request")
	// ErrLaunch: the app did not start under the engine.
	ErrLaunch = errors.New("launch failed")
	// ErrCheckpoint: the engine did not write a complete image.
	ErrCheckpoint = errors.New("checkpoint failed")
	// ErrRestore: the engine could not restart the image.
	ErrRestore = errors.New("restore failed")
	// ErrNoImage: a directory holds no complete image.
	ErrNoImage = errors.New("no checkpoint image")
	// ErrExited: the process has already exited.
	ErrExited = errors.New("process has exited")
	// ErrNotReady: a readiness probe did not succeed in time.
	ErrNotReady = errors.New("app not ready")
)

// WithOutput appends the last lines of what produced them (an app, a
// tool) to err; with no lines it returns err as is.
func WithOutput(err error, what string, lines []string) error {
	if len(lines) == 0 {
		return err
	}
	return fmt.Errorf("%w\n--- last output of %s ---\n%s", err, what, strings.Join(lines, "\n"))
}
