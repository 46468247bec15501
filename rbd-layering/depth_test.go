package layering_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/envtest"
)

// TestDepthLimits: past the soft limit a build warns, past the hard limit
// it refuses and says how to flatten; after flatten it builds again.
func TestDepthLimits(t *testing.T) {
	l := envtest.FakeLayeringWith(t, func(c *layering.ManagerConfig) { c.SoftDepth, c.HardDepth = 1, 2 })
	ctx := context.Background()
	if _, err := l.Manager.Import(ctx, "d0", layering.Source{Dir: envtest.BusyboxRootfs(t)}, layering.ImportOptions{Size: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	build := func(name, from string) (string, error) {
		bf, _ := layering.ParseBuildFile(strings.NewReader(fmt.Sprintf("FROM %s\nRUN echo %s > /etc/%s\n", from, name, name)))
		var said []string
		_, err := l.Manager.Build(ctx, name, bf, layering.BuildOptions{Progress: func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) }})
		return strings.Join(said, "\n"), err
	}
	if said, err := build("d1", "d0"); err != nil || strings.Contains(said, "warning") {
		t.Fatalf("depth 1: %v, progress %q; want no warning", err, said)
	}
	said, err := build("d2", "d1")
	if err != nil || !strings.Contains(said, "past the soft limit 1") {
		t.Fatalf("depth 2: %v, progress %q; want a soft-limit warning", err, said)
	}
	before, _ := l.Store.List(ctx)
	_, err = build("d3", "d2")
	if !errors.Is(err, layering.ErrTooDeep) || !strings.Contains(hint.Of(err), "fogctl env flatten d3") {
		t.Fatalf("depth 3: %v (hint %q), want ErrTooDeep with a flatten hint", err, hint.Of(err))
	}
	if after, _ := l.Store.List(ctx); len(after) != len(before) {
		t.Fatalf("refused build changed the pool: %v -> %v", before, after)
	}
	if _, err := l.Manager.Flatten(ctx, "d2", nil); err != nil {
		t.Fatal(err)
	}
	info, err := l.Manager.Inspect(ctx, "d2")
	if err != nil || info.Depth != 0 {
		t.Fatalf("after flatten: depth %d, %v; want 0", info.Depth, err)
	}
	if _, err := build("d3", "d2"); err != nil {
		t.Fatalf("build on the flattened environment: %v", err)
	}
	var out strings.Builder
	if _, err := l.Manager.Exec(ctx, "d3", "cat /etc/d1 /etc/d2 /etc/d3", &out); err != nil || out.String() != "d1\nd2\nd3\n" {
		t.Fatalf("files through the flattened chain: %q, %v", out.String(), err)
	}
}
