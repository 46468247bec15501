// The hook API's deployments: create, list, read (with long polls), withdraw, and their logs.

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// CreateResponse answers POST /v1/deployments.
type CreateResponse struct {
	ID   string `json:"id"`
	App  string `json:"app"`
	Node string `json:"node"`
	URL  string `json:"url"`
	// Status is, with ?wait, the deployment's status when it settled
	// (Running with its ports, or Failed with its error) or when the wait
	// ended (its phase then says how far it got).
	Status *state.Status `json:"status,omitempty"`
	// Endpoint is where its clients reach it, whatever node it runs on,
	// for as long as it exists (none where the PoP gives no endpoints).
	Endpoint *EndpointAnswer `json:"endpoint,omitempty"`
}

// EndpointAnswer is a deployment's endpoint: any of the PoP's front-end
// addresses, at the deployment's port for each port of its app.
type EndpointAnswer struct {
	Addresses []string       `json:"addresses"`
	Ports     map[string]int `json:"ports"`
}

// MaxWait bounds a create's ?wait.
const MaxWait = 5 * time.Minute

// waitParam reads a create's ?wait: how long to wait for the deployment
// to settle before answering (0: answer at once).
func waitParam(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("wait")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > MaxWait {
		return 0, fieldError("wait", fmt.Sprintf("%q: give a duration from 1ms to %s, e.g. wait=30s", v, MaxWait))
	}
	return d, nil
}

