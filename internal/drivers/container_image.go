// The Container driver's images: which DMTCP image runs instances (the one named, or the newest
// labelled as one), what its labels say (DMTCP's version and oldest glibc, CRIU's version, the
// engines it recycles), whether criu can run in it, and the boot image.

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
)

// criuCheck is the outcome of a criu check container for an image: a
// pass holds, a failure is tried again after criuRecheck.
type criuCheck struct {
	ref string
	err error
	at  time.Time
}

// criuRecheck is how long a failed criu check stands before a Check runs
// it again.
const criuRecheck = time.Minute

// checkRole is the io.fogdeploy.role label of a check container; one
// older than staleCheck is what a killed process left.
const (
	checkRole  = "dmtcp-check"
	staleCheck = 2 * time.Minute
)

// dmtcpImage is the DMTCP image that Check found.
type dmtcpImage struct {
	ref, version, glibc string
	criu                string // CRIU's version, "" if the image has none
	recycle             string // RecycleLabel: the engines its entrypoint's -recycle serves
	sourceLater         bool   // SourceLaterLabel: its entrypoint takes -source-later
	rootLater           bool   // RootLaterLabel: its entrypoint takes -root-later
	spare               bool   // SpareLabel: its entrypoint has the spare mode
}

// recycles says whether the image's entrypoint serves instance after
// instance of engine eng.
func (im dmtcpImage) recycles(eng engine.Name) bool {
	if im.recycle == "1" {
		return eng == engine.NameDMTCP
	}
	for e := range strings.SplitSeq(im.recycle, ",") {
		if engine.Name(strings.TrimSpace(e)) == eng {
			return true
		}
	}
	return false
}

// Check implements Driver: the engine must be DMTCP and a DMTCP image
// present (Image, or the newest image labelled as one).
func (c *Container) Check(ctx context.Context, eng engine.Name) (string, error) {
	if eng != engine.NameDMTCP && eng != engine.NameCRIU {
		return "", fmt.Errorf("%w: the container driver runs the dmtcp and criu engines, not %q", ErrDriver, eng)
	}
	img, err := c.findImage(ctx)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	c.found = img
	c.mu.Unlock()
	if eng == engine.NameDMTCP {
		return img.version, nil
	}
	if img.criu == "" {
		return "", hint.With(fmt.Errorf("%w: image %s carries no CRIU (no label %s)", ErrDriver, img.ref, CRIUVersionLabel),
			"install CRIU (make engines) and rebuild the image with `make dmtcp-image`, or set agent.drivers: {criu: host} (for apps marked trusted only)")
	}
	if err := c.checkCRIU(ctx, img.ref); err != nil {
		return "", err
	}
	return img.criu, nil
}

// checkCRIU runs `entrypoint check -engine criu` in a container with a
// CRIU instance's capabilities, once per image if it passes: criu check
// must pass there, on this node's kernel, before a CRIU app is deployed
// in one. A failure stands for criuRecheck.
func (c *Container) checkCRIU(ctx context.Context, ref string) error {
	c.criuMu.Lock()
	defer c.criuMu.Unlock()
	if last := c.criu; last.ref == ref && (last.err == nil || time.Since(last.at) < criuRecheck) {
		return last.err
	}
	err := c.runCRIUCheck(ctx, ref)
	if ctx.Err() == nil {
		c.criu = criuCheck{ref: ref, err: err, at: time.Now()}
	}
	return err
}

// runCRIUCheck runs one check container and removes it, and any that a
// killed process left.
func (c *Container) runCRIUCheck(ctx context.Context, ref string) (err error) {
	if sts, err := c.RT.List(ctx, map[string]string{"io.fogdeploy.role": checkRole}); err == nil {
		for _, st := range sts {
			if !st.StartedAt.IsZero() && time.Since(st.StartedAt) > staleCheck {
				_ = c.RT.Remove(ctx, st.ID)
			}
		}
	}
	spec := runtime.DMTCPContainer{Image: ref, Name: "fd-criucheck-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		App: "criu-check", Deployment: "criu-check", Engine: engine.NameCRIU}.Check()
	id, err := c.RT.Create(ctx, spec)
	if err != nil {
		return fmt.Errorf("%w: criu check container: %w", ErrDriver, err)
	}
	defer func() {
		if rerr := c.RT.Remove(context.WithoutCancel(ctx), id); rerr != nil && err == nil {
			err = fmt.Errorf("%w: remove the criu check container: %w", ErrDriver, rerr)
		}
	}()
	if err := c.RT.Start(ctx, id); err != nil {
		return fmt.Errorf("%w: criu check container: %w", ErrDriver, err)
	}
	code, err := c.RT.Wait(ctx, id)
	if err != nil {
		return fmt.Errorf("%w: criu check container: %w", ErrDriver, err)
	}
	if code != 0 {
		logs, _ := c.RT.Logs(context.WithoutCancel(ctx), id, 20)
		return hint.With(engine.WithOutput(fmt.Errorf("%w: criu check failed in the container (exit %d)", ErrDriver, code),
			"the check container", lastLines(logs, 10)),
			"CRIU 4.x needs a kernel with its features; run `criu check` on the node, or set agent.drivers: {criu: host} (for apps marked trusted only)")
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
			criu: im.Labels[CRIUVersionLabel], recycle: im.Labels[RecycleLabel], sourceLater: im.Labels[SourceLaterLabel] == "1",
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
	return dmtcpImage{ref: c.Image, version: v, glibc: labels[DMTCPGlibcLabel], criu: labels[CRIUVersionLabel],
		recycle: labels[RecycleLabel], sourceLater: labels[SourceLaterLabel] == "1", rootLater: labels[RootLaterLabel] == "1",
		spare: labels[SpareLabel] == "1"}, nil
}

// image returns the DMTCP image to run: the one Check found last, else
// the one it finds now.
func (c *Container) image(ctx context.Context) (dmtcpImage, error) {
	c.mu.Lock()
	found := c.found
	c.mu.Unlock()
	if found.ref != "" {
		return found, nil
	}
	if _, err := c.Check(ctx, engine.NameDMTCP); err != nil {
		return dmtcpImage{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.found, nil
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
