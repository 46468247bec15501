package mapper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// fileBackend attaches a local file to a loop device:
// `losetup --find --show [--read-only] FILE`, undone with `losetup -d`.
// Config.FilePath resolves an Image (snapshots included) to the file. It
// backs the unit tests and fakes; Backend "auto" never picks it.
//
// A loop device is recorded before it exists only by its backing file, and
// several mappings may share one file, so after a crash between losetup and
// the record update the loop device is not guessed: it is logged instead.
type fileBackend struct {
	cfg Config
	run runner
	log *slog.Logger
}

func (b *fileBackend) Name() string { return BackendFile }

func (b *fileBackend) Probe(ctx context.Context) error {
	if b.cfg.FilePath == nil {
		return errors.New("Config.FilePath is not set")
	}
	if err := needTools("losetup"); err != nil {
		return err
	}
	if !fileExists("/dev/loop-control") {
		return errors.New("/dev/loop-control is missing (no loop driver)")
	}
	return nil
}

func (b *fileBackend) Attach(ctx context.Context, img Image, rec *Record, save func() error) (string, error) {
	p, err := b.cfg.FilePath(img)
	if err == nil {
		p, err = filepath.Abs(p)
	}
	if err == nil {
		p, err = filepath.EvalSymlinks(p) // backing_file shows the resolved path
	}
	if err == nil {
		var st os.FileInfo
		if st, err = os.Stat(p); err == nil && !st.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a regular file", p)
		}
	}
	if err != nil {
		if isNotExist(err) {
			return "", fmt.Errorf("map %s: %w: %w (hint: create it first)", img, ErrImageNotFound, err)
		}
		return "", fmt.Errorf("map %s: resolve file: %w", img, err)
	}
	rec.LoopBacking = p
	if err := save(); err != nil {
		return "", err
	}
	dev, err := b.run.loopAttach(ctx, p, rec.ReadOnly)
	if err != nil {
		return "", fmt.Errorf("map %s: attach loop device: %w", img, err)
	}
	rec.LoopDev = dev
	return dev, save()
}

func (b *fileBackend) Detach(ctx context.Context, rec Record) error {
	if rec.LoopDev == "" {
		if rec.LoopBacking != "" {
			if devs := loopsBacking(rec.LoopBacking); len(devs) > 0 {
				b.log.Warn("mapping was interrupted before its loop device was recorded; not detaching loop devices of a shared file",
					"id", rec.ID, "file", rec.LoopBacking, "candidates", devs)
			}
		}
		return nil
	}
	if err := b.run.loopDetach(ctx, rec.LoopDev, rec.LoopBacking); err != nil {
		return fmt.Errorf("release %s (%s): detach %s: %w", rec.ID, rec.Image, rec.LoopDev, err)
	}
	return nil
}
