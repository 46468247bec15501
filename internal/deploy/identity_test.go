package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

func TestPostRestoreDMTCPContainer(t *testing.T) { testPostRestore(t, "container", engine.NameDMTCP) }
func TestPostRestoreCRIU(t *testing.T)           { testPostRestore(t, "host", engine.NameCRIU) }
func TestPostRestoreCRIUContainer(t *testing.T)  { testPostRestore(t, "container", engine.NameCRIU) }

// testPostRestore: instances restored from one checkpoint keep its state
// but each takes an identity of its own: the file it reads names it, and
// its post_restore command (here: redis-cli storing the instance's ID, its
// seed and its identity file) runs in it before it counts as ready. A
// post_restore that fails fails the deploy, which leaves nothing.
func testPostRestore(t *testing.T, driver string, eng engine.Name) {
	f, ctx, app := redisFixture(t, driver, eng, "ident")
	app.PostRestore = []string{"sh", "-c", `redis-cli -p 6379 SET instance "$FOGDEPLOY_INSTANCE" && ` +
		`redis-cli -p 6379 SET seed "$FOGDEPLOY_SEED" && redis-cli -p 6379 SET identity "$(cat "$FOGDEPLOY_IDENTITY")"`}
	if _, err := f.D.Deploy(ctx, app, deploy.Options{Prepare: func(ctx context.Context, tg deploy.Target) error {
		_, err := testenv.RedisDo(ctx, nil, tg.Ports["6379/tcp"], "SET", "greeting", "from the checkpoint")
		return err
	}}); err != nil {
		t.Fatalf("first deploy: %v", err)
	}
	seeds := map[string]string{}
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	for i := range 2 {
		dep, err := f.D.Deploy(ctx, app, deploy.Options{})
		if err != nil {
			t.Fatalf("restore %d: %v", i+1, err)
		}
		if !hasPhase(dep.Timings, deploy.StepPostRestore) {
			t.Errorf("restore %d: timings %s lack %q", i+1, dep.Timings, deploy.StepPostRestore)
		}
		addr := deploytest.RedisAddr(t, dep)
		get := func(key string) string {
			t.Helper()
			v, err := testenv.RedisDo(ctx, nil, addr, "GET", key)
			if err != nil {
				t.Fatalf("restore %d: GET %s: %v", i+1, key, err)
			}
			return v
		}
		if g := get("greeting"); g != "from the checkpoint" {
			t.Errorf("restore %d: GET greeting = %q; want the checkpoint's state", i+1, g)
		}
		if got := get("instance"); got != dep.ID {
			t.Errorf("restore %d: post_restore stored instance %q; want %s", i+1, got, dep.ID)
		}
		seed := get("seed")
		if !hex32.MatchString(seed) {
			t.Errorf("restore %d: seed %q; want 32 hex digits", i+1, seed)
		}
		if other, ok := seeds[seed]; ok {
			t.Errorf("restores %s and %s got the same seed %s", other, dep.ID, seed)
		}
		seeds[seed] = dep.ID
		var id spec.Identity
		if err := json.Unmarshal([]byte(get("identity")), &id); err != nil {
			t.Fatalf("restore %d: the identity file as the instance read it: %v", i+1, err)
		}
		if id.Instance != dep.ID || id.App != app.Name || id.Seed != seed || id.Gen != dep.Gen || id.Slot != dep.Slot {
			t.Errorf("restore %d: identity %+v; want instance %s, app %s, its seed, gen %d, slot %s", i+1, id, dep.ID, app.Name, dep.Gen, dep.Slot)
		}
		// A light container's is written on the node's own file system
		// and bound into the root (and, while its entrypoint has not bound
		// it yet, into the root too); the host driver's is in the clone.
		inClone := filepath.Join(dep.Handle.EnvPath, spec.IdentityFile)
		if dep.Handle.CtlPath != "" {
			b, err := os.ReadFile(filepath.Join(dep.Handle.CtlPath, instancectl.IdentityDir, path.Base(spec.IdentityFile)))
			if err != nil || !strings.Contains(string(b), dep.ID) {
				t.Errorf("restore %d: the identity in the control directory = %q, %v", i+1, b, err)
			}
		} else if b, err := os.ReadFile(inClone); err != nil || !strings.Contains(string(b), dep.ID) {
			t.Errorf("restore %d: %s in the clone = %q, %v", i+1, spec.IdentityFile, b, err)
		}
	}

	// A post_restore that fails fails the deploy, with its output, and
	// leaves nothing of it.
	f.UndeployAll(t, app.Name)
	bad := app
	bad.PostRestore = []string{"sh", "-c", "echo no seed for you; exit 7"}
	_, err := f.D.Deploy(ctx, bad, deploy.Options{})
	if !errors.Is(err, deploy.ErrPostRestore) || !strings.Contains(err.Error(), "exited with code 7") || !strings.Contains(err.Error(), "no seed for you") {
		t.Fatalf("deploy with a failing post_restore = %v; want ErrPostRestore with its exit code and output", err)
	}
	deploytest.AssertNothingLeft(t, f, app.Name, true)
}

// TestIdentityRefusesSymlinkedRun: an environment whose /run is a symbolic
// link cannot make the deployer write outside the instance's root.
func TestIdentityRefusesSymlinkedRun(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "run")); err != nil {
		t.Fatal(err)
	}
	err := deploy.WriteIdentity(root, spec.Identity{Instance: "x-1"})
	if err == nil {
		t.Fatal("WriteIdentity followed /run -> " + outside)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("WriteIdentity wrote %v outside the root", entries)
	}
	// A plain root gets the file, readable by the app's user.
	root2 := t.TempDir()
	if err := deploy.WriteIdentity(root2, spec.Identity{Instance: "x-2", Seed: "s"}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(root2, spec.IdentityFile))
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("identity file: %v, %v; want mode 0644", st, err)
	}
}
