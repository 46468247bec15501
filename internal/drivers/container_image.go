// The Container driver's images: which DMTCP image runs instances (the one named, or the newest
// labelled as one), what its labels say (DMTCP's version and oldest glibc, CRIU's version, the
// engines it recycles), whether each engine's kernel check passes in it,
// and the boot image.

package drivers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// kernelCheck is the outcome of an engine's check container for an
// image: a pass holds, a failure is tried again after kernelRecheck.
type kernelCheck struct {
	ref string
	err error
	at  time.Time
}

// kernelRecheck is how long a failed kernel check stands before a Check runs
// it again.
const kernelRecheck = time.Minute

// checkRole is the io.fogdeploy.role label of a check container; one
// older than staleCheck is what a killed process left.
const (
	checkRole  = "dmtcp-check"
	staleCheck = 2 * time.Minute
)

// dmtcpImage is the DMTCP image that Check found.
type dmtcpImage struct {
	ref, version, glibc string
	// engines are the versions of the engines the image carries, by name
	// (engine.ImageLabel): DMTCP's, and CRIU's where it was installed at
	// the image's build.
	engines     map[engine.Name]string
	recycle     string // RecycleLabel: the engines its entrypoint's -recycle serves
	sourceLater bool   // SourceLaterLabel: its entrypoint takes -source-later
	rootLater   bool   // RootLaterLabel: its entrypoint takes -root-later
	spare       bool   // SpareLabel: its entrypoint has the spare mode
}

// recycles says whether the image's entrypoint serves instance after
// instance of engine eng.
func (im dmtcpImage) recycles(eng engine.Name) bool {
	if im.recycle == "1" { // an image of before the list: the default engine only
		return eng == engine.Default()
	}
	for e := range strings.SplitSeq(im.recycle, ",") {
		if engine.Name(strings.TrimSpace(e)) == eng {
			return true
		}
	}
	return false
}

// Check implements Driver: the light container image (Image, or the
// newest image labelled as one) must carry engine eng, and pass the
// engine's check of the kernel in a container where it has one
// (engine.Facts.KernelCheck).
func (c *Container) Check(ctx context.Context, eng engine.Name) (string, error) {
	if _, ok := engine.Lookup(eng); !ok {
		return "", fmt.Errorf("%w: the container driver runs the %s engines, not %q", ErrDriver, engine.List(engine.Names()), eng)
	}
	img, err := c.findImage(ctx)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	c.found = img
	c.mu.Unlock()
	v := img.engines[eng]
	if v == "" {
		return "", hint.With(fmt.Errorf("%w: image %s carries no %s (no label %s)", ErrDriver, img.ref, eng, engine.ImageLabel(eng)),
			"install it (make engines) and rebuild the image with `make dmtcp-image`, or set agent.drivers: {"+string(eng)+": host} (for apps marked trusted only)")
	}
	if engine.Of(eng).KernelCheck {
		if err := c.checkKernel(ctx, img.ref, eng); err != nil {
			return "", err
		}
	}
	return v, nil
}

// checkKernel runs `entrypoint check -engine ENG` in a container with an
// instance's capabilities, once per image and engine if it passes: the
// engine's check (criu check) must pass there, on this node's kernel,
// before an app of it is deployed in one. A failure stands for
// kernelRecheck.
func (c *Container) checkKernel(ctx context.Context, ref string, eng engine.Name) error {
	c.checkMu.Lock()
	defer c.checkMu.Unlock()
	if last, ok := c.checks[eng]; ok && last.ref == ref && (last.err == nil || time.Since(last.at) < kernelRecheck) {
		return last.err
	}
	err := c.runKernelCheck(ctx, ref, eng)
	if ctx.Err() == nil {
		if c.checks == nil {
			c.checks = map[engine.Name]kernelCheck{}
		}
		c.checks[eng] = kernelCheck{ref: ref, err: err, at: time.Now()}
	}
	return err
}

// runKernelCheck runs one check container of engine eng and removes it,
// and any that a killed process left.
func (c *Container) runKernelCheck(ctx context.Context, ref string, eng engine.Name) (err error) {
	if sts, err := c.RT.List(ctx, map[string]string{"io.fogdeploy.role": checkRole}); err == nil {
		for _, st := range sts {
			if !st.StartedAt.IsZero() && time.Since(st.StartedAt) > staleCheck {
				_ = c.RT.Remove(ctx, st.ID)
			}
		}
	}
	spec := runtime.DMTCPContainer{Image: ref, Name: "fd-" + string(eng) + "check-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		App: string(eng) + "-check", Deployment: string(eng) + "-check", Engine: eng}.Check()
	id, err := c.RT.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("%w: %s check container: %w", ErrDriver, eng, err)
	}
	defer func() {
		if rerr := c.RT.Remove(context.WithoutCancel(ctx), id); rerr != nil && err == nil {
			err = fmt.Errorf("%w: remove the %s check container: %w", ErrDriver, eng, rerr)
		}
	}()
	if err := c.RT.Start(ctx, id); err != nil {
		return fmt.Errorf("%w: %s check container: %w", ErrDriver, eng, err)
	}
	code, err := c.RT.Wait(ctx, id)
	if err != nil {
		return fmt.Errorf("%w: %s check container: %w", ErrDriver, eng, err)
	}
	if code != 0 {
		logs, _ := c.RT.Logs(context.WithoutCancel(ctx), id, 20)
		return hint.With(engine.WithOutput(fmt.Errorf("%w: %s check failed in the container (exit %d)", ErrDriver, eng, code),
			"the check container", lastLines(logs, 10)),
			"the engine needs a kernel with its features (CRIU 4.x: run `criu check` on the node), or set agent.drivers: {"+string(eng)+": host} (for apps marked trusted only)")
	}
	return nil
}

