package mapper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// krbdBackend maps with the kernel RBD client:
//
//	rbd device map POOL/IMAGE[@SNAP] -c CONF --id ID --keyring K [--read-only]   → /dev/rbdN
//	rbd device unmap /dev/rbdN -c CONF --id ID --keyring K
//
// Before unmapping, /sys/bus/rbd/devices/N/{pool,name,current_snap} must
// still name the recorded image. The kernel keeps the mapping when the
// calling process dies.
type krbdBackend struct {
	cfg Config
	run runner
	log *slog.Logger
}

func (b *krbdBackend) Name() string { return BackendKRBD }

// Probe needs the rbd CLI and /sys/bus/rbd, loading the module with
// `modprobe rbd` if needed.
func (b *krbdBackend) Probe(ctx context.Context) error {
	if err := needTools("rbd"); err != nil {
		return err
	}
	if fileExists("/sys/bus/rbd") {
		return nil
	}
	_, err := b.run.run(ctx, nil, "modprobe", "rbd")
	if err == nil && fileExists("/sys/bus/rbd") {
		return nil
	}
	if err == nil {
		err = errors.New("/sys/bus/rbd still missing")
	}
	return fmt.Errorf("no rbd kernel module (/sys/bus/rbd is missing; %v)", err)
}

func (b *krbdBackend) Attach(ctx context.Context, img Image, rec *Record, save func() error) (string, error) {
	rec.Spec = img.String()
	if err := save(); err != nil {
		return "", err
	}
	args := append([]string{"device", "map", rec.Spec}, b.cfg.cephArgs()...)
	if rec.ReadOnly {
		args = append(args, "--read-only")
	}
	out, err := b.run.run(ctx, nil, "rbd", args...)
	if err != nil {
		return "", classifyRBD("map "+img.String(), err)
	}
	dev := strings.TrimSpace(lastLines(out, 1))
	if !strings.HasPrefix(dev, "/dev/rbd") {
		return "", fmt.Errorf("map %s: rbd device map printed %q, not a /dev/rbdN device", img, dev)
	}
	rec.Device = dev
	return dev, save()
}

func (b *krbdBackend) Detach(ctx context.Context, rec Record) error {
	if rec.Device == "" {
		if rec.Spec != "" {
			b.log.Warn("mapping was interrupted before its rbd device was recorded; check `rbd device list`", "id", rec.ID, "spec", rec.Spec)
		}
		return nil
	}
	sys := filepath.Join("/sys/bus/rbd/devices", strings.TrimPrefix(filepath.Base(rec.Device), "rbd"))
	if !fileExists(sys) {
		return nil // already unmapped
	}
	read := func(f string) string {
		v, _ := os.ReadFile(filepath.Join(sys, f))
		return strings.TrimSpace(string(v))
	}
	snap := rec.Image.Snap
	if snap == "" {
		snap = "-"
	}
	if read("pool") != rec.Image.Pool || read("name") != rec.Image.Name || read("current_snap") != snap {
		b.log.Warn("rbd device now maps another image; leaving it alone", "id", rec.ID, "device", rec.Device,
			"found", read("pool")+"/"+read("name")+"@"+read("current_snap"), "want", rec.Image.String())
		return nil
	}
	args := append([]string{"device", "unmap", rec.Device}, b.cfg.cephArgs()...)
	if _, err := b.run.run(ctx, nil, "rbd", args...); err != nil {
		if !fileExists(sys) {
			return nil
		}
		return classifyRBD(fmt.Sprintf("release %s: unmap %s (%s)", rec.ID, rec.Device, rec.Image), err)
	}
	return nil
}

// classifyRBD maps the errno text that the rbd and rbd-nbd CLIs print
// onto this package's sentinels.
func classifyRBD(what string, err error) error {
	s := stderrOf(err)
	switch {
	case strings.Contains(s, "No such file or directory"):
		return fmt.Errorf("%s: %w: %w (hint: `rbd ls POOL` and `rbd snap ls POOL/IMAGE` list what exists)", what, ErrImageNotFound, err)
	case strings.Contains(s, "Device or resource busy"):
		return fmt.Errorf("%s: %w: %w", what, ErrBusy, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
