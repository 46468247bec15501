package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSwitch: on/off settings read YAML booleans and the words older
// configs wrote; anything else is an error naming the setting.
func TestSwitch(t *testing.T) {
	dir := t.TempDir()
	load := func(body string) Config {
		t.Helper()
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p)
		if err != nil {
			t.Fatalf("load %q: %v", body, err)
		}
		return c
	}
	if c := Default(); !c.Agent.Recycle.IsOn() || !c.Agent.PoolAhead.IsOn() {
		t.Fatal("recycle and pool_ahead are on by default")
	}
	for body, want := range map[string][2]bool{
		"agent:\n  recycle: false\n  pool_ahead: true\n": {false, true},
		"agent:\n  recycle: \"on\"\n  pool_ahead: off\n": {true, false},
		"agent:\n  recycle: off\n":                       {false, true},
	} {
		c := load(body)
		if got := [2]bool{c.Agent.Recycle.IsOn(), c.Agent.PoolAhead.IsOn()}; got != want {
			t.Errorf("%q: recycle, pool_ahead = %v; want %v", body, got, want)
		}
		if err := c.Validate(); err != nil && strings.Contains(err.Error(), "agent.") {
			t.Errorf("%q: %v", body, err)
		}
	}
	c := load("agent:\n  pool_ahead: sometimes\n  recycle: [1]\n")
	err := c.Validate()
	for _, want := range []string{`agent.pool_ahead "sometimes": use true or false`, `agent.recycle "a list"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v; want %q", err, want)
		}
	}
	t.Setenv("FOGDEPLOY_POOL_AHEAD", "off")
	c = Default()
	c.ApplyEnv()
	if c.Agent.PoolAhead.IsOn() {
		t.Error("FOGDEPLOY_POOL_AHEAD=off left pool_ahead on")
	}
}
