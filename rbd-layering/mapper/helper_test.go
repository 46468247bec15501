package mapper_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper/mappertest"
)

// helperEnv makes the test binary act as a mapping process that the test
// kills (see testSurvivesKill).
const helperEnv = "FOGDEPLOY_MAPPER_TEST_HELPER"

type helperSpec struct {
	Backend  string
	StateDir string
	Target   string
	FileDir  string // file backend: fileStore dir
	CephConf string // fuse backend
	Keyring  string
	Image    mapper.Image
}

func (s helperSpec) config() mapper.Config {
	if s.Backend == mapper.BackendFile {
		return fileStore{dir: s.FileDir}.config(s.StateDir)
	}
	return mapper.Config{Backend: s.Backend, StateDir: s.StateDir, CephConf: s.CephConf, Keyring: s.Keyring}
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		os.Exit(helperMain(spec))
	}
	os.Exit(m.Run())
}

// helperMain maps, mounts, writes a file, prints the mapping as JSON and
// waits to be killed.
func helperMain(spec string) int {
	var s helperSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	m, err := mapper.New(ctx, s.config(), log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mp, err := m.MapAndMount(ctx, s.Image, s.Target, mapper.MountOptions{Format: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(s.Target, "from-helper"), []byte("written before the kill"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(mp)
	select {}
}

// testSurvivesKill runs a helper process that maps and mounts img, kills
// it with SIGKILL, checks that the mapping outlived it (mount, device,
// rbd-fuse process), then recovers it with a Mapper of this process.
// deleteImage runs last.
func testSurvivesKill(t *testing.T, s helperSpec, newMapper func(stateDir string) *mapper.Mapper, deleteImage func()) {
	root := t.TempDir()
	s.StateDir, s.Target = filepath.Join(root, "state"), filepath.Join(root, "mnt")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := newMapper(s.StateDir).Recover(ctx); err != nil {
			t.Errorf("cleanup Recover: %v", err)
		}
		for _, m := range mappertestMountsUnder(root) {
			t.Errorf("cleanup: %s still mounted; lazily unmounting", m)
			exec.Command("umount", "-l", m).Run()
		}
		if deleteImage != nil {
			deleteImage()
		}
	})

	spec, _ := json.Marshal(s)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(spec))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- l
	}()
	var mp mapper.Mapping
	select {
	case l := <-line:
		if err := json.Unmarshal([]byte(l), &mp); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("helper printed %q: %v; stderr:\n%s", l, err, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("helper did not map within 2m; stderr:\n%s", stderr.String())
	}
	tr := mappertest.Track(t, s.StateDir, &mp)

	// While its owner runs, Recover elsewhere leaves the mapping alone.
	if undone, err := newMapper(s.StateDir).Recover(t.Context()); err != nil || len(undone) != 0 {
		t.Fatalf("Recover while the owner runs = %+v, %v; want nothing undone", undone, err)
	}
	if !mappertest.IsMountPoint(s.Target) {
		t.Fatal("Recover while the owner runs unmounted its mapping")
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	t.Logf("helper pid %d killed holding mapping %s on %s", cmd.Process.Pid, mp.ID, mp.Device)

	time.Sleep(100 * time.Millisecond)
	if b, err := os.ReadFile(filepath.Join(s.Target, "from-helper")); err != nil || string(b) != "written before the kill" {
		t.Fatalf("after the kill the mount does not serve the file: %q, %v", b, err)
	}
	if !mappertest.IsMountPoint(s.Target) {
		t.Fatalf("after the kill %s is no longer mounted", s.Target)
	}
	if s.Backend == mapper.BackendFuse && len(mappertest.ImageProcesses(s.Image.Name)) != 1 {
		t.Fatalf("after the kill want one rbd-fuse for %s, have %v", s.Image.Name, mappertest.ImageProcesses(s.Image.Name))
	}

	m := newMapper(s.StateDir)
	undone, err := m.Recover(t.Context())
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(undone) != 1 || undone[0].ID != mp.ID {
		t.Fatalf("Recover undid %+v, want %s", undone, mp.ID)
	}
	tr.WaitGone(t, 10*time.Second)
}

func mappertestMountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append([]string{f[4]}, out...)
		}
	}
	return out
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}
