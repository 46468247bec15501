package spec

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const goodSpec = `
name: redis
env: redis
command: [redis-server, --port, "6379", --protected-mode, "no"]
ports: [{port: 6379}]
ready: {kind: tcp, port: 6379, send: "PING\r\n", expect: "+PONG", timeout: 20s}
resources: {cpus: 0.5, memory: 256M}
`

func TestParseApp(t *testing.T) {
	a, err := ParseApp(strings.NewReader(goodSpec))
	if err != nil {
		t.Fatal(err)
	}
	if a.Engine != "dmtcp" || a.Ports[0].Proto != "tcp" || a.CheckpointSize != DefaultCheckpointSize || a.Ready.Send != "PING\r\n" {
		t.Errorf("defaults not applied: %+v", a)
	}
	if a.MemoryBytes() != 256<<20 {
		t.Errorf("memory = %d", a.MemoryBytes())
	}
	if a, err := ParseApp(strings.NewReader(goodSpec + "stop_signal: SIGQUIT\n")); err != nil || a.StopSignal != "SIGQUIT" {
		t.Errorf("stop_signal: %q, %v", a.StopSignal, err)
	}
	if a, err := ParseApp(strings.NewReader(goodSpec + "checkpoint_delay: 300ms\n")); err != nil || time.Duration(a.CheckpointDelay) != 300*time.Millisecond {
		t.Errorf("checkpoint_delay: %v, %v", a.CheckpointDelay, err)
	}
	for _, m := range []Mode{ModeAuto, ModeRestore, ModeBoot} {
		if a, err := ParseApp(strings.NewReader(goodSpec + "mode: " + string(m) + "\n")); err != nil || a.Mode != m {
			t.Errorf("mode %s: %q, %v", m, a.Mode, err)
		}
	}
	for _, u := range []string{"postgres", "www-data", "tomcat:tomcat", "999", "101:102", "_apt", "nobody"} {
		if _, err := ParseApp(strings.NewReader(goodSpec + "user: " + u + "\n")); err != nil {
			t.Errorf("user %q: %v", u, err)
		}
	}
}

// Each bad spec is refused with an error that names the field to fix.
func TestParseAppRefuses(t *testing.T) {
	cases := map[string]struct{ spec, field string }{
		"missing command":     {`{name: a, env: e, ready: {kind: output, phrase: up}}`, "command"},
		"port out of range":   {`{name: a, env: e, command: [x], ports: [{port: 70000}], ready: {kind: output, phrase: up}}`, "ports[0].port"},
		"unknown engine":      {`{name: a, env: e, command: [x], engine: podman, ready: {kind: output, phrase: up}}`, "engine"},
		"ready without port":  {`{name: a, env: e, command: [x], ready: {kind: tcp}}`, "ready.port"},
		"ready on other port": {`{name: a, env: e, command: [x], ports: [{port: 80}], ready: {kind: http, port: 81}}`, "ready.port"},
		"ready without kind":  {`{name: a, env: e, command: [x]}`, "ready.kind"},
		"exec without cmd":    {`{name: a, env: e, command: [x], ready: {kind: exec}}`, "ready.command"},
		"bad name":            {`{name: A_B, env: e, command: [x], ready: {kind: output, phrase: up}}`, "name"},
		"unknown field":       {`{name: a, env: e, command: [x], ready: {kind: output, phrase: up}, colour: red}`, "colour"},
		"bad timeout":         {`{name: a, env: e, command: [x], ready: {kind: output, phrase: up, timeout: soon}}`, "duration"},
		"bad memory":          {`{name: a, env: e, command: [x], ready: {kind: output, phrase: up}, resources: {memory: lots}}`, "resources.memory"},
		"cpus below 0.01":     {`{name: a, env: e, command: [x], ready: {kind: output, phrase: up}, resources: {cpus: 0.001}}`, "resources.cpus"},
		"negative cpus":       {`{name: a, env: e, command: [x], ready: {kind: output, phrase: up}, resources: {cpus: -1}}`, "resources.cpus"},
		"gzip with criu":      {`{name: a, env: e, command: [x], engine: criu, compression: gzip, ready: {kind: output, phrase: up}}`, "compression"},
		"empty":               {``, "empty"},
		"two documents":       {"{name: a}\n---\n{name: b}\n", "more than one"},
		"bad env var":         {`{name: a, env: e, command: [x], environment: [NOEQUALS], ready: {kind: output, phrase: up}}`, "environment[0]"},
		"bad user":            {`{name: a, env: e, command: [x], user: "Post Gres", ready: {kind: output, phrase: up}}`, "user"},
		"user with two ':'":   {`{name: a, env: e, command: [x], user: "a:b:c", ready: {kind: output, phrase: up}}`, "user"},
		"root user":           {`{name: a, env: e, command: [x], user: root, ready: {kind: output, phrase: up}}`, "user"},
		"stop signal":         {`{name: a, env: e, command: [x], stop_signal: SIGKILL, ready: {kind: output, phrase: up}}`, "stop_signal"},
		"checkpoint delay":    {`{name: a, env: e, command: [x], checkpoint_delay: 2h, ready: {kind: output, phrase: up}}`, "checkpoint_delay"},
		"suspend after":       {`{name: a, env: e, command: [x], suspend_after: 1s, ready: {kind: output, phrase: up}}`, "suspend_after"},
		"uid 0":               {`{name: a, env: e, command: [x], user: "0:100", ready: {kind: output, phrase: up}}`, "user"},
		"mode":                {`{name: a, env: e, command: [x], mode: fast, ready: {kind: output, phrase: up}}`, "mode"},
		"mode checkpoint":     {`{name: a, env: e, command: [x], mode: checkpoint, ready: {kind: output, phrase: up}}`, "mode"},
		"lazy with dmtcp":     {`{name: a, env: e, command: [x], lazy: true, ready: {kind: output, phrase: up}}`, "lazy"},
		"on demand, no port":  {`{name: a, env: e, command: [x], frontend: {on_demand: true}, ready: {kind: output, phrase: up}}`, "frontend.on_demand"},
		"on demand, udp only": {`{name: a, env: e, command: [x], ports: [{port: 53, proto: udp}], frontend: {on_demand: true}, ready: {kind: output, phrase: up}}`, "frontend.on_demand"},
		"on demand, suspend":  {`{name: a, env: e, command: [x], ports: [{port: 80}], suspend_after: 1m, frontend: {on_demand: true}, ready: {kind: output, phrase: up}}`, "frontend.on_demand"},
		"idle after, short":   {`{name: a, env: e, command: [x], ports: [{port: 80}], frontend: {on_demand: true, idle_after: 1s}, ready: {kind: output, phrase: up}}`, "frontend.idle_after"},
		"idle after alone":    {`{name: a, env: e, command: [x], ports: [{port: 80}], frontend: {idle_after: 1m}, ready: {kind: output, phrase: up}}`, "frontend.idle_after"},
		"frontend unknown":    {`{name: a, env: e, command: [x], ports: [{port: 80}], frontend: {on_demnd: true}, ready: {kind: output, phrase: up}}`, "on_demnd"},
	}
	for name, c := range cases {
		_, err := ParseApp(strings.NewReader(c.spec))
		if !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: err = %v; want ErrInvalidSpec", name, err)
			continue
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error does not name %q: %v", name, c.field, err)
		}
	}
}

