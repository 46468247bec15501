package spec

import (
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Suspension is what a suspended instance left in the cluster: its
// memory and its file-system changes, each sealed as a snapshot of an RBD
// image of its own, which a resume on any node of the PoP restores.
type Suspension struct {
	// From is the generation the instance was restored from: a resume
	// reads its environment (and, with Upper, the node's copy of it).
	From Generation `json:"from"`
	// Engine is the engine that checkpointed it; CkptGen the generation
	// number its checkpoint was written as (inside Ckpt's image).
	Engine  engine.Name `json:"engine"`
	CkptGen int         `json:"ckpt_gen"`
	// Env is its writable image, sealed: with Upper, the overlay's upper
	// layer over From's environment; otherwise its whole root.
	Env   layering.SnapRef `json:"env"`
	Upper bool             `json:"upper,omitempty"`
	// Parents are the images Env is a clone of (an instance suspended
	// after a resume), nearest first.
	Parents []string `json:"parents,omitempty"`
	// Ckpt is the image of its checkpoint (a directory CkptGen in it).
	Ckpt layering.SnapRef `json:"ckpt"`
	// Hold is a clone of From's environment that keeps the generation in
	// use while the instance is suspended ("" without Upper).
	Hold string `json:"hold,omitempty"`
	// Bytes is the size of the checkpoint; EnvBytes what its writable
	// image holds.
	Bytes    int64 `json:"bytes"`
	EnvBytes int64 `json:"env_bytes,omitempty"`
	// Node is where it was suspended, and Created when.
	Node    string    `json:"node"`
	Created time.Time `json:"created"`
	// Timings are the suspend's phases.
	Timings layering.Timings `json:"timings,omitempty"`
	// Pending names the node that holds the only copy of its checkpoint
	// while Ckpt's image is written behind a migration's hand-over (its
	// target reads the checkpoint from that node); "" once Ckpt is sealed
	// (durable).
	Pending string `json:"pending,omitempty"`
}

// Images are the RBD images a suspension holds, in the order they can be
// removed.
func (s Suspension) Images() []string {
	imgs := append([]string{s.Ckpt.Image, s.Env.Image}, s.Parents...)
	if s.Hold != "" {
		imgs = append(imgs, s.Hold)
	}
	return imgs
}
