package spec

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// MaxIDLen bounds deployment IDs.
const MaxIDLen = 40

// NewID returns a fresh deployment ID for app.
func NewID(app string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	if len(app) > MaxIDLen-9 {
		app = strings.TrimRight(app[:MaxIDLen-9], "-._")
	}
	return app + "-" + hex.EncodeToString(b)
}

// ValidateID checks a deployment ID.
func ValidateID(id string) error {
	if err := layering.ValidateName("deployment id", id); err != nil {
		return fmt.Errorf("%w: %w", err, ErrInvalidSpec)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("deployment id %q is longer than %d characters: %w", id, MaxIDLen, ErrInvalidSpec)
	}
	return nil
}
