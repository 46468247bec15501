// The hook API's suspend, resume and migration of a deployment.

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// ResumeRequest is the body of a resume: the node to resume on (none: the
// PoP places it, as a create).
type ResumeRequest struct {
	Node string `json:"node,omitempty"`
}

// DecodeResume reads and validates a resume request (an empty body is
// one without a node).
func DecodeResume(r io.Reader) (ResumeRequest, error) {
	var req ResumeRequest
	data, err := io.ReadAll(io.LimitReader(r, MaxRequestBytes+1))
	if err != nil {
		return req, err
	}
	if len(data) > MaxRequestBytes {
		return req, fmt.Errorf("%w: body is larger than %d bytes", errTooLarge, MaxRequestBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return req, nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fieldError("body", fmt.Sprintf("not a JSON object of {node?}: %v", err))
	}
	if dec.More() {
		return req, fieldError("body", "holds more than one JSON value")
	}
	if req.Node != "" {
		if err := layering.ValidateName("node", req.Node); err != nil {
			return req, fieldError("node", err.Error())
		}
	}
	return req, nil
}

// suspendDone: a suspend's wait ends once the deployment is Suspended or
// Failed; a resume's once it runs again, failed, or is Suspended with why
// its resume failed.
func suspendDone(d state.Deployment) bool {
	return d.Status.Phase == spec.PhaseSuspended || d.Status.Phase == spec.PhaseFailed
}

func resumeDone(d state.Deployment) bool {
	p := d.Status.Phase
	return p == spec.PhaseRunning || p == spec.PhaseFailed || p == spec.PhaseSuspended && d.Status.Error != ""
}

// suspend answers POST /v1/deployments/{id}/suspend[?wait=D].
func (h *hooks) suspend(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
	h.lifecycle(w, r, c, suspendDone, func(ctx context.Context, id string) (state.Deployment, error) {
		return h.a.st.RequestSuspend(ctx, id)
	})
}

// resume answers POST /v1/deployments/{id}/resume[?wait=D] with an
// optional body {"node": N}.
func (h *hooks) resume(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
	h.lifecycle(w, r, c, resumeDone, func(ctx context.Context, id string) (state.Deployment, error) {
		req, err := DecodeResume(r.Body)
		if err != nil {
			return state.Deployment{}, err
		}
		return h.a.st.RequestResume(ctx, id, req.Node, nil)
	})
}

// lifecycle answers a request that asks act of one deployment: 202 with
// the deployment, followed until done with ?wait.
func (h *hooks) lifecycle(w http.ResponseWriter, r *http.Request, c *apiauth.Client, done func(state.Deployment) bool,
	act func(context.Context, string) (state.Deployment, error)) {
	id, wait, ok := h.lifecycleRequest(w, r, c)
	if !ok {
		return
	}
	d, err := act(r.Context(), id)
	if err != nil {
		h.error(w, err)
		return
	}
	if wait > 0 {
		fctx, cancel := context.WithTimeout(r.Context(), wait)
		fd, err := h.a.st.Follow(fctx, d.ID, done)
		cancel()
		if err == nil || fctx.Err() != nil {
			d = fd
		}
	}
	writeJSON(w, http.StatusAccepted, d)
}

// migrate answers POST /v1/deployments/{id}/migrate with an optional body
// {"node": N} once the deployment runs on the other node (200 with what
// moved), or with why it did not (it runs where it was, or stays
// Suspended, as the error says). A caller that leaves does not stop it.
func (h *hooks) migrate(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
	id, _, ok := h.lifecycleRequest(w, r, c)
	if !ok {
		return
	}
	req, err := DecodeResume(r.Body)
	if err != nil {
		h.error(w, err)
		return
	}
	// Held until the migration ends, which its caller's leaving does not
	// stop: a client cannot start more than its bound.
	release, ok := h.take(w, c, apiauth.KindMigration)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), MaxWait)
	defer cancel()
	m, err := scheduler.Migrate(ctx, h.a.st, id, req.Node)
	if err != nil {
		h.error(w, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// lifecycleRequest checks a suspend's or a resume's ID, wait and scope.
func (h *hooks) lifecycleRequest(w http.ResponseWriter, r *http.Request, c *apiauth.Client) (id string, wait time.Duration, ok bool) {
	id = r.PathValue("id")
	if err := spec.ValidateID(id); err != nil {
		h.error(w, fieldError("id", err.Error()))
		return "", 0, false
	}
	wait, err := waitParam(r)
	if err != nil {
		h.error(w, err)
		return "", 0, false
	}
	if !c.Admin {
		if _, err := h.visible(r.Context(), c, id); err != nil {
			h.error(w, err)
			return "", 0, false
		}
	}
	return id, wait, true
}
