// Diagnosis: a failed step's cause (Ceph, a full state directory) first, with its hint, for
// status.error and status.hint.

package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// hintOf returns the hint an error carries, of either kind.
func hintOf(err error) string {
	if h := hint.Of(err); h != "" {
		return h
	}
	return hint.Of(err)
}

// explain adds to a failure what the cluster or the node says about it:
// why Ceph did not serve I/O (a full pool, OSDs down) when a mapping
// stalled or an operation timed out, or that the node's state directory is
// full. The cause comes first, with its hint.
func (a *agent) explain(ctx context.Context, err error) error {
	if errors.Is(err, syscall.ENOSPC) && !errors.Is(err, layering.ErrFull) {
		return hint.With(fmt.Errorf("node %s: its state directory is full: %w", a.c.Node.Name, err),
			fmt.Sprintf("free space in %s (`df -h %s`), then deploy again", a.c.Node.StateDir, a.c.Node.StateDir))
	}
	if !errors.Is(err, mapper.ErrStalled) && !errors.Is(err, layering.ErrUnavailable) && !errors.Is(err, layering.ErrFull) {
		return err
	}
	var why error
	if d, ok := a.store.(layering.Diagnoser); ok {
		why = d.Diagnose(ctx)
	}
	first, _, _ := strings.Cut(err.Error(), "\n")
	switch {
	case why != nil && !strings.Contains(first, why.Error()): // not said yet, or only of the undo
		return fmt.Errorf("ceph: %w; %w", why, err)
	case hintOf(err) != "":
		return err
	}
	return hint.With(fmt.Errorf("ceph: the deployment's images were not served in time; %w", err),
		"`ceph -s` and `ceph health detail` say why; deploy again once the cluster answers")
}

// failedStep names the step that follows the last phase passed, or "".
func failedStep(passed layering.Timings) string {
	if len(passed) == 0 {
		return ""
	}
	// The stages' steps in order (docs/design.md); after ready comes bind,
	// or post_restore, whose error says itself which it was.
	steps := []deploy.Step{deploy.StepClone, deploy.StepMap, deploy.StepMount, deploy.StepContainer, deploy.StepStart, deploy.StepReady}
	last, booting := spec.CutBootTiming(passed[len(passed)-1].Name)
	switch last {
	case string(deploy.StepReady), "prepare":
		if booting {
			return spec.BootTiming("checkpoint")
		}
		return ""
	case "checkpoint":
		return spec.BootTiming("seal") // only a first deploy checkpoints
	case "seal":
		return string(deploy.StepClone) // the restore that follows
	}
	i := slices.Index(steps, deploy.Step(last))
	if i < 0 || i+1 == len(steps) {
		return ""
	}
	next := string(steps[i+1])
	if booting {
		return spec.BootTiming(next)
	}
	return next
}
