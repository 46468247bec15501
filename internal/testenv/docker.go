package testenv

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
)

// DockerClient returns a moby client for $DOCKER_HOST or the dev-up
// dockerd, after a ping within 5 s.
func DockerClient(t testing.TB) *client.Client {
	t.Helper()
	SkipShort(t, Docker)
	host := devenv.Lookup(devenv.EnvDockerHost, devenv.DockerHost())
	if path, ok := strings.CutPrefix(host, "unix://"); ok {
		if _, err := os.Stat(path); err != nil {
			Unavailable(t, Docker, "no dockerd socket at "+path+": run `make dev-up`")
		}
	}
	c, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		Unavailable(t, Docker, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Ping(ctx); err != nil {
		Unavailable(t, Docker, "dockerd at "+host+" does not answer: "+err.Error())
	}
	t.Cleanup(func() { c.Close() })
	return c
}
