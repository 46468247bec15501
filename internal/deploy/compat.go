// Compatibility: what a checkpoint generation needs of the node that
// restores it (its engine at the same version, the architecture, the CPU
// features the checkpointed process may use), and the node's own platform.
// A node that cannot restore a generation boots the app instead, saying why.

package deploy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// ErrIncompatible: this node cannot restore a generation (another engine
// version, architecture or missing CPU features); the error says which.
var ErrIncompatible = errors.New("generation cannot be restored on this node")

// restorableOn reports, wrapping ErrIncompatible, why generation g cannot
// be restored on a node with platform p whose engine g.Engine is at
// version engineVersion. Generations that recorded no platform are only
// checked for the engine version.
func restorableOn(g spec.Generation, p spec.Platform, engineVersion string) error {
	if g.EngineVersion != "" && engineVersion != "" && g.EngineVersion != engineVersion {
		return fmt.Errorf("%w: generation %d was checkpointed by %s %s, this node has %s %s",
			ErrIncompatible, g.Gen, g.Engine, g.EngineVersion, g.Engine, engineVersion)
	}
	if g.Platform == nil {
		return nil
	}
	if g.Platform.Arch != "" && g.Platform.Arch != p.Arch {
		return fmt.Errorf("%w: generation %d was checkpointed on %s, this node is %s", ErrIncompatible, g.Gen, g.Platform.Arch, p.Arch)
	}
	var missing []string
	for _, f := range g.Platform.CPUFlags {
		if _, found := slices.BinarySearch(p.CPUFlags, f); !found {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		shown := missing
		if len(shown) > 6 {
			shown = append(shown[:6:6], fmt.Sprintf("and %d more", len(missing)-6))
		}
		return fmt.Errorf("%w: generation %d needs CPU features this node lacks (%s)", ErrIncompatible, g.Gen, strings.Join(shown, ", "))
	}
	return nil
}
