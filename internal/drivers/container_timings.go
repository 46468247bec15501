// The container driver's timings: what the entrypoint reported, and when the engine's app answered.

package drivers

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/ctlfs"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

// Timings returns the entrypoint's phase timings of an instance.
func (c *Container) Timings(ctx context.Context, h Handle) ([]runtime.Timing, error) {
	if h.CtlPath != "" {
		// A slot's entrypoint writes them into its control directory too:
		// a file read, not a Docker call, on every readiness probe.
		b, err := ctlfs.Dir(h.CtlPath).ReadFile(instancectl.Timings)
		if err == nil {
			return runtime.ParseTimings(string(b)), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		// An image older than the timings file: its logs.
	}
	logs, err := c.RT.Logs(ctx, h.Ref, 0)
	if err != nil {
		return nil, err
	}
	return runtime.ParseTimings(logs), nil
}

// EngineReady returns the entrypoint's own time to ready (timing phase)
// of an instance of app, or 0 when the entrypoint does not probe it. The
// entrypoint probes from inside the container while the deployer probes
// from outside, so its line may come a moment after the deployer saw the
// app ready: it is awaited for up to a second.
func (c *Container) EngineReady(ctx context.Context, h Handle, app spec.App, phase string) float64 {
	if !probedInside(app.Ready) {
		return 0
	}
	deadline := time.Now().Add(time.Second)
	for {
		tm, err := c.Timings(ctx, h)
		if err != nil {
			return 0
		}
		for _, t := range tm {
			if t.Phase == phase {
				return t.MS
			}
		}
		if time.Now().After(deadline) {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(20 * time.Millisecond):
		}
	}
}
