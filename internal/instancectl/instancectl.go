// Package instancectl is the protocol between the agent and the DMTCP
// container's entrypoint: the files of an instance's control directory
// (bound at runtime.DMTCPCtlPath in the container) and what they hold.
//
// The agent writes an order to start a waiting slot, a release to take a
// recycled container's instance back and a rearm once it has reset the
// root; the entrypoint writes its timings, its answer to a release and the
// marker that the identity directory is bound. The app can write into the
// directory: the agent opens these files only through internal/ctlfs.
package instancectl

// Files of the control directory.
const (
	// Order, written by the agent, starts the app of a container
	// created to wait (its JSON body is an Order).
	Order = "order"
	// Timings holds the entrypoint's phase timings as JSON lines, as on
	// its standard output.
	Timings = "timings"
	// Release asks a recyclable container's entrypoint to end its app and
	// give the container back; it answers with Released (a Released
	// body), then waits for Rearm, written once the agent has reset the
	// root, to prepare for the next order.
	Release  = "release"
	Released = "released"
	Rearm    = "rearm"
	// Checkpointed is written by an entrypoint whose checkpoint stopped
	// its app, once the app is gone and just before it exits: a
	// CheckpointedBody. The agent reads it once the container's main
	// process has exited, without waiting for the runtime to report the
	// container's exit.
	Checkpointed = "checkpointed"
	// IdentityDir is bound read-only at the root's /run/fogdeploy
	// (spec.IdentityFile's directory) by an entrypoint that waits for an
	// order, which then writes IdentityBound: the agent writes an
	// instance's identity there, on a node-local file system, not
	// through the root's.
	IdentityDir   = "identity"
	IdentityBound = "identity.bound"
	// Assign, written by the agent, makes a spare container (one created
	// for no app) the restart of one: its JSON body is an AssignBody.
	// The spare's entrypoint reads it before any app runs in it.
	Assign = "assign"
)

// AssignBody is Assign's content: the entrypoint's arguments for the
// restart the spare becomes, its mode first ("restart", then its flags).
type AssignBody struct {
	Args []string `json:"args"`
}

// CheckpointRequest is the file, in the checkpoint directory, whose
// creation asks the entrypoint for a checkpoint (as SIGUSR1 does).
const CheckpointRequest = "checkpoint.request"

// CheckpointedBody is Checkpointed's content: the generation written, its
// size and how long the engine took.
type CheckpointedBody struct {
	Gen   int     `json:"gen"`
	Bytes int64   `json:"bytes"`
	MS    float64 `json:"ms"`
}

// OrderBody is what the agent writes into Order: the instance the slot
// becomes. Every field is optional.
type OrderBody struct {
	Deployment string `json:"deployment,omitempty"`
	Node       string `json:"node,omitempty"`
	// MemoryMerge: the app's processes share their identical pages with
	// other instances' (internal/ksm); a pool slot restored ahead asks it.
	MemoryMerge bool `json:"memory_merge,omitempty"`
	// Lazy: a restart restores the app's memory lazily where its engine
	// can (CRIU's lazy pages), as -lazy does; a resume asks it.
	Lazy bool `json:"lazy,omitempty"`
}

// ReleasedBody is the entrypoint's answer to a release.
type ReleasedBody struct {
	// Error says why the container cannot serve another instance; the
	// agent then removes it.
	Error string `json:"error,omitempty"`
}