// DecodeCreate reads and validates a create request.
func DecodeCreate(r io.Reader) (scheduler.Request, error) {
	var req scheduler.Request
	data, err := io.ReadAll(io.LimitReader(r, MaxRequestBytes+1))
	if err != nil {
		return req, err
	}
	if len(data) > MaxRequestBytes {
		return req, fmt.Errorf("%w: body is larger than %d bytes", errTooLarge, MaxRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fieldError("body", fmt.Sprintf("not a JSON object of {app, node?, labels?, mode?}: %v", err))
	}
	if dec.More() {
		return req, fieldError("body", "holds more than one JSON value")
	}
	if err := layering.ValidateName("app", req.App); err != nil {
		return req, fieldError("app", err.Error())
	}
	if req.Node != "" {
		if err := layering.ValidateName("node", req.Node); err != nil {
			return req, fieldError("node", err.Error())
		}
	}
	if err := spec.ValidateMode(req.Mode); err != nil {
		return req, fieldError("mode", fmt.Sprintf("%q: %s", req.Mode, spec.ModeHelp))
	}
	if len(req.Labels) > 32 {
		return req, fieldError("labels", "more than 32 labels")
	}
	for k, v := range req.Labels {
		if apiauth.CheckLabelKey(k) != nil || len(v) > 256 {
			return req, fieldError("labels", fmt.Sprintf("label %q: keys are 1-63 characters without spaces or '=', values at most 256", k))
		}
	}
	return req, nil
}

var errTooLarge = errors.New("request too large")

type fieldErr struct{ field, msg string }

func (e *fieldErr) Error() string { return e.field + ": " + e.msg }

func fieldError(field, msg string) error { return &fieldErr{field: field, msg: msg} }

func (h *hooks) create(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
	wait, err := waitParam(r)
	if err != nil {
		h.error(w, err)
		return
	}
	req, err := DecodeCreate(r.Body)
	if err != nil {
		h.error(w, err)
		return
	}
	if err := c.MayCreate(req.App, req.Labels); err != nil {
		h.error(w, err)
		return
	}
	req.Client = c.Name
	// The client's quota of deployments, counted from the agent's view
	// (no read of etcd where it is loaded): creates under way at once
	// on several agents may pass it by as many.
	held, err := h.a.st.DeploymentsOf(r.Context(), c.Name)
	if err == nil {
		err = c.CheckQuota(held)
	}
	if err != nil {
		h.error(w, err)
		return
	}
	// Before anything is written: beyond the client's bound of long
	// polls, the create is refused whole.
	release, ok := h.takeWait(w, c, wait)
	if !ok {
		return
	}
	defer release()
	d, err := scheduler.Create(r.Context(), h.a.st, req, "hook:"+r.RemoteAddr)
	if err != nil {
		h.error(w, err)
		return
	}
	resp := CreateResponse{ID: d.ID, App: d.App, Node: d.Node, URL: "/v1/deployments/" + d.ID}
	if len(d.Endpoint) > 0 {
		addrs, err := h.a.st.FrontendAddresses(r.Context())
		if err != nil && h.a.log != nil {
			h.a.log.Warn("create: reading the front ends' addresses", "err", err)
		}
		resp.Endpoint = &EndpointAnswer{Addresses: addrs, Ports: d.Endpoint}
	}
	if wait > 0 {
		if fd, err := h.follow(r.Context(), d.ID, wait, time.Time{}); err != nil {
			if h.a.log != nil {
				h.a.log.Warn("create: following the deployment it made", "deployment", d.ID, "err", err)
			}
		} else {
			resp.Status = &fd.Status
		}
	}
	w.Header().Set("Location", "/v1/deployments/"+d.ID)
	writeJSON(w, http.StatusCreated, resp)
}

// follow reads deployment id until its status changes after after (with
// after set: a new address, a failure) or settles (without), or wait ends
// (or the caller leaves): it returns the last read, and an error only if
// the deployment could not be read (withdrawn meanwhile, etcd gone).
// The caller holds one of its client's long polls (apiauth.KindWait).
func (h *hooks) follow(ctx context.Context, id string, wait time.Duration, after time.Time) (state.Deployment, error) {
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	d, err := h.a.st.Follow(fctx, id, func(d state.Deployment) bool {
		if !after.IsZero() {
			return d.Status.Updated.After(after)
		}
		return state.Settled(d.Status.Phase)
	})
	if err != nil && fctx.Err() != nil {
		err = nil // the wait ended: the status as it is
	}
	return d, err
}

// list answers the caller's deployments: an admin's all.
func (h *hooks) list(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
	deps, err := h.a.st.Deployments(r.Context())
	if err != nil {
		h.error(w, err)
		return
	}
	mine := deps[:0]
	for _, d := range deps {
		if c.Sees(d.App, d.Client) {
			mine = append(mine, d)
		}
	}
	if mine == nil {
		mine = []state.Deployment{}
	}
	writeJSON(w, http.StatusOK, mine)
}

func (h *hooks) get(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
	id := r.PathValue("id")
	if err := spec.ValidateID(id); err != nil {
		h.error(w, fieldError("id", err.Error()))
		return
	}
	wait, err := waitParam(r)
	if err != nil {
		h.error(w, err)
		return
	}
	after, err := afterParam(r, wait)
	if err != nil {
		h.error(w, err)
		return
	}
	// A long poll, within the client's bound of them: one beyond it is
	// refused before it costs a read.
	release, ok := h.takeWait(w, c, wait)
	if !ok {
		return
	}
	defer release()
	d, err := h.visible(r.Context(), c, id)
	if err != nil {
		h.error(w, err)
		return
	}
	if wait > 0 {
		if d, err = h.follow(r.Context(), id, wait, after); err != nil {
			h.error(w, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, d)
}

// afterParam reads a GET's ?after: the status.updated the caller holds, so
// that a long poll (?wait) answers at the status's next change.
func afterParam(r *http.Request, wait time.Duration) (time.Time, error) {
	v := r.URL.Query().Get("after")
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return t, fieldError("after", fmt.Sprintf("%q: give the status.updated of the deployment as you read it (RFC 3339)", v))
	}
	if wait == 0 {
		return t, fieldError("after", "comes with wait, e.g. ?wait=60s&after="+v)
	}
	return t, nil
}

func (h *hooks) remove(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
	id := r.PathValue("id")
	if err := spec.ValidateID(id); err != nil {
		h.error(w, fieldError("id", err.Error()))
		return
	}
	if !c.Admin {
		if _, err := h.visible(r.Context(), c, id); err != nil {
			h.error(w, err)
			return
		}
	}
	if err := scheduler.Undeploy(r.Context(), h.a.st, h.a.store, id); err != nil {
		h.error(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"id": id, "status": "undeploying"})
}

func (h *hooks) logs(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
	id := r.PathValue("id")
	if err := spec.ValidateID(id); err != nil {
		h.error(w, fieldError("id", err.Error()))
		return
	}
	n := 100
	if s := r.URL.Query().Get("tail"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 10000 {
			h.error(w, fieldError("tail", "give a number of lines between 1 and 10000"))
			return
		}
		n = v
	}
	// An admin reads the node's record as before (also of a deployment
	// withdrawn meanwhile); a client only one of its deployments.
	if !c.Admin {
		if _, err := h.visible(r.Context(), c, id); err != nil {
			h.error(w, err)
			return
		}
	}
	lines, err := h.a.d.Records().Logs(r.Context(), id, n)
	if err != nil {
		h.error(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "node": h.a.c.Node.Name, "lines": lines})
}
