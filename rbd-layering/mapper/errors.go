package mapper

import "errors"

// Sentinel errors. Every error returned by this package that belongs to one
// of these classes wraps it (test with errors.Is), next to the underlying
// command error and its stderr, with the image or mapping named in the
// message and a one-line hint after "hint:".
var (
	// ErrInvalid: a Config field, an Image or a mapping ID failed
	// validation.
	ErrInvalid = errors.New("invalid argument")
	// ErrNoBackend: Backend "auto" found no usable backend on this node
	// (no krbd, no nbd, no rbd-fuse + loop).
	ErrNoBackend = errors.New("no usable mapping backend")
	// ErrBackendUnavailable: the backend named in Config.Backend failed its
	// probe on this node (tool or kernel module missing).
	ErrBackendUnavailable = errors.New("mapping backend unavailable")
	// ErrNotMapped: no mapping record has that ID (never mapped, or already
	// released or recovered).
	ErrNotMapped = errors.New("not mapped")
	// ErrImageNotFound: the pool, image or snapshot does not exist.
	ErrImageNotFound = errors.New("image not found")
	// ErrBusy: the resource is in use: a mapping ID is taken, a mount
	// target is already a mount point, a filesystem cannot be unmounted
	// because files are open, or a record belongs to a running process.
	ErrBusy = errors.New("busy")
	// ErrUnsupported: the backend cannot do this, e.g. rbd-fuse cannot
	// expose a snapshot.
	ErrUnsupported = errors.New("not supported by this backend")
	// ErrStalled: the image's I/O did not answer within Config.Timeout
	// (the cluster does not serve it: OSDs down, or the pool full). The
	// mapping's I/O was cut off so that nothing stays blocked on it.
	ErrStalled = errors.New("image I/O stalled")
)
