// Package docker talks to dockerd through the moby Go client, behind narrow
// interfaces that the rest of fogdeploy declares.
package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/procstat"
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

// Labels of an export's container: its role, and the process that made
// it ("<host>/<pid>-<start>"), so that what a killed import left is told
// from an export in progress.
const (
	labelRole   = "io.fogdeploy.role"
	roleExport  = "export"
	labelOwner  = "io.fogdeploy.owner"
	ownerFormat = "%s/%d-%d"
)

// ExportImage implements layering.ImageExporter. It first removes the
// export containers of processes of this host that are gone (an import
// killed while it read the stream).
func (e Exporter) ExportImage(ctx context.Context, ref string) (io.ReadCloser, error) {
	host, _ := os.Hostname()
	e.removeAbandoned(ctx, host)
	start, _ := procstat.Start(os.Getpid())
	created, err := e.Client.ContainerCreate(ctx, &container.Config{
		Image: ref,
		Cmd:   []string{"/fogdeploy-export"},
		Labels: map[string]string{LabelManaged: "true", labelRole: roleExport,
			labelOwner: fmt.Sprintf(ownerFormat, host, os.Getpid(), start)},
		Entrypoint: []string{},
	}, nil, nil, nil, "")
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, hint.With(fmt.Errorf("docker image %q: %w (docker: %w)", ref, layering.ErrNotFound, err), "list local images with `docker images`; no registry is reached")
		}
		if client.IsErrConnectionFailed(err) {
			return nil, hint.With(fmt.Errorf("docker: %w (%w)", layering.ErrUnavailable, err), "start dockerd with `make dev-up` or set DOCKER_HOST")
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

// removeAbandoned removes the export containers that processes of host
// made and that are gone. It is best effort: the export goes on whatever
// it finds.
func (e Exporter) removeAbandoned(ctx context.Context, host string) {
	list, err := e.Client.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", labelRole+"="+roleExport), filters.Arg("label", LabelManaged+"=true"))})
	if err != nil {
		return
	}
	for _, c := range list {
		var h string
		var pid int
		var start uint64
		if n, _ := fmt.Sscanf(strings.Replace(c.Labels[labelOwner], "/", " ", 1), "%s %d-%d", &h, &pid, &start); n != 3 || h != host || procstat.Alive(pid, start) {
			continue
		}
		_ = e.Client.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	}
}

type closer struct {
	io.ReadCloser
	after func() error
}

func (c *closer) Close() error { return errors.Join(c.ReadCloser.Close(), c.after()) }
