package mapper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// nbdBackend maps through the rbd-nbd daemon and the nbd kernel module:
//
//	rbd-nbd map POOL/IMAGE[@SNAP] -c CONF --id ID --keyring K [--read-only]   → /dev/nbdN
//	rbd-nbd unmap /dev/nbdN
//
// Before unmapping, `rbd-nbd list-mapped --format json` must still show
// the recorded image on that device. rbd-nbd daemonises itself, so the
// mapping survives the calling process.
type nbdBackend struct {
	cfg Config
	run runner
	log *slog.Logger
}

func (b *nbdBackend) Name() string { return BackendNBD }

// Probe needs rbd-nbd and the nbd module (/sys/module/nbd or /dev/nbd0).
func (b *nbdBackend) Probe(ctx context.Context) error {
	if err := needTools("rbd-nbd"); err != nil {
		return err
	}
	if fileExists("/sys/module/nbd") || fileExists("/dev/nbd0") {
		return nil
	}
	return errors.New("no nbd kernel module (/sys/module/nbd and /dev/nbd0 are missing)")
}

func (b *nbdBackend) Attach(ctx context.Context, img Image, rec *Record, save func() error) (string, error) {
	rec.Spec = img.String()
	if err := save(); err != nil {
		return "", err
	}
	args := append([]string{"map", rec.Spec}, b.cfg.cephArgs()...)
	if rec.ReadOnly {
		args = append(args, "--read-only")
	}
	out, err := b.run.run(ctx, nil, "rbd-nbd", args...)
	if err != nil {
		return "", classifyRBD("map "+img.String(), err)
	}
	dev := strings.TrimSpace(lastLines(out, 1))
	if !strings.HasPrefix(dev, "/dev/nbd") {
		return "", fmt.Errorf("map %s: rbd-nbd map printed %q, not a /dev/nbdN device", img, dev)
	}
	rec.Device = dev
	return dev, save()
}

// nbdMapped is one entry of `rbd-nbd list-mapped --format json`.
type nbdMapped struct {
	PID    int    `json:"id"`
	Pool   string `json:"pool"`
	Image  string `json:"image"`
	Snap   string `json:"snap"`
	Device string `json:"device"`
}

func (b *nbdBackend) Detach(ctx context.Context, rec Record) error {
	if rec.Device == "" {
		if rec.Spec != "" {
			b.log.Warn("mapping was interrupted before its nbd device was recorded; check `rbd-nbd list-mapped`", "id", rec.ID, "spec", rec.Spec)
		}
		return nil
	}
	out, err := b.run.run(ctx, nil, "rbd-nbd", "list-mapped", "--format", "json")
	if err != nil {
		return fmt.Errorf("release %s (%s): %w", rec.ID, rec.Image, err)
	}
	var mapped []nbdMapped
	if err := json.Unmarshal([]byte(out), &mapped); err != nil {
		return fmt.Errorf("release %s: parse rbd-nbd list-mapped: %w", rec.ID, err)
	}
	snap := rec.Image.Snap
	if snap == "" {
		snap = "-"
	}
	for _, e := range mapped {
		if e.Device != rec.Device {
			continue
		}
		if e.Pool != rec.Image.Pool || e.Image != rec.Image.Name || (e.Snap != snap && e.Snap != rec.Image.Snap) {
			b.log.Warn("nbd device now maps another image; leaving it alone", "id", rec.ID, "device", rec.Device,
				"found", e.Pool+"/"+e.Image+"@"+e.Snap, "want", rec.Image.String())
			return nil
		}
		if _, err := b.run.run(ctx, nil, "rbd-nbd", "unmap", rec.Device); err != nil {
			return classifyRBD(fmt.Sprintf("release %s: unmap %s (%s)", rec.ID, rec.Device, rec.Image), err)
		}
		return nil
	}
	return nil // already unmapped
}
