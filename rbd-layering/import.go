package layering

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// Source is where an import takes a root filesystem from. Exactly one of
// its fields is set.
type Source struct {
	// Dir is a directory holding a root filesystem.
	Dir string
	// Tar is a tar stream of a root filesystem (e.g. `docker export`).
	Tar io.Reader
	// DockerImage is a local image exported through the Exporter.
	DockerImage string
	Exporter    ImageExporter
}

// ImageExporter exports the filesystem of a local container image as a
// tar stream. internal/docker implements it with the moby client.
type ImageExporter interface {
	ExportImage(ctx context.Context, ref string) (io.ReadCloser, error)
}

func (s Source) String() string {
	switch {
	case s.Dir != "":
		return "dir:" + abs(s.Dir)
	case s.DockerImage != "":
		return "docker:" + s.DockerImage
	default:
		return "tar"
	}
}

func (s Source) validate() error {
	n := 0
	for _, set := range []bool{s.Dir != "", s.Tar != nil, s.DockerImage != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("import source: give exactly one of a directory, a tar stream or a docker image: %w", ErrInvalid)
	}
	if s.Dir != "" {
		st, err := os.Stat(s.Dir)
		if err != nil {
			return hint.With(fmt.Errorf("rootfs directory %s: %w: %w", s.Dir, err, ErrInvalid), "give the path of an unpacked root filesystem, e.g. from `debootstrap`")
		}
		if !st.IsDir() {
			return fmt.Errorf("rootfs directory %s is not a directory: %w", s.Dir, ErrInvalid)
		}
	}
	if s.DockerImage != "" && s.Exporter == nil {
		return fmt.Errorf("import from docker image %q: no docker client configured: %w", s.DockerImage, ErrInvalid)
	}
	return nil
}

// ImportOptions modify Import.
type ImportOptions struct {
	// Size of the image in bytes; zero picks the configured default.
	Size     int64
	Progress Progress
}

// checkImport refuses an import before it begins: a bad name, size or
// source, or a name taken.
func (m *Manager) checkImport(ctx context.Context, name string, src Source, opts ImportOptions) error {
	if err := ValidateName("environment name", name); err != nil {
		return err
	}
	if opts.Size < 0 {
		return fmt.Errorf("size %d is negative: %w", opts.Size, ErrInvalid)
	}
	if err := src.validate(); err != nil {
		return err
	}
	if _, err := m.b.Tag(ctx, name); err == nil {
		return hint.With(fmt.Errorf("environment %q: %w", name, ErrExists), "choose another name or remove it with `fogctl env rm "+name+"`")
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// unpack returns the directory of s's root filesystem: s.Dir, or one
// under tmp that its tar stream (or docker image) is unpacked into.
func (s Source) unpack(ctx context.Context, tmp string, progress Progress) (string, error) {
	if s.Dir != "" {
		return s.Dir, nil
	}
	dir := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	r := s.Tar
	if s.DockerImage != "" {
		progress.say("exporting docker image %s", s.DockerImage)
		rc, err := s.Exporter.ExportImage(ctx, s.DockerImage)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		r = rc
	}
	progress.say("unpacking the root filesystem")
	return dir, extractTar(ctx, r, dir)
}

// Import creates the environment name from a root filesystem: an image
// filled with an ext4 filesystem of the files, sealed with a protected
// snapshot and tagged with the name. On failure nothing is left behind.
func (m *Manager) Import(ctx context.Context, name string, src Source, opts ImportOptions) (env Environment, err error) {
	if err := m.checkImport(ctx, name, src, opts); err != nil {
		return env, err
	}
	tmp, err := m.scratch(scratchImport)
	if err != nil {
		return env, err
	}
	defer os.RemoveAll(tmp)
	dir, err := src.unpack(ctx, tmp, opts.Progress)
	if err != nil {
		return env, err
	}
	content, err := dirSize(dir)
	if err != nil {
		return env, fmt.Errorf("read %s: %w", dir, err)
	}
	size := opts.Size
	if size == 0 {
		size = m.cfg.DefaultSize
	}
	if size == 0 {
		size = max(2<<30, 2*content+1<<30)
	}
	size = (size + 4<<20 - 1) &^ (4<<20 - 1)
	start := time.Now()
	opts.Progress.say("making an ext4 filesystem of %s holding %s of files", FormatSize(size), FormatSize(content))
	fsFile := filepath.Join(tmp, "fs.img")
	if err := makeFS(ctx, dir, fsFile, size); err != nil {
		return env, err
	}
	image := LayerPrefix + randomID(8)
	if err := m.b.Create(ctx, image, size); err != nil {
		return env, err
	}
	defer func() {
		if err != nil {
			if rerr := m.b.Remove(context.WithoutCancel(ctx), image); rerr != nil && !errors.Is(rerr, ErrNotFound) {
				err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
			}
		}
	}()
	opts.Progress.say("writing the filesystem into image %s", image)
	f, err := os.Open(fsFile)
	if err != nil {
		return env, err
	}
	defer f.Close()
	if err := m.b.Write(ctx, image, f, size); err != nil {
		return env, err
	}
	m.tagImage(ctx, image, "layer", "IMPORT "+src.String())
	ref := SnapRef{Image: image, Snap: SealedSnap}
	if err := m.b.Snapshot(ctx, ref); err != nil {
		return env, err
	}
	env = Environment{Name: name, Ref: ref, Source: src.String(), History: []string{"IMPORT " + src.String()}, Created: time.Now().UTC()}
	if err := m.swap(ctx, env, nil, "imported"); err != nil {
		return env, err
	}
	m.log.Info("environment imported", "env", name, "image", image, "size", size, "ms", time.Since(start).Milliseconds())
	opts.Progress.say("environment %s is %s", name, ref)
	return env, nil
}
