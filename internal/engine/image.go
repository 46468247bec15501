package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/fogdeploy/fogdeploy/internal/atomicfile"
	"github.com/fogdeploy/fogdeploy/internal/ctlfs"
	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// ManifestName is the file Checkpoint writes last into an image directory.
// Its presence marks the image complete.
const ManifestName = "fogdeploy-image.json"

// maxManifest bounds a manifest's size: the directory is the instance's
// checkpoint volume, which its app can write.
const maxManifest = 1 << 20

// ReadImage reads the manifest of the image in dir. The error wraps
// ErrNoImage when dir holds no complete image. The manifest is read as
// the app's file it may be: a regular file of at most 1 MiB, links
// resolved inside dir.
func ReadImage(dir string) (Image, error) {
	b, err := ctlfs.ReadInRoot(dir, ManifestName, maxManifest)
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, hint.With(fmt.Errorf("%s has no %s: %w", dir, ManifestName, ErrNoImage),
			"the checkpoint did not complete, or this is not a checkpoint directory")
	}
	if err != nil {
		return Image{}, fmt.Errorf("read image manifest in %s: %w", dir, err)
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return Image{}, fmt.Errorf("image manifest %s: %w (%w)", filepath.Join(dir, ManifestName), ErrNoImage, err)
	}
	img.Dir = dir
	return img, img.check("")
}

// check verifies that the image's files exist and, if engine is set, that
// the image belongs to it.
func (img Image) check(engine Name) error {
	if engine != "" && img.Engine != engine {
		return hint.With(fmt.Errorf("image in %s was written by %q, not %q: %w", img.Dir, img.Engine, engine, ErrInvalid),
			"restore it with the engine that wrote it")
	}
	if img.Dir == "" || len(img.Files) == 0 {
		return fmt.Errorf("image %q lists no files: %w", img.Dir, ErrNoImage)
	}
	for _, f := range img.Files {
		if _, err := os.Stat(filepath.Join(img.Dir, f)); err != nil {
			return fmt.Errorf("image file %s: %w (%w)", filepath.Join(img.Dir, f), ErrNoImage, err)
		}
	}
	return nil
}

// writeManifest sizes the directory and writes the manifest.
func (img *Image) writeManifest() error {
	img.Bytes = 0
	err := filepath.WalkDir(img.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			img.Bytes += info.Size()
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(img.Files)
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(img.Dir, ManifestName), append(b, '\n'), 0o644, false)
}
