package spec

import "time"

// IdentityFile is where, inside an instance's root, the deployer writes its
// Identity (JSON) before the instance starts: an app reads it at boot, and
// after a restore (PostRestore) to tell itself from the other instances of
// the same checkpoint.
const IdentityFile = "/run/fogdeploy/identity.json"

// Identity is who an instance is. Its variables are in the environment of
// App.PostRestore too (IdentityEnv).
type Identity struct {
	// Instance is unique per instance: the deployment's ID.
	Instance string `json:"instance"`
	App      string `json:"app"`
	Node     string `json:"node"`
	// Slot is the slot the instance runs in.
	Slot string `json:"slot"`
	// Gen is the checkpoint generation it was restored from (0: booted).
	Gen int `json:"gen,omitempty"`
	// Seed is 32 random hex digits drawn for this instance: a reseed
	// source that no other instance shares.
	Seed    string    `json:"seed"`
	Started time.Time `json:"started"`
}

// Env is the identity as FOGDEPLOY_* variables.
func (id Identity) Env() []string {
	return []string{
		"FOGDEPLOY_INSTANCE=" + id.Instance,
		"FOGDEPLOY_APP=" + id.App,
		"FOGDEPLOY_NODE=" + id.Node,
		"FOGDEPLOY_SLOT=" + id.Slot,
		"FOGDEPLOY_SEED=" + id.Seed,
		"FOGDEPLOY_IDENTITY=" + IdentityFile,
	}
}
