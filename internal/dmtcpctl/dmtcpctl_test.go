package dmtcpctl

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func envValue(env []string, key string) (string, int) {
	v, n := "", 0
	for _, kv := range env {
		if val, ok := strings.CutPrefix(kv, key+"="); ok {
			v, n = val, n+1
		}
	}
	return v, n
}

func TestEnv(t *testing.T) {
	env := Run{TmpDir: "/tmp", Gzip: false}.Env([]string{"LANG=C.UTF-8", "LC_ALL=en_US.UTF-8", "LC_TIME=de_DE",
		"DMTCP_COORD_PORT=7779", "JALIB_X=1", "HOME=/", "PATH=/bin"}, 4242)
	for k, want := range map[string]string{"LC_ALL": "C", "DMTCP_COORD_PORT": "4242", "DMTCP_COORD_HOST": "127.0.0.1",
		"JALIB_STDERR_PATH": "/dev/stderr", "DMTCP_GZIP": "0", "DMTCP_TMPDIR": "/tmp", "HOME": "/", "PATH": "/bin"} {
		if got, n := envValue(env, k); got != want || n != 1 {
			t.Errorf("%s = %q (set %d times), want %q once (env %v)", k, got, n, want, env)
		}
	}
	for _, k := range []string{"LANG", "LC_TIME", "JALIB_X"} {
		if _, n := envValue(env, k); n != 0 {
			t.Errorf("%s kept: %v", k, env)
		}
	}
	if g, _ := envValue(Run{Gzip: true}.Env(nil, 1), "DMTCP_GZIP"); g != "1" {
		t.Errorf("gzip: DMTCP_GZIP=%q", g)
	}
}

func TestArgs(t *testing.T) {
	r := Run{CkptDir: "/ck", TmpDir: "/tmp"}
	if got, want := r.LaunchArgs([]string{"redis-server", "--port", "1"}), []string{"-j", "--ckptdir", "/ck", "--tmpdir", "/tmp", "--no-gzip", "redis-server", "--port", "1"}; !slices.Equal(got, want) {
		t.Errorf("launch %v, want %v", got, want)
	}
	if got := (Run{Gzip: true}).LaunchArgs(nil); !slices.Contains(got, "--gzip") {
		t.Errorf("gzip launch %v", got)
	}
	if got, want := r.RestartArgs([]string{"/img/ckpt_a.dmtcp"}), []string{"-j", "--ckptdir", "/ck", "--tmpdir", "/tmp", "/img/ckpt_a.dmtcp"}; !slices.Equal(got, want) {
		t.Errorf("restart %v, want %v", got, want)
	}
	c := Coordinator{Port: 7, CkptDir: "/ck", TmpDir: "/t", LogFile: "/t/log"}.Args()
	if !slices.Contains(c, "--stale-timeout") || slices.Contains(c, "--exit-on-last") || !slices.Contains(c, "/t/log") {
		t.Errorf("coordinator %v", c)
	}
	if c := (Coordinator{ExitOnLast: true}).Args(); !slices.Contains(c, "--exit-on-last") || slices.Contains(c, "--stale-timeout") {
		t.Errorf("coordinator exiting on last %v", c)
	}
	if got, want := CommandArgs(9, Status), []string{"--coord-host", "127.0.0.1", "--coord-port", "9", "-s"}; !slices.Equal(got, want) {
		t.Errorf("command %v, want %v", got, want)
	}
}

func TestParse(t *testing.T) {
	st := ParseStatus("Coordinator:\n  Host: 127.0.0.1\n  NUM_PEERS=2\n  RUNNING=yes\n")
	if st != (State{Peers: 2, Running: true}) {
		t.Errorf("status %+v", st)
	}
	if st := ParseStatus("NUM_PEERS=0\nRUNNING=no\n"); st.Running || st.Peers != 0 {
		t.Errorf("idle status %+v", st)
	}
	out := "1, redis-server[40000:123]@host, 1a2b, RUNNING\n2, sh[40001:456]@host, 1a2c, RUNNING\n"
	if got := ListedPIDs(out); !slices.Equal(got, []int{123, 456}) {
		t.Errorf("listed %v", got)
	}
	if !CheckpointCommandOK(CheckpointKill, errors.New("exit status 2"), "Error: checkpointed and killed") {
		t.Error("-kc with its second request refused should count as running")
	}
	if CheckpointCommandOK(Checkpoint, errors.New("exit status 2"), "checkpointed and killed") {
		t.Error("-c failing should not count")
	}
}

func TestComplete(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Complete(dir, 1); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("empty: %v", err)
	}
	write("ckpt_a.dmtcp")
	if _, err := Complete(dir, 1); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("no script: %v", err)
	}
	write(RestartScript)
	write("ckpt_b.dmtcp.temp")
	if _, err := Complete(dir, 1); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("image being written: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "ckpt_b.dmtcp.temp")); err != nil {
		t.Fatal(err)
	}
	if _, err := Complete(dir, 2); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("one image for two peers: %v", err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "ckpt_z.dmtcp")); err != nil {
		t.Fatal(err)
	}
	images, err := Complete(dir, 1)
	if err != nil || !slices.Equal(images, []string{filepath.Join(dir, "ckpt_a.dmtcp")}) {
		t.Fatalf("complete: %v %v (a link is no image)", images, err)
	}
}

func TestListenLoopback(t *testing.T) {
	f, port, err := ListenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("the socket does not accept on its port: %v", err)
	}
	c.Close()
}