// findImage finds the DMTCP image this node runs.
func (c *Container) findImage(ctx context.Context) (dmtcpImage, error) {
	const build = "build it from an installed DMTCP with `make dmtcp-image` (scripts/install-engines.sh installs DMTCP)"
	if c.Image == "" {
		ims, err := c.RT.FindImages(ctx, DMTCPVersionLabel)
		if err != nil {
			return dmtcpImage{}, fmt.Errorf("%w: %w", ErrDriver, err)
		}
		if len(ims) == 0 {
			return dmtcpImage{}, hint.With(fmt.Errorf("%w: no DMTCP image on this node (none labelled %s)", ErrDriver, DMTCPVersionLabel), build)
		}
		im := ims[0]
		return dmtcpImage{ref: im.Ref, version: im.Labels[DMTCPVersionLabel], glibc: im.Labels[DMTCPGlibcLabel],
			engines: enginesIn(im.Labels), recycle: im.Labels[RecycleLabel], sourceLater: im.Labels[SourceLaterLabel] == "1",
			rootLater: im.Labels[RootLaterLabel] == "1", spare: im.Labels[SpareLabel] == "1"}, nil
	}
	labels, err := c.RT.ImageLabels(ctx, c.Image)
	if errors.Is(err, runtime.ErrImageNotFound) {
		return dmtcpImage{}, hint.With(fmt.Errorf("%w: DMTCP image %s is not on this node: %w", ErrDriver, c.Image, err),
			build+", or leave agent.dmtcp_image empty to use the DMTCP image the node has")
	}
	if err != nil {
		return dmtcpImage{}, fmt.Errorf("%w: %w", ErrDriver, err)
	}
	v, ok := labels[DMTCPVersionLabel]
	if !ok {
		return dmtcpImage{}, hint.With(fmt.Errorf("%w: image %s is not a fogdeploy DMTCP image (no label %s)", ErrDriver, c.Image, DMTCPVersionLabel),
			build+", and set agent.dmtcp_image to its tag or leave it empty")
	}
	return dmtcpImage{ref: c.Image, version: v, glibc: labels[DMTCPGlibcLabel], engines: enginesIn(labels),
		recycle: labels[RecycleLabel], sourceLater: labels[SourceLaterLabel] == "1", rootLater: labels[RootLaterLabel] == "1",
		spare: labels[SpareLabel] == "1"}, nil
}

// enginesIn are the engines an image's labels say it carries, with
// their versions.
func enginesIn(labels map[string]string) map[engine.Name]string {
	out := map[engine.Name]string{}
	for _, eng := range engine.Names() {
		if v := labels[engine.ImageLabel(eng)]; v != "" {
			out[eng] = v
		}
	}
	return out
}

// engineOf is the engine app's instances run under: its own, or the
// default one for a spec that leaves it to the node.
func engineOf(app spec.App) engine.Name {
	if _, ok := engine.Lookup(app.Engine); ok {
		return app.Engine
	}
	return engine.Default()
}

// image returns the light container image to run: the one Check found
// last, else the one it finds now.
func (c *Container) image(ctx context.Context) (dmtcpImage, error) {
	c.mu.Lock()
	found := c.found
	c.mu.Unlock()
	if found.ref != "" {
		return found, nil
	}
	img, err := c.findImage(ctx)
	if err != nil {
		return dmtcpImage{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.found = img
	return img, nil
}

// CheckBoot reports, wrapping ErrDriver, why this node cannot boot apps
// without a checkpoint engine.
func (c *Container) CheckBoot(ctx context.Context) error {
	if c.BootImage == "" {
		return fmt.Errorf("%w: no boot image configured (agent.boot_image)", ErrDriver)
	}
	_, err := c.RT.ImageLabels(ctx, c.BootImage)
	if errors.Is(err, runtime.ErrImageNotFound) {
		return hint.With(fmt.Errorf("%w: boot image %s is not on this node: %w", ErrDriver, c.BootImage, err),
			"build it with `make boot-image` (dmtcp-image/build.sh -b)")
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrDriver, err)
	}
	return nil
}
