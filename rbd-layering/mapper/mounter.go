package mapper

import (
	"context"
	"errors"
	"fmt"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Mounter adapts a node's mapper (*Mapper, or the fake of package
// fakemapper) to layering.Mounter, for the images of pool Pool.
type Mounter struct {
	M interface {
		MapAndMount(ctx context.Context, img Image, target string, mopts MountOptions, opts ...MapOption) (*Mapping, error)
		Release(ctx context.Context, id string) error
	}
	Pool string
}

// Mount implements layering.Mounter.
func (a Mounter) Mount(ctx context.Context, image, target string, opts layering.MountOptions) (func(context.Context) error, error) {
	// An environment's mappings last as long as the call that makes them:
	// a process killed meanwhile leaves them to ReleaseAbandoned.
	mp, err := a.M.MapAndMount(ctx, Image{Pool: a.Pool, Name: image}, target, MountOptions{ReadOnly: opts.ReadOnly, Format: opts.Format},
		Ephemeral())
	if err != nil {
		if errors.Is(err, ErrImageNotFound) {
			return nil, fmt.Errorf("%w: %w", layering.ErrNotFound, err)
		}
		return nil, err
	}
	return func(ctx context.Context) error { return a.M.Release(ctx, mp.ID) }, nil
}
