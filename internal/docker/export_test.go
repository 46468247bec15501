package docker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"

	"github.com/fogdeploy/fogdeploy/internal/docker"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/procstat"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/internal/wire/wiretest"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/envtest"
)

// TestImportDockerImage imports a local Docker image into an environment
// through the moby client and finds its files in a mounted clone; the
// helper container is gone afterwards.
func TestImportDockerImage(t *testing.T) {
	testenv.NeedRoot(t)
	dc := testenv.DockerClient(t)
	ctx := context.Background()

	rootfs := envtest.BusyboxRootfs(t)
	if err := os.WriteFile(filepath.Join(rootfs, "etc/marker"), []byte("from docker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tar := exec.Command("tar", "-C", rootfs, "-c", ".")
	stdout, _ := tar.StdoutPipe()
	if err := tar.Start(); err != nil {
		t.Fatal(err)
	}
	ref := fmt.Sprintf("fogdeploy-test/busybox:%d", os.Getpid())
	rc, err := dc.ImageImport(ctx, image.ImportSource{Source: stdout, SourceName: "-"}, ref, image.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, rc)
	rc.Close()
	tar.Wait()
	t.Cleanup(func() { dc.ImageRemove(context.Background(), ref, image.RemoveOptions{Force: true}) })

	// Export containers an import killed on this host left (its process
	// is gone), and one of an import in progress (this process).
	host, _ := os.Hostname()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	self, _ := procstat.Start(os.Getpid())
	leftover := func(owner string) string {
		c, err := dc.ContainerCreate(ctx, &container.Config{Image: ref, Cmd: []string{"/fogdeploy-export"}, Entrypoint: []string{},
			Labels: map[string]string{docker.LabelManaged: "true", "io.fogdeploy.role": "export", "io.fogdeploy.owner": owner}}, nil, nil, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dc.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}) })
		return c.ID
	}
	abandoned := leftover(fmt.Sprintf("%s/%d-%d", host, dead.Process.Pid, self))
	inProgress := leftover(fmt.Sprintf("%s/%d-%d", host, os.Getpid(), self))
	otherHost := leftover(fmt.Sprintf("%s-elsewhere/%d-%d", host, dead.Process.Pid, self))

	l := wiretest.FakeLayering(t)
	env, err := l.Manager.Import(ctx, "from-docker", layering.Source{DockerImage: ref, Exporter: docker.Exporter{Client: dc}}, layering.ImportOptions{Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if env.Source != "docker:"+ref {
		t.Errorf("source = %q", env.Source)
	}
	var out strings.Builder
	if _, err := l.Manager.Exec(ctx, "from-docker", "cat /etc/marker", &out); err != nil || out.String() != "from docker\n" {
		t.Fatalf("exec in the imported environment: %q, %v", out.String(), err)
	}
	left, err := dc.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", docker.LabelManaged+"=true"), filters.Arg("ancestor", ref))})
	var ids []string
	for _, c := range left {
		ids = append(ids, c.ID)
	}
	slices.Sort(ids)
	want := []string{inProgress, otherHost}
	slices.Sort(want)
	if err != nil || !slices.Equal(ids, want) {
		t.Fatalf("export containers after the import: %v, %v; want only the one of a live process and another host's (the import's own and the abandoned %s removed)", ids, err, abandoned)
	}

	_, err = l.Manager.Import(ctx, "missing", layering.Source{DockerImage: "fogdeploy-test/no-such-image:1", Exporter: docker.Exporter{Client: dc}}, layering.ImportOptions{})
	if !errors.Is(err, layering.ErrNotFound) || hint.Of(err) == "" {
		t.Fatalf("import of a missing image = %v, want ErrNotFound with a hint", err)
	}
}
