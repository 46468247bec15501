package spec

import (
	"github.com/fogdeploy/fogdeploy/internal/engine"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// PoolResult says where a deployment's slot came from.
type PoolResult string

// Pool results (Instance.Pool).
const (
	// PoolHit: a warm pool's slot, provisioned before the request.
	PoolHit PoolResult = "hit"
	// PoolMiss: no pool slot was free; the deploy provisioned its own.
	PoolMiss PoolResult = "miss"
	// PoolSpare: no pool slot of the app was free; the deploy took one of
	// the node's spare slots, made for no app, and provisioned only its
	// root, checkpoint and ports.
	PoolSpare PoolResult = "spare"
)

// SpareApp is the name spare slots go by (their IDs and images start with
// it): no app may take it.
const SpareApp = "spare"

// Instance is what a deployment's instance is, as its node's record
// (deploy.Deployment) and the PoP's status of it (state.Status) both say:
// where it is, how it started and what that took.
type Instance struct {
	Phase Phase  `json:"phase"`
	Node  string `json:"node"`
	// Gen is the checkpoint generation restored (0 while booting), and
	// Engine the engine that checkpointed it.
	Gen    int         `json:"gen,omitempty"`
	Engine engine.Name `json:"engine,omitempty"`
	// Mode is ModeRestore (from a checkpoint generation) or ModeBoot (the
	// app booted with no checkpoint engine; BootReason says why). Reason
	// says why a restore was chosen, when the caller said (mode auto).
	Mode       Mode   `json:"mode,omitempty"`
	BootReason string `json:"boot_reason,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// Booted is set when this deploy had to produce the generation first.
	Booted bool `json:"booted,omitempty"`
	// Slot is the slot the deployment binds (its resources are named
	// after it); Pool says whether it came from the warm pool (PoolHit)
	// or was provisioned for this deploy (PoolMiss).
	Slot string     `json:"slot,omitempty"`
	Pool PoolResult `json:"pool,omitempty"`
	// Ahead: its pool slot's app was restored before the request; the
	// deploy raised it to the normal weight.
	Ahead bool `json:"ahead,omitempty"`
	// Fetched: this deploy brought the generation's checkpoint to the
	// node, which held no copy (a first restore on the node); otherwise
	// the restore read the node's copy.
	Fetched bool `json:"fetched,omitempty"`
	// SpareReason says why a restore that found no pool slot of its app
	// took none of the node's idle spare slots (its app does not fit
	// them), when the node had some.
	SpareReason string `json:"spare_reason,omitempty"`
	// Ports maps "6379/tcp" to the address where the instance answers.
	Ports map[string]string `json:"ports,omitempty"`
	// Limits are what the instance may use: its app's resources, the
	// node's defaults elsewhere (the host driver applies none).
	Limits *Limits `json:"limits,omitempty"`
	// Timings are the deploy's phases in order; EngineReadyMS is the
	// engine's own restart-to-ready (or launch-to-ready) as measured
	// inside the instance, when the driver reports it.
	Timings       layering.Timings `json:"timings,omitempty"`
	EngineReadyMS float64          `json:"engine_ready_ms,omitempty"`
	Error         string           `json:"error,omitempty"`
	// Suspension is what a suspended deployment holds (PhaseSuspended),
	// which its resume restores.
	Suspension *Suspension `json:"suspension,omitempty"`
}