func TestParseAppReportsEveryProblem(t *testing.T) {
	_, err := ParseApp(strings.NewReader(`{name: "", env: "", ready: {kind: tcp}}`))
	for _, f := range []string{"name", "env", "command", "ready.port"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("error does not mention %s: %v", f, err)
		}
	}
}

func TestParseAppSizeLimit(t *testing.T) {
	big := goodSpec + "# " + strings.Repeat("x", MaxSpecSize) + "\n"
	if _, err := ParseApp(strings.NewReader(big)); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("oversized spec: %v", err)
	}
}

func FuzzParseApp(f *testing.F) {
	f.Add(goodSpec)
	f.Add(`{name: a, env: e, command: [x], ready: {kind: output, phrase: up}}`)
	f.Add("ports: [{port: -1}]")
	f.Fuzz(func(t *testing.T, spec string) {
		a, err := ParseApp(strings.NewReader(spec))
		if err != nil {
			if !errors.Is(err, ErrInvalidSpec) && !strings.Contains(err.Error(), "app spec") {
				t.Fatalf("unwrapped error: %v", err)
			}
			return
		}
		// What is accepted is valid and round-trips through Validate.
		if err := a.Validate(); err != nil {
			t.Fatalf("accepted spec fails Validate: %v", err)
		}
		if len(a.Command) == 0 || a.Ready.Kind == "" {
			t.Fatalf("accepted spec without command or readiness: %+v", a)
		}
	})
}

// TestEngineAuto: engine auto is accepted, with a user and with gzip (which
// applies to the engine that takes it), and its checkpoints run with each
// engine in turn.
func TestEngineAuto(t *testing.T) {
	a, err := ParseApp(strings.NewReader(goodSpec + "engine: auto\nuser: redis\ncompression: gzip\n"))
	if err != nil {
		t.Fatalf("engine auto with a user and gzip: %v", err)
	}
	if a.WithDefaults().Engine != EngineAuto {
		t.Errorf("WithDefaults changed engine auto to %q", a.WithDefaults().Engine)
	}
	if _, err := ParseApp(strings.NewReader(goodSpec + "engine: criu\nuser: postgres\n")); err != nil {
		t.Errorf("engine criu with a user: %v", err)
	}
	c := a.WithEngine("criu")
	if c.Engine != "criu" || c.Compression != "none" {
		t.Errorf("WithEngine(criu) = engine %q, compression %q; want criu, none", c.Engine, c.Compression)
	}
	if d := a.WithEngine("dmtcp"); d.Compression != "gzip" {
		t.Errorf("WithEngine(dmtcp) compression %q; want gzip kept", d.Compression)
	}
}

// An app served on demand gets the default idle_after; one given is kept.
func TestOnDemandDefaults(t *testing.T) {
	a, err := ParseApp(strings.NewReader(`{name: a, env: e, command: [x], ports: [{port: 80}], frontend: {on_demand: true}, ready: {kind: tcp, port: 80}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(a.WithDefaults().Frontend.IdleAfter); got != DefaultIdleAfter {
		t.Errorf("idle_after by default: %s; want %s", got, DefaultIdleAfter)
	}
	a, err = ParseApp(strings.NewReader(`{name: a, env: e, command: [x], ports: [{port: 80}], frontend: {on_demand: true, idle_after: 30s}, ready: {kind: tcp, port: 80}}`))
	if err != nil || time.Duration(a.WithDefaults().Frontend.IdleAfter) != 30*time.Second {
		t.Errorf("idle_after 30s: %v, %v", a.Frontend, err)
	}
}
