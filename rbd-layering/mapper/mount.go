// Mounting a mapping: its target, mount(8) under the stall guard, a blank image formatted first.

package mapper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Mount mounts a mapped device on target (created if missing) with
// `mount -t ext4 DEVICE TARGET` (`-o ro,noload` when read-only), after
// `mkfs.ext4 -E nodiscard -q DEVICE` when opts.Format is set and
// `blkid -p` finds no filesystem. On success mp.Target is set. A target
// that already is a mount point is refused with ErrBusy.
func (m *Mapper) Mount(ctx context.Context, mp *Mapping, target string, opts MountOptions) (err error) {
	if mp == nil {
		return fmt.Errorf("mount: nil mapping: %w", ErrInvalid)
	}
	unlock, err := m.lock(mp.ID)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := m.store.load(mp.ID)
	if err != nil {
		return err
	}
	if rec.Target != "" {
		return fmt.Errorf("mapping %s (%s) is already mounted at %s: %w (hint: release it first)", rec.ID, rec.Image, rec.Target, ErrBusy)
	}
	if rec.Device == "" {
		return fmt.Errorf("mapping %s (%s) has no device; its Map was interrupted: %w (hint: release it and map again)", rec.ID, rec.Image, ErrNotMapped)
	}
	fstype := opts.FSType
	if fstype == "" {
		fstype = "ext4"
	}
	ro := opts.ReadOnly || rec.ReadOnly
	if opts.Format && ro {
		return fmt.Errorf("mapping %s (%s): cannot format a read-only mount: %w", rec.ID, rec.Image, ErrInvalid)
	}
	if target, err = mountTarget(rec, target); err != nil {
		return err
	}
	dev := rec.Device
	if opts.Format {
		if err := m.guard(ctx, rec, func() error { return m.formatIfBlank(ctx, rec, dev) }); err != nil {
			return err
		}
	}
	num, err := devNum(dev)
	if err != nil {
		return fmt.Errorf("mount %s: %w", rec.Image, err)
	}
	rec.Target, rec.MountDev, rec.FSType, rec.MountRO = target, num, fstype, ro
	if err := m.store.save(rec); err != nil {
		return err
	}
	mounted := false
	defer func() {
		if err == nil {
			return
		}
		rctx, cancel := m.rollbackCtx(ctx)
		defer cancel()
		if mounted {
			if uerr := m.unmount(rctx, rec); uerr != nil {
				err = errors.Join(err, uerr)
				return
			}
		}
		rec.Target, rec.MountDev, rec.FSType, rec.MountRO, rec.Mounted = "", "", "", false, false
		if serr := m.store.save(rec); serr != nil {
			err = errors.Join(err, serr)
		}
	}()
	start := time.Now()
	if err := m.mount(ctx, rec, dev, target, fstype, ro); err != nil {
		return err
	}
	mounted = true
	rec.Mounted = true
	if err := m.store.save(rec); err != nil {
		return err
	}
	mp.Target = target
	m.log.Info("image mounted", "id", rec.ID, "image", rec.Image.String(), "device", dev, "target", target,
		"read_only", ro, "ms", time.Since(start).Milliseconds())
	return nil
}

// mountTarget makes target (absolute, links resolved) for rec's mount,
// and refuses one that is a mount point already.
func mountTarget(rec *Record, target string) (string, error) {
	if target == "" {
		return "", fmt.Errorf("mount %s: target is empty: %w", rec.Image, ErrInvalid)
	}
	target, err := filepath.Abs(target)
	if err == nil {
		if err = os.MkdirAll(target, 0o755); err == nil {
			target, err = filepath.EvalSymlinks(target)
		}
	}
	if err != nil {
		return "", fmt.Errorf("mount %s: prepare target: %w", rec.Image, err)
	}
	if ms, err := mountsAt(target); err != nil {
		return "", err
	} else if len(ms) > 0 {
		return "", fmt.Errorf("mount %s: %s is already a mount point (%s from %s): %w (hint: pick an empty directory)", rec.Image, target, ms[0].FSType, ms[0].Source, ErrBusy)
	}
	return target, nil
}

// mount runs mount(8) of dev on target, read-only (without replaying an
// ext journal) when ro, under the stall guard.
func (m *Mapper) mount(ctx context.Context, rec *Record, dev, target, fstype string, ro bool) error {
	args := []string{"-t", fstype}
	if ro {
		if fstype == "ext4" || fstype == "ext3" {
			args = append(args, "-o", "ro,noload")
		} else {
			args = append(args, "-o", "ro")
		}
	}
	err := m.guard(ctx, rec, func() error {
		_, err := m.run.run(ctx, nil, "mount", append(args, dev, target)...)
		return err
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrStalled):
		return fmt.Errorf("mount %s (%s) on %s: %w", rec.Image, dev, target, err)
	}
	hint := "check `dmesg` for the kernel's reason"
	if s := stderrOf(err); strings.Contains(s, "wrong fs type") || strings.Contains(s, "bad superblock") {
		hint = "the device may hold no " + fstype + " filesystem yet: mount with MountOptions.Format"
	}
	return fmt.Errorf("mount %s (%s) on %s: %w (hint: %s)", rec.Image, dev, target, err, hint)
}

// formatIfBlank runs mkfs.ext4 when `blkid -p -o export DEVICE` finds
// nothing (exit status 2).
func (m *Mapper) formatIfBlank(ctx context.Context, rec *Record, dev string) error {
	out, err := m.run.run(ctx, nil, "blkid", "-p", "-o", "export", dev)
	switch {
	case err == nil:
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "TYPE=") || strings.HasPrefix(l, "PTTYPE=") {
				m.log.Debug("device already holds data; not formatting", "id", rec.ID, "device", dev, "blkid", l)
				return nil
			}
		}
		return fmt.Errorf("format %s: blkid found something unknown on %s (%q); refusing to format: %w", rec.Image, dev, strings.TrimSpace(out), ErrBusy)
	case exitCode(err) == 2:
		start := time.Now()
		if _, err := m.run.run(ctx, nil, "mkfs.ext4", "-E", "nodiscard", "-q", dev); err != nil {
			return fmt.Errorf("format %s (%s): %w", rec.Image, dev, err)
		}
		m.log.Info("formatted blank image", "id", rec.ID, "image", rec.Image.String(), "device", dev, "ms", time.Since(start).Milliseconds())
		return nil
	default:
		return fmt.Errorf("format %s: probe %s: %w", rec.Image, dev, err)
	}
}
