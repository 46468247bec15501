package agent

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// MaxRequestBytes bounds a hook request body.
const MaxRequestBytes = 16 << 10

// hooks is the redeployment hook API for mobile-app backends (docs/api.md).
type hooks struct {
	a     *agent
	token string // "" only with --dev
}

func (h *hooks) register(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/deployments", h.auth(h.create))
	mux.HandleFunc("GET /v1/deployments", h.auth(h.list))
	mux.HandleFunc("GET /v1/deployments/{id}", h.auth(h.get))
	mux.HandleFunc("DELETE /v1/deployments/{id}", h.auth(h.remove))
	mux.HandleFunc("GET /v1/deployments/{id}/logs", h.auth(h.logs))
}

// apiError is the body of every error response.
type apiError struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
	Hint  string `json:"hint,omitempty"`
}

func (h *hooks) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(h.token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="fogdeploy"`)
				writeJSON(w, http.StatusUnauthorized, apiError{Error: "missing or wrong bearer token", Hint: "send Authorization: Bearer <the agent's token>"})
				return
			}
		}
		next(w, r)
	}
}

// CreateResponse answers POST /v1/deployments.
type CreateResponse struct {
	ID   string `json:"id"`
	App  string `json:"app"`
	Node string `json:"node"`
	URL  string `json:"url"`
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
	if err := deploy.ValidateMode(req.Mode); err != nil {
		return req, fieldError("mode", fmt.Sprintf("%q: %s", req.Mode, deploy.ModeHelp))
	}
	if len(req.Labels) > 32 {
		return req, fieldError("labels", "more than 32 labels")
	}
	for k, v := range req.Labels {
		if k == "" || len(k) > 63 || len(v) > 256 || strings.ContainsAny(k, " \t\n=") {
			return req, fieldError("labels", fmt.Sprintf("label %q: keys are 1-63 characters without spaces or '=', values at most 256", k))
		}
	}
	return req, nil
}

var errTooLarge = errors.New("request too large")

type fieldErr struct{ field, msg string }

func (e *fieldErr) Error() string { return e.field + ": " + e.msg }

func fieldError(field, msg string) error { return &fieldErr{field: field, msg: msg} }

func (h *hooks) create(w http.ResponseWriter, r *http.Request) {
	req, err := DecodeCreate(r.Body)
	if err != nil {
		h.error(w, err)
		return
	}
	d, err := scheduler.Create(r.Context(), h.a.st, req, "hook:"+r.RemoteAddr)
	if err != nil {
		h.error(w, err)
		return
	}
	w.Header().Set("Location", "/v1/deployments/"+d.ID)
	writeJSON(w, http.StatusCreated, CreateResponse{ID: d.ID, App: d.App, Node: d.Node, URL: "/v1/deployments/" + d.ID})
}

func (h *hooks) list(w http.ResponseWriter, r *http.Request) {
	deps, err := h.a.st.Deployments(r.Context())
	if err != nil {
		h.error(w, err)
		return
	}
	writeJSON(w, http.StatusOK, deps)
}

func (h *hooks) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := deploy.ValidateID(id); err != nil {
		h.error(w, fieldError("id", err.Error()))
		return
	}
	d, err := h.a.st.Deployment(r.Context(), id)
	if err != nil {
		h.error(w, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (h *hooks) remove(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := deploy.ValidateID(id); err != nil {
		h.error(w, fieldError("id", err.Error()))
		return
	}
	if err := h.a.st.DeleteDeployment(r.Context(), id); err != nil {
		h.error(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"id": id, "status": "undeploying"})
}

func (h *hooks) logs(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := deploy.ValidateID(id); err != nil {
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
	lines, err := h.a.d.Logs(r.Context(), id, n)
	if err != nil {
		h.error(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "node": h.a.c.Node.Name, "lines": lines})
}

func (h *hooks) error(w http.ResponseWriter, err error) {
	var fe *fieldErr
	body := apiError{Error: err.Error()}
	body.Hint = hint.Of(err)
	code := http.StatusInternalServerError
	switch {
	case errors.As(err, &fe):
		code, body.Field, body.Error = http.StatusBadRequest, fe.field, fe.msg
	case errors.Is(err, errTooLarge):
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, state.ErrNotFound), errors.Is(err, deploy.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, state.ErrExists):
		code = http.StatusConflict
	case errors.Is(err, state.ErrNoNode), errors.Is(err, state.ErrContended):
		code = http.StatusServiceUnavailable
	case errors.Is(err, state.ErrUnavailable):
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, body)
}
