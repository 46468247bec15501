// Package docker talks to dockerd through the moby Go client, behind narrow
// interfaces that the rest of fogdeploy declares.
package docker

import (
	"context"
	"errors"
	"fmt"
	"io"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// LabelManaged marks every container fogdeploy creates.
const LabelManaged = "io.fogdeploy.managed"

// Connect returns a moby client for host (a URL such as
// unix:///var/run/docker.sock), negotiating the API version so that an
// older daemon (Debian's 20.10 speaks API 1.41) accepts it.
func Connect(host string) (*client.Client, error) {
	opts := []client.Opt{client.WithAPIVersionNegotiation()}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	c, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client for %s: %w", host, err)
	}
	return c, nil
}

// Exporter implements layering.ImageExporter: it creates a stopped
// container of the image, streams `docker export` of it, and removes the
// container when the stream is closed.
type Exporter struct {
	Client *client.Client
}

var _ layering.ImageExporter = Exporter{}

// ExportImage implements layering.ImageExporter.
func (e Exporter) ExportImage(ctx context.Context, ref string) (io.ReadCloser, error) {
	created, err := e.Client.ContainerCreate(ctx, &container.Config{
		Image:      ref,
		Cmd:        []string{"/fogdeploy-export"},
		Labels:     map[string]string{LabelManaged: "true", "io.fogdeploy.role": "export"},
		Entrypoint: []string{},
	}, nil, nil, nil, "")
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, layering.WithHint(fmt.Errorf("docker image %q: %w (docker: %w)", ref, layering.ErrNotFound, err), "list local images with `docker images`; no registry is reached")
		}
		if client.IsErrConnectionFailed(err) {
			return nil, layering.WithHint(fmt.Errorf("docker: %w (%w)", layering.ErrUnavailable, err), "start dockerd with `make dev-up` or set DOCKER_HOST")
		}
		return nil, fmt.Errorf("docker create from %q: %w", ref, err)
	}
	remove := func() error {
		return e.Client.ContainerRemove(context.WithoutCancel(ctx), created.ID, container.RemoveOptions{Force: true})
	}
	rc, err := e.Client.ContainerExport(ctx, created.ID)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("docker export of %q: %w", ref, err), remove())
	}
	return &closer{ReadCloser: rc, after: remove}, nil
}

type closer struct {
	io.ReadCloser
	after func() error
}

func (c *closer) Close() error { return errors.Join(c.ReadCloser.Close(), c.after()) }
