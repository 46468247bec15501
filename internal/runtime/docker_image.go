// Images through the moby API: their labels, the ones fogdeploy finds by label, imports of a root file system, removal.

package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
)

// ImageLabels implements ImageInspector.
//
// Implements: GET /images/{name}/json.
func (d *Docker) ImageLabels(ctx context.Context, ref string) (map[string]string, error) {
	img, err := d.api.ImageInspect(ctx, ref)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("image %s: %w", ref, ErrImageNotFound)
		}
		return nil, d.wrap("inspect image", ref, err)
	}
	if img.Config == nil {
		return map[string]string{}, nil
	}
	return img.Config.Labels, nil
}

// RemoveImage implements ImageImporter.
//
// Implements: DELETE /images/{name}.
func (d *Docker) RemoveImage(ctx context.Context, ref string) error {
	_, err := d.api.ImageRemove(ctx, ref, image.RemoveOptions{PruneChildren: true})
	if cerrdefs.IsNotFound(err) {
		return fmt.Errorf("image %s: %w", ref, ErrImageNotFound)
	}
	if err != nil {
		return d.wrap("remove image", ref, err)
	}
	return nil
}

// FindImages implements ImageInspector.
//
// Implements: GET /images/json?filters={"label":[label]}.
func (d *Docker) FindImages(ctx context.Context, label string) ([]Image, error) {
	list, err := d.api.ImageList(ctx, image.ListOptions{Filters: filters.NewArgs(filters.Arg("label", label))})
	if err != nil {
		return nil, d.wrap("list images", label, err)
	}
	out := make([]Image, 0, len(list))
	for _, im := range list {
		ref := im.ID
		if tags := slices.DeleteFunc(slices.Clone(im.RepoTags), func(t string) bool { return t == "<none>:<none>" }); len(tags) > 0 {
			slices.Sort(tags)
			ref = tags[0]
		}
		out = append(out, Image{Ref: ref, ID: im.ID, Labels: im.Labels, Created: time.Unix(im.Created, 0).UTC()})
	}
	sortImages(out)
	return out, nil
}

// sortImages orders images newest first, then by Ref.
func sortImages(ims []Image) {
	sort.SliceStable(ims, func(i, j int) bool {
		if !ims[i].Created.Equal(ims[j].Created) {
			return ims[i].Created.After(ims[j].Created)
		}
		return ims[i].Ref < ims[j].Ref
	})
}

// ImportImage implements ImageImporter: it makes image ref from a root
// filesystem tarball, with cfg's command and labels. The image ref named
// before is removed if nothing else uses it.
//
// Implements: POST /images/create?fromSrc=- (`docker import`).
func (d *Docker) ImportImage(ctx context.Context, ref string, rootfsTar []byte, cfg ImageConfig) error {
	var oldID string
	if old, err := d.api.ImageInspect(ctx, ref); err == nil {
		oldID = old.ID
	}
	if err := d.importImage(ctx, ref, rootfsTar, cfg); err != nil {
		return err
	}
	if oldID != "" {
		if cur, err := d.api.ImageInspect(ctx, ref); err == nil && cur.ID != oldID {
			// Fails harmlessly when a container still uses the old image.
			_, _ = d.api.ImageRemove(ctx, oldID, image.RemoveOptions{})
		}
	}
	return nil
}

func (d *Docker) importImage(ctx context.Context, ref string, rootfsTar []byte, cfg ImageConfig) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("import image %s: %w", ref, err)
	}
	var changes []string
	if len(cfg.Cmd) > 0 {
		c, err := jsonArray(cfg.Cmd)
		if err != nil {
			return err
		}
		changes = append(changes, "CMD "+c)
	}
	for _, k := range slices.Sorted(maps.Keys(cfg.Labels)) {
		kv, err := json.Marshal(cfg.Labels[k])
		if err != nil {
			return err
		}
		changes = append(changes, "LABEL "+k+"="+string(kv))
	}
	rc, err := d.api.ImageImport(ctx, image.ImportSource{Source: bytes.NewReader(rootfsTar), SourceName: "-"}, ref,
		image.ImportOptions{Changes: changes, Message: "imported by fogdeploy"})
	if err != nil {
		return d.wrap("import image", ref, err)
	}
	defer rc.Close()
	// The answer is a stream of JSON progress messages; a failure is a
	// message with "error" set.
	dec := json.NewDecoder(rc)
	for {
		var msg struct {
			Error string `json:"error"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("import image %s: read answer: %w", ref, err)
		}
		if msg.Error != "" {
			return fmt.Errorf("import image %s: %s", ref, msg.Error)
		}
	}
}
