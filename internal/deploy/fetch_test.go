package deploy_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// slowFetch holds the mapping of a checkpoint fetch until release is
// closed, then makes it or fails with fail.
type slowFetch struct {
	deploy.Mapper
	release chan struct{}
	fail    error
}

func (m *slowFetch) MapAndMount(ctx context.Context, img mapper.Image, target string, mo mapper.MountOptions, opts ...mapper.MapOption) (*mapper.Mapping, error) {
	if strings.HasPrefix(mapper.SettingsOf(opts...).ID, "fetch-") {
		select {
		case <-m.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if m.fail != nil {
			return nil, m.fail
		}
	}
	return m.Mapper.MapAndMount(ctx, img, target, mo, opts...)
}

// TestRestoreCreatedWhileFetching: a restore on a node that must fetch
// its checkpoint creates its light container while the fetch goes on
// (its container phase ends before its fetch phase), and its app reads
// the whole checkpoint once started: the key written before the
// checkpoint is there. A fetch that fails after the container was made
// fails the deploy and leaves nothing of it. On the fakes;
// TestRestoreCreatedWhileFetchingContainer runs it on the real parts.
func TestRestoreCreatedWhileFetching(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			u, ctx, app := unitRedis(t, eng)
			restoreWhileFetching(ctx, t, u, app)
		})
	}
}

// TestRestoreCreatedWhileFetchingContainer is TestRestoreCreatedWhileFetching
// in the light container on Ceph and Docker, with the real entrypoint
// (-source-later) under each engine.
func TestRestoreCreatedWhileFetchingContainer(t *testing.T) {
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			f, ctx, app := redisFixture(t, "container", eng, "late")
			restoreWhileFetching(ctx, t, f, app)
		})
	}
}

func restoreWhileFetching(ctx context.Context, t *testing.T, n deploytest.Node, app spec.App) {
	first, err := n.Deployer().Deploy(ctx, app, deploy.Options{Prepare: func(ctx context.Context, tg deploy.Target) error {
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "before the checkpoint")
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	drop := func() {
		t.Helper()
		if _, err := n.Deployer().TrimCache(func(k gencache.Key) bool { return k.App != app.Name }); err != nil {
			t.Fatal(err)
		}
	}
	drop()
	slow := &slowFetch{release: make(chan struct{})}
	d := n.ReopenMapping(t, func(m deploy.Mapper) deploy.Mapper { slow.Mapper = m; return slow })
	var phases []string
	dep, err := d.Deploy(ctx, app, deploy.Options{Progress: func(p string, _ time.Duration) {
		phases = append(phases, p)
		if p == string(deploy.StepContainer) {
			close(slow.release) // the container is made: the fetch may end
		}
	}})
	if err != nil {
		t.Fatalf("restore while fetching: %v (phases %v)", err, phases)
	}
	c, f := slices.Index(phases, string(deploy.StepContainer)), slices.Index(phases, string(deploy.StepFetch))
	if !dep.Fetched || c < 0 || f < c {
		t.Errorf("restore that fetched: fetched %v, phases %v; want its container made before its fetch ended", dep.Fetched, phases)
	}
	if got, err := testenv.RedisDo(ctx, nil, deploytest.RedisAddr(t, dep), "GET", "greeting"); err != nil || got != "before the checkpoint" {
		t.Errorf("GET greeting after a restore created while fetching = %q, %v", got, err)
	}

	// The fetch fails once the container is made.
	drop()
	failing := &slowFetch{release: make(chan struct{}), fail: errors.New("the cluster went away")}
	d = n.ReopenMapping(t, func(m deploy.Mapper) deploy.Mapper { failing.Mapper = m; return failing })
	made := false
	_, err = d.Deploy(ctx, app, deploy.Options{Progress: func(p string, _ time.Duration) {
		if p == string(deploy.StepContainer) {
			made = true
			close(failing.release)
		}
	}})
	if err == nil || !made || !strings.Contains(err.Error(), "the cluster went away") {
		t.Errorf("restore whose fetch failed after its container: %v (container made %v); want the fetch's error", err, made)
	}
	for _, id := range []string{dep.ID, first.ID} {
		if err := d.Undeploy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	n.AssertNothingLeft(t, app.Name, true)
}
