package spec

import (
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Generation is a checkpoint of an app: a sealed environment image and a
// sealed checkpoint image, restorable on any node of the PoP.
type Generation struct {
	App string `json:"app"`
	Gen int    `json:"gen"`
	// Env is the environment's name and EnvFrom the snapshot it was cloned
	// from at boot.
	Env     string           `json:"env"`
	EnvFrom layering.SnapRef `json:"env_from"`
	// EnvSnap and CkptSnap are the sealed snapshots every restore clones.
	EnvSnap  layering.SnapRef `json:"env_snap"`
	CkptSnap layering.SnapRef `json:"ckpt_snap"`
	Engine   engine.Name      `json:"engine"`
	// EngineVersion is the engine's version; Driver the driver that ran it.
	EngineVersion string `json:"engine_version,omitempty"`
	Driver        string `json:"driver"`
	// Bytes is the size of the engine's image; CheckpointMS how long
	// writing it took.
	Bytes        int64   `json:"bytes"`
	CheckpointMS float64 `json:"checkpoint_ms"`
	// BootReadyMS is how long the app took from start to ready at boot.
	BootReadyMS float64          `json:"boot_ready_ms"`
	Node        string           `json:"node,omitempty"`
	Created     time.Time        `json:"created"`
	Timings     layering.Timings `json:"timings"`
	Spec        App              `json:"spec"`
	// EnvConfig is the environment's ENV and WORKDIR as the checkpointed
	// app was launched with them; every restore uses it, whatever the
	// environment's tag says since. Nil for generations sealed before it
	// was recorded: their restores use the environment's current one.
	EnvConfig *layering.ImageConfig `json:"env_config,omitempty"`
	// Platform is the checkpointing node's: what a restoring node must
	// match (restorableOn). Nil for generations sealed before it was
	// recorded.
	Platform *Platform `json:"platform,omitempty"`
	// Retired: its removal was asked while nodes held copies of it; no
	// deploy restores it any more, and it goes once they dropped them.
	// Read from the checkpoint image's metadata, not from the record.
	Retired bool `json:"-"`
}
