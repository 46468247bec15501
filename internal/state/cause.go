package state

import (
	"context"
	"errors"
	"syscall"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// Classes of Status.Cause: why a deployment Failed, as a client acts on it.
const (
	// CauseUnavailable: Ceph, dockerd or etcd did not serve in time, or
	// the pool or the node's disk is full. Deploying again can work once
	// the service is back.
	CauseUnavailable = "unavailable"
	// CauseInvalid: the app's spec or environment cannot work as given.
	CauseInvalid = "invalid"
	// CauseNotFound: something the deployment names is gone.
	CauseNotFound = "not_found"
)

// CauseOf classes an error by the sentinels it wraps (one of the Cause
// constants, or "" for none): the agent records it with a failure, and
// fogctl turns it into its exit code, so that an error means the same in
// both. When an error wraps more than one class, invalid comes first, then
// not found, then unavailable.
func CauseOf(err error) string {
	switch {
	case errors.Is(err, layering.ErrInvalid), errors.Is(err, spec.ErrInvalidSpec):
		return CauseInvalid
	case errors.Is(err, layering.ErrNotFound), errors.Is(err, ErrNotFound), errors.Is(err, spec.ErrNotFound):
		return CauseNotFound
	case errors.Is(err, layering.ErrUnavailable), errors.Is(err, layering.ErrFull), errors.Is(err, mapper.ErrStalled),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrUnavailable),
		errors.Is(err, ErrContended):
		return CauseUnavailable
	}
	return ""
}
