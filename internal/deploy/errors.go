package deploy

import "errors"

// Errors of the lifecycle. They are wrapped together with the cause, so
// callers branch with errors.Is. The spec's (spec.ErrInvalidSpec,
// spec.ErrNotFound, spec.ErrExists, spec.ErrBusy) and the drivers' are used
// as they are.
var (
	// ErrNoCheckpoint: the app has no complete checkpoint generation.
	ErrNoCheckpoint = errors.New("no checkpoint")
	// ErrUntrusted: a host driver that cannot bound its instances runs
	// only apps marked trusted.
	ErrUntrusted = errors.New("this host driver runs only trusted apps")
	// ErrNotSuspendable: a deployment that cannot be suspended (not
	// running, booted without an engine).
	ErrNotSuspendable = errors.New("cannot be suspended")
)
