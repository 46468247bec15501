package deploytest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/ksm"
)

// ScannerOn turns the node's same-page merging on with settings s, as an
// agent with agent.memory_merge does, and puts the scanner's settings back
// after t. A kernel without the scanner is ksm.ErrUnavailable.
func ScannerOn(t testing.TB, s ksm.Settings) (ksm.Node, error) {
	t.Helper()
	n := ksm.Node{}
	names := []string{"pages_to_scan", "smart_scan", "run"}
	saved := map[string][]byte{}
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(ksm.DefaultDir, name))
		if err != nil {
			return n, fmt.Errorf("%w: %w", ksm.ErrUnavailable, err)
		}
		saved[name] = b
	}
	t.Cleanup(func() {
		for _, name := range names {
			_ = os.WriteFile(filepath.Join(ksm.DefaultDir, name), saved[name], 0o644)
		}
	})
	return n, n.Enable(s)
}
