package layering

import "errors"

// Sentinel errors. Implementations wrap them together with the underlying
// library error, so both errors.Is(err, ErrNotFound) and errno checks work.
var (
	// ErrNotFound: the image, snapshot or environment does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: an image, snapshot or environment of that name exists.
	ErrExists = errors.New("already exists")
	// ErrHasChildren: a snapshot still has clones.
	ErrHasChildren = errors.New("has children")
	// ErrBusy: the image is mapped or open elsewhere (RBD watchers).
	ErrBusy = errors.New("in use")
	// ErrInvalid: an argument failed validation.
	ErrInvalid = errors.New("invalid argument")
	// ErrTooDeep: the clone chain is past the hard depth limit.
	ErrTooDeep = errors.New("clone chain too deep")
	// ErrUnavailable: the cluster could not be reached in time.
	ErrUnavailable = errors.New("storage unavailable")
	// ErrBuildStep: a build step failed.
	ErrBuildStep = errors.New("build step failed")
	// ErrFull: the pool is full (its quota is used up, or an OSD is past
	// its full ratio): writes are not served until space is freed.
	ErrFull = errors.New("pool full")
	// ErrConflict: a record changed between a command's read of it and
	// its write (another command wrote it meanwhile).
	ErrConflict = errors.New("changed meanwhile")
)
