package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	c, err := parseConfig(modeLaunch, []string{"-ready", "127.0.0.1:6379", "-ready-send", `PING\r\n`, "--", "redis-server", "--port", "6379"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.readySend != "PING\r\n" || strings.Join(c.app, " ") != "redis-server --port 6379" {
		t.Errorf("readySend %q app %q", c.readySend, c.app)
	}
	if c.trigger != "/fog/ckpt/checkpoint.request" || c.root != "/fog/root" || c.after != afterExit {
		t.Errorf("defaults: trigger %q root %q after %q", c.trigger, c.root, c.after)
	}
	for _, tc := range []struct {
		mode string
		args []string
		want string
	}{
		{modeLaunch, nil, "needs the app's command"},
		{modeRestart, []string{"redis-server"}, "restart takes no command"},
		{modeLaunch, []string{"-after-checkpoint", "pause", "app"}, `-after-checkpoint "pause"`},
		{modeLaunch, []string{"-root", "rel", "app"}, `-root "rel" must be an absolute path`},
		{modeLaunch, []string{"--", "-x"}, "looks like a flag"},
	} {
		_, err := parseConfig(tc.mode, tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %q: %v, want %q", tc.mode, tc.args, err, tc.want)
		}
	}
}

func TestGenerations(t *testing.T) {
	ck := t.TempDir()
	write := func(rel string) {
		t.Helper()
		p := filepath.Join(ck, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gens, err := generations(ck)
	if err != nil || len(gens) != 0 || nextGeneration(gens) != 1 {
		t.Fatalf("empty dir: %v %v next %d", gens, err, nextGeneration(gens))
	}
	if _, err := pickRestore(ck, gens, 0); !errors.Is(err, errNoCheckpoint) {
		t.Errorf("pickRestore on empty dir: %v", err)
	}
	write("1/ckpt_a_1.dmtcp")
	write("1/" + restartScript)
	write("2/ckpt_a_2.dmtcp")
	write("2/" + restartScript)
	write("3/ckpt_a_3.dmtcp.temp") // a checkpoint that died half way
	write("10/ckpt_a_10.dmtcp")    // image without the coordinator's marker
	write("notes/ckpt_x.dmtcp")    // not a generation
	write("checkpoint.request")
	gens, err = generations(ck)
	if err != nil {
		t.Fatal(err)
	}
	var ns []int
	for _, g := range gens {
		ns = append(ns, g.n)
	}
	if len(ns) != 4 || ns[0] != 1 || ns[3] != 10 {
		t.Errorf("generations = %v, want [1 2 3 10]", ns)
	}
	if nextGeneration(gens) != 11 {
		t.Errorf("next = %d, want 11 (past every existing directory)", nextGeneration(gens))
	}
	g, err := pickRestore(ck, gens, 0)
	if err != nil || g.n != 2 || len(g.images) != 1 || filepath.Base(g.images[0]) != "ckpt_a_2.dmtcp" {
		t.Errorf("newest complete = %+v, %v; want generation 2", g, err)
	}
	if g, err := pickRestore(ck, gens, 1); err != nil || g.n != 1 {
		t.Errorf("-from 1 = %+v, %v", g, err)
	}
	for _, from := range []int{3, 10, 7} {
		if _, err := pickRestore(ck, gens, from); !errors.Is(err, errNoCheckpoint) {
			t.Errorf("-from %d: %v, want errNoCheckpoint", from, err)
		}
	}
}

func TestUnescape(t *testing.T) {
	if got := unescape(`PING\r\n\\r`); got != "PING\r\n\\r" {
		t.Errorf("unescape = %q", got)
	}
}
