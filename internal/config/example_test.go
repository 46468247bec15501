package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExampleConfigLoads: the production example that `make install` puts
// in /etc/fogdeploy (configs/pop-agent.example.yaml) has only known keys,
// validates, reaches no dev service, and serves the API over TLS with
// tokens on a node's address. Its files need not exist: Validate does not
// open them (the agent does, at start).
func TestExampleConfigLoads(t *testing.T) {
	c, err := Load(filepath.Join("..", "..", "configs", "pop-agent.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if err := c.Agent.CheckServe("10.0.0.11:7480", false); err != nil {
		t.Errorf("CheckServe on a node's address without --dev: %v", err)
	}
	d := Default()
	for _, f := range []struct{ name, got, dev string }{
		{"ceph.conf", c.Ceph.Conf, d.Ceph.Conf}, {"ceph.keyring", c.Ceph.Keyring, d.Ceph.Keyring},
		{"docker.host", c.Docker.Host, d.Docker.Host}, {"node.state_dir", c.Node.StateDir, d.Node.StateDir},
	} {
		if f.got == f.dev {
			t.Errorf("%s = %s: the dev default; give the node's own", f.name, f.got)
		}
	}
	if !strings.HasPrefix(c.Node.StateDir, "/var/lib/fogdeploy/") {
		t.Errorf("node.state_dir = %s: want it under /var/lib/fogdeploy, which make install creates", c.Node.StateDir)
	}
	if len(c.Etcd.Endpoints) != 3 || c.Etcd.CertFile == "" || c.Etcd.CAFile == "" {
		t.Errorf("etcd = %+v: want 3 members and TLS with a client certificate", c.Etcd)
	}
	if c.Ceph.ID == "admin" || c.Agent.TokenFile == "" || c.Agent.TokensFile == "" || c.Agent.CAFile == "" {
		t.Errorf("ceph.id %q, agent %+v: want a cephx user of its own, both token files and the CA", c.Ceph.ID, c.Agent)
	}
}

// TestAgentUnit: the agent's systemd unit is supervised as docs/design.md
// (Faults) says, and has none of the options that would give it a mount
// namespace of its own, whose mounts dockerd could not see.
func TestAgentUnit(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "configs", "systemd", "fogdeploy-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(line, "#") {
			set[k] = v
		}
	}
	for k, want := range map[string]string{"Restart": "always", "KillMode": "process", "User": "root"} {
		if set[k] != want {
			t.Errorf("%s=%q, want %q", k, set[k], want)
		}
	}
	if !strings.Contains(set["ExecStart"], "--config /etc/fogdeploy/pop-agent.yaml") || strings.Contains(set["ExecStart"], "--dev") {
		t.Errorf("ExecStart=%s: want --config /etc/fogdeploy/pop-agent.yaml and no --dev", set["ExecStart"])
	}
	for _, k := range []string{"ProtectHome", "ProtectSystem", "PrivateTmp", "PrivateMounts", "PrivateDevices", "ReadOnlyPaths",
		"ReadWritePaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths", "ProtectKernelTunables",
		"ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectProc", "ProcSubset", "ProtectClock",
		"MountFlags", "StateDirectory", "RootDirectory", "DynamicUser", "DeviceAllow", "DevicePolicy", "SystemCallFilter"} {
		if v, ok := set[k]; ok {
			t.Errorf("%s=%s: the agent's mounts must reach the host's namespace, and its devices stay open (see the unit's comments)", k, v)
		}
	}
}
