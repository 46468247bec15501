// The fake runtime's images: programs by name, labels, imports.

package runtime

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"strings"
	"time"
)

type fakeImage struct {
	programs map[string]FakeProgram
	cmd      []string
	labels   map[string]string
	created  time.Time
}

// AddImage registers image ref whose executables are programs (by base
// name) and whose default command is cmd.
func (f *Fake) AddImage(ref string, programs map[string]FakeProgram, cmd []string) {
	f.addImage(ref, fakeImage{programs: programs, cmd: cmd})
}

// AddLabelledImage is AddImage with labels.
func (f *Fake) AddLabelledImage(ref string, programs map[string]FakeProgram, cfg ImageConfig) {
	f.addImage(ref, fakeImage{programs: programs, cmd: cfg.Cmd, labels: maps.Clone(cfg.Labels)})
}

func (f *Fake) addImage(ref string, img fakeImage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Strictly increasing creation times, like images built one after another.
	img.created = time.Now().UTC()
	for _, o := range f.images {
		if !img.created.After(o.created) {
			img.created = o.created.Add(time.Nanosecond)
		}
	}
	f.images[normalizeRef(ref)] = img
}

// ImageLabels implements ImageInspector.
func (f *Fake) ImageLabels(_ context.Context, ref string) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	img, ok := f.images[normalizeRef(ref)]
	if !ok {
		return nil, fmt.Errorf("image %s: %w", ref, ErrImageNotFound)
	}
	return maps.Clone(img.labels), nil
}

// RemoveImage implements ImageImporter.
func (f *Fake) RemoveImage(_ context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[normalizeRef(ref)]; !ok {
		return fmt.Errorf("image %s: %w", ref, ErrImageNotFound)
	}
	delete(f.images, normalizeRef(ref))
	return nil
}

// FindImages implements ImageInspector.
func (f *Fake) FindImages(_ context.Context, label string) ([]Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Image
	for ref, img := range f.images {
		if _, ok := img.labels[label]; ok {
			out = append(out, Image{Ref: ref, ID: "sha256:fake-" + ref, Labels: maps.Clone(img.labels), Created: img.created})
		}
	}
	sortImages(out)
	return out, nil
}

// ImportImage implements ImageImporter: the executables of the tarball
// (regular files and symlinks) that FakeBusybox knows become the image's
// programs.
func (f *Fake) ImportImage(ctx context.Context, ref string, rootfsTar []byte, cfg ImageConfig) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("import image %s: %w", ref, err)
	}
	known := FakeBusybox()
	progs := map[string]FakeProgram{}
	tr := tar.NewReader(bytes.NewReader(rootfsTar))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("import image %s: read tarball: %w", ref, err)
		}
		if h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeSymlink {
			continue
		}
		if p, ok := known[path.Base(h.Name)]; ok {
			progs[path.Base(h.Name)] = p
		}
	}
	if len(progs) == 0 {
		return fmt.Errorf("import image %s: the tarball has no program the fake can run: %w", ref, ErrInvalidSpec)
	}
	f.AddLabelledImage(ref, progs, cfg)
	return nil
}

func normalizeRef(ref string) string {
	if i := strings.LastIndex(ref, ":"); i < 0 || strings.Contains(ref[i:], "/") {
		return ref + ":latest"
	}
	return ref
}
