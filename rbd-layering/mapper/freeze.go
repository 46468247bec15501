// A mounted filesystem frozen and thawed around a snapshot.

package mapper

import (
	"context"
	"fmt"
	"log/slog"
)

// Freeze runs `fsfreeze -f TARGET`: writes to the filesystem mounted at
// target block until Thaw, so that a snapshot of the image is consistent.
func Freeze(ctx context.Context, target string) error {
	_, err := runner{log: slog.New(slog.DiscardHandler), timeout: DefaultTimeout}.run(ctx, nil, "fsfreeze", "-f", target)
	if err != nil {
		return fmt.Errorf("freeze %s: %w", target, err)
	}
	return nil
}

// Thaw runs `fsfreeze -u TARGET`, undoing Freeze.
func Thaw(ctx context.Context, target string) error {
	_, err := runner{log: slog.New(slog.DiscardHandler), timeout: DefaultTimeout}.run(ctx, nil, "fsfreeze", "-u", target)
	if err != nil {
		return fmt.Errorf("thaw %s: %w", target, err)
	}
	return nil
}
