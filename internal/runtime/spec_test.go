package runtime_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

func TestValidateReportsEveryProblem(t *testing.T) {
	err := runtime.Spec{
		Binds:   []runtime.Bind{{HostPath: "rel", ContainerPath: "/x"}},
		Ports:   []runtime.Port{{ContainerPort: 0}, {ContainerPort: 53, Proto: "icmp"}},
		Network: "host",
		CapAdd:  []string{"SYS ADMIN"},
	}.Validate()
	if !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Fatalf("Validate: %v, want ErrInvalidSpec", err)
	}
	for _, want := range []string{"no image", `bind "rel"`, "container port 0", `protocol "icmp"`, `network "host"`, `capability "SYS ADMIN"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if err := (runtime.Spec{Image: "x", Ports: []runtime.Port{{ContainerPort: 80}}}).Validate(); err != nil {
		t.Errorf("valid spec: %v", err)
	}
}

func TestEffectiveCaps(t *testing.T) {
	for _, tc := range []struct {
		add, drop []string
		want      uint64
	}{
		{nil, nil, 0xa80425fb},
		{[]string{"SYS_ADMIN"}, []string{"ALL"}, 1 << 21},
		{[]string{"cap_sys_admin", "SYS_CHROOT", "SETPCAP"}, []string{"all"}, 0x240100},
		{nil, []string{"NET_RAW", "MKNOD"}, 0xa80425fb &^ (1<<13 | 1<<27)},
	} {
		got, err := runtime.EffectiveCaps(tc.add, tc.drop)
		if err != nil || got != tc.want {
			t.Errorf("EffectiveCaps(%v, %v) = %#x, %v; want %#x", tc.add, tc.drop, got, err, tc.want)
		}
	}
	if _, err := runtime.EffectiveCaps([]string{"NOPE"}, nil); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("unknown capability: %v, want ErrInvalidSpec", err)
	}
}

func TestDMTCPContainerSpecs(t *testing.T) {
	c := runtime.DMTCPContainer{Image: "fogdeploy/dmtcp:4.2.0", Deployment: "d1", App: "redis",
		EnvPath: "/mnt/env", CkptPath: "/mnt/ckpt", Ports: []runtime.Port{{ContainerPort: 6379}},
		ReadyAddr: "127.0.0.1:6379", ReadySend: `PING\r\n`, ReadyExpect: "+PONG"}
	l := c.Launch([]string{"redis-server", "--port", "6379"})
	wantCmd := []string{"launch", "-ready", "127.0.0.1:6379", "-ready-send", `PING\r\n`, "-ready-expect", "+PONG", "--", "redis-server", "--port", "6379"}
	if !slices.Equal(l.Cmd, wantCmd) {
		t.Errorf("Launch cmd = %q, want %q", l.Cmd, wantCmd)
	}
	r := c.Restart(2)
	if !slices.Equal(r.Cmd, []string{"restart", "-ready", "127.0.0.1:6379", "-ready-send", `PING\r\n`, "-ready-expect", "+PONG", "-from", "2"}) {
		t.Errorf("Restart cmd = %q", r.Cmd)
	}
	// The app's variables go to the entrypoint as data for the app, never
	// into the container's environment, which the entrypoint runs in
	// with the container's capabilities.
	withEnv := c
	withEnv.Env = []string{"FOG_CRIU_PREFIX=/fog/root/opt/x", "PATH=/evil"}
	for _, s := range []runtime.Spec{withEnv.Launch([]string{"redis-server"}), withEnv.Restart(2), withEnv.Boot([]string{"redis-server"})} {
		if len(s.Env) != 0 {
			t.Errorf("%s: container environment %q; want none of the app's", s.Cmd[0], s.Env)
		}
		if i := slices.Index(s.Cmd, "-env"); i < 0 || s.Cmd[i+1] != withEnv.Env[0] || !slices.Contains(s.Cmd, withEnv.Env[1]) {
			t.Errorf("%s cmd = %q; want the app's variables as -env flags", s.Cmd[0], s.Cmd)
		}
	}
	for _, s := range []runtime.Spec{l, r} {
		if err := s.Validate(); err != nil {
			t.Errorf("spec invalid: %v", err)
		}
		if !slices.Equal(s.CapDrop, []string{"ALL"}) || !slices.Equal(s.CapAdd, runtime.DMTCPCapabilities()) {
			t.Errorf("caps add %v drop %v", s.CapAdd, s.CapDrop)
		}
		// The image's files are read-only; only /tmp is the container's to
		// write.
		if !s.ReadOnlyRoot || s.Tmpfs["/tmp"] == "" {
			t.Errorf("%s: read-only root %v, tmpfs %v; want a read-only root and a /tmp", s.Cmd[0], s.ReadOnlyRoot, s.Tmpfs)
		}
		want := []runtime.Bind{{HostPath: "/mnt/env", ContainerPath: runtime.DMTCPRootPath}, {HostPath: "/mnt/ckpt", ContainerPath: runtime.DMTCPCkptPath}}
		if !slices.Equal(s.Binds, want) {
			t.Errorf("binds %+v, want %+v", s.Binds, want)
		}
	}
	if got := runtime.DMTCPGenerationDir("/mnt/ckpt", 3); got != "/mnt/ckpt/3" {
		t.Errorf("DMTCPGenerationDir = %q", got)
	}

	// The stop signal is the container's (SIGTERM by default).
	if l.StopSignal != "SIGTERM" {
		t.Errorf("default stop signal %q, want SIGTERM", l.StopSignal)
	}
	c.StopSignal = "SIGQUIT"
	for _, s := range []runtime.Spec{c.Launch([]string{"redis-server"}), c.Restart(0), c.Boot([]string{"redis-server"})} {
		if s.StopSignal != "SIGQUIT" {
			t.Errorf("%s stop signal %q, want SIGQUIT", s.Cmd[0], s.StopSignal)
		}
	}
	c.StopSignal = ""

	// A checkpoint delay goes to launch and restart, not to boot.
	c.CheckpointDelay = 300 * time.Millisecond
	for _, s := range []runtime.Spec{c.Launch([]string{"redis-server"}), c.Restart(0)} {
		if i := slices.Index(s.Cmd, "-checkpoint-delay"); i < 0 || i+1 >= len(s.Cmd) || s.Cmd[i+1] != "300ms" {
			t.Errorf("%s cmd = %q, want -checkpoint-delay 300ms", s.Cmd[0], s.Cmd)
		}
	}
	if b := c.Boot([]string{"redis-server"}); slices.Contains(b.Cmd, "-checkpoint-delay") {
		t.Errorf("boot cmd = %q: no checkpoint, no delay", b.Cmd)
	}
	c.CheckpointDelay = 0

	// A root mounted after the container is made: the root's parent is
	// bound with slave propagation, the root under it, and the entrypoint
	// reads nothing before its order; a launch or a boot ignores it.
	late := c
	late.EnvPath, late.Wait, late.CtlPath, late.RootLater = "/mnt/slot/mnt/root", true, "/mnt/slot/ctl", true
	r = late.Restart(0)
	if !slices.Contains(r.Cmd, "-root-later") || !slices.Contains(r.Cmd, runtime.DMTCPMntPath+"/root") ||
		!slices.Contains(r.Binds, runtime.Bind{HostPath: "/mnt/slot/mnt", ContainerPath: runtime.DMTCPMntPath, Propagation: runtime.PropagationSlave}) {
		t.Errorf("restart with its root later: cmd %q, binds %+v; want -root-later, -root under %s bound with slave propagation", r.Cmd, r.Binds, runtime.DMTCPMntPath)
	}
	for _, s := range []runtime.Spec{late.Launch([]string{"redis-server"}), late.Boot([]string{"redis-server"})} {
		if slices.Contains(s.Cmd, "-root-later") {
			t.Errorf("%s cmd = %q: a root mounted later is for a restart", s.Cmd[0], s.Cmd)
		}
	}

	// An app with a user: the entrypoint is told, and the container may
	// switch to it (SETUID, SETGID; the keeper drops both before the app).
	c.User = "postgres"
	userCaps := append(runtime.DMTCPCapabilities(), runtime.DMTCPUserCapabilities()...)
	for _, s := range []runtime.Spec{c.Launch([]string{"postgres"}), c.Restart(0), c.Boot([]string{"postgres"})} {
		if i := slices.Index(s.Cmd, "-user"); i < 0 || i+1 >= len(s.Cmd) || s.Cmd[i+1] != "postgres" {
			t.Errorf("%s cmd = %q, want -user postgres", s.Cmd[0], s.Cmd)
		}
		if !slices.Equal(s.CapAdd, userCaps) {
			t.Errorf("%s caps add %v, want %v", s.Cmd[0], s.CapAdd, userCaps)
		}
	}
}

func TestParseTimings(t *testing.T) {
	logs := `{"time":"t","phase":"mount","mode":"launch","ms":1.5}
40000:M 22 Nov 2026 * Ready to accept connections {"phase":"not json at line start"}
time=... level=INFO msg="app ready"
{"time":"t","phase":"checkpoint","mode":"launch","gen":1,"ms":493.4,"bytes":35100000}
{"not":"a timing"}
`
	got := runtime.ParseTimings(logs)
	want := []runtime.Timing{{Phase: "mount", Mode: "launch", MS: 1.5}, {Phase: "checkpoint", Mode: "launch", Gen: 1, MS: 493.4, Bytes: 35100000}}
	if !slices.Equal(got, want) {
		t.Errorf("ParseTimings = %+v, want %+v", got, want)
	}
}

func TestStateHostPort(t *testing.T) {
	st := runtime.State{Ports: []runtime.Port{{ContainerPort: 53, Proto: "udp", HostPort: 1053}, {ContainerPort: 53, Proto: "tcp", HostPort: 2053}}}
	if st.HostPort(53, "") != 2053 || st.HostPort(53, "udp") != 1053 || st.HostPort(80, "tcp") != 0 {
		t.Errorf("HostPort mapping wrong for %+v", st.Ports)
	}
}
