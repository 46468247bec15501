package layering

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// BlankPrefix starts the names of a pool's blank filesystem images.
const BlankPrefix = "fdb-"

// BlankObjectSize is the object size of a blank image and of its clones:
// small, so that a clone's first write into an object copies little of
// the blank's metadata, and a mount reads little of it.
const BlankObjectSize = 64 << 10

// blankStale is how long a blank image may stay without its sealed
// snapshot before another maker takes it for the remains of a killed one.
const blankStale = 30 * time.Second

// BlankImage is the name of the pool's blank image of size bytes.
func BlankImage(size int64) string { return BlankPrefix + strconv.FormatInt(size, 10) }

// IsBlankName reports whether name is one BlankImage gives.
func IsBlankName(name string) bool {
	n, ok := strings.CutPrefix(name, BlankPrefix)
	if !ok {
		return false
	}
	v, err := strconv.ParseInt(n, 10, 64)
	return err == nil && v > 0 && strconv.FormatInt(v, 10) == n
}

// Blank returns the sealed snapshot of the pool's blank ext4 image of size
// bytes (an empty filesystem, no reserved blocks for online growth), making
// it first if the pool has none: mkfs.ext4 into a sparse file in workDir,
// written into an image of BlankObjectSize objects without its zero blocks,
// and sealed. A clone of it is a writable filesystem whose writes copy next
// to nothing from the cluster, unlike a clone of a full environment, where
// every object first written is read whole.
//
// Every node of a pool shares one blank image per size; concurrent callers
// wait for the one that makes it (until ctx ends), and remains that a killed
// maker left are removed after blankStale (30 s).
func Blank(ctx context.Context, st Store, size int64, workDir string) (SnapRef, error) {
	if size <= 0 {
		return SnapRef{}, fmt.Errorf("blank image of %d bytes: %w", size, ErrInvalid)
	}
	ref := SnapRef{Image: BlankImage(size), Snap: SealedSnap}
	for {
		info, err := st.Stat(ctx, ref.Image)
		switch {
		case err == nil && sealed(info):
			return ref, nil
		case err == nil && time.Since(info.Created) > blankStale:
			if _, err := st.RemoveUnmapped(ctx, ref.Image); err != nil && !errors.Is(err, ErrNotFound) {
				return SnapRef{}, fmt.Errorf("remove the unfinished blank image %s: %w", ref.Image, err)
			}
			continue
		case err == nil:
			// Another maker is at it.
		case errors.Is(err, ErrNotFound):
			err := makeBlank(ctx, st, ref, size, workDir)
			if err == nil {
				return ref, nil
			}
			if !errors.Is(err, ErrExists) {
				return SnapRef{}, err
			}
		default:
			return SnapRef{}, err
		}
		select {
		case <-ctx.Done():
			return SnapRef{}, fmt.Errorf("wait for the blank image %s: %w", ref.Image, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func sealed(info ImageInfo) bool {
	s, ok := info.Snapshot(SealedSnap)
	return ok && s.Protected
}

// makeBlank makes ref's image; ErrExists if another maker created it first.
func makeBlank(ctx context.Context, st Store, ref SnapRef, size int64, workDir string) (err error) {
	dir, err := os.MkdirTemp(workDir, "blank-")
	if err != nil {
		return fmt.Errorf("blank image: %w", err)
	}
	defer os.RemoveAll(dir)
	file := dir + "/fs.img"
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("blank image: %w", err)
	}
	// The inode tables are zeroed here (skipped below as zeros), so that
	// no mount zeroes them in the clone; the journal reads as zeros on a
	// thin image without being written.
	if err := runCmd(ctx, "mkfs.ext4", "-q", "-F", "-L", "fogblank", "-O", "^resize_inode",
		"-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=1,root_owner=0:0", file); err != nil {
		return fmt.Errorf("blank image: %w", err)
	}
	if err := st.Create(ctx, ref.Image, size, WithObjectSize(BlankObjectSize)); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_, _ = st.RemoveUnmapped(context.WithoutCancel(ctx), ref.Image)
		}
	}()
	src, err := os.Open(file)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := st.Write(ctx, ref.Image, src, size); err != nil {
		return err
	}
	return st.Snapshot(ctx, ref)
}
