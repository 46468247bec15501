// The hook API: its routes, its clients' authentication, scope and bounds, and its errors.

package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/placement"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/scheduler"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// MaxRequestBytes bounds a hook request body.
const MaxRequestBytes = 16 << 10

// hooks is the redeployment hook API for mobile-app backends (docs/api.md),
// and the credentials of the agent's /healthz and /metrics.
type hooks struct {
	a *agent
	// keys are the clients of the agent's token files; nil only with
	// --dev and no token: every caller is then an admin.
	keys *apiauth.Keyring
	// openMetrics serves /metrics without a token (--dev).
	openMetrics bool
	// now is the clock of the rate limits (time.Now if nil).
	now func() time.Time
	// inflight bounds each client's long polls and migrations under way.
	inflight apiauth.Inflight
}

// authed is a handler of a caller that authenticated as c.
type authed func(w http.ResponseWriter, r *http.Request, c *apiauth.Client)

func (h *hooks) register(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/deployments", h.auth(h.acting(h.create)))
	mux.HandleFunc("GET /v1/deployments", h.auth(h.list))
	mux.HandleFunc("GET /v1/deployments/{id}", h.auth(h.get))
	mux.HandleFunc("DELETE /v1/deployments/{id}", h.auth(h.acting(h.remove)))
	mux.HandleFunc("GET /v1/deployments/{id}/logs", h.auth(h.logs))
	mux.HandleFunc("POST /v1/deployments/{id}/suspend", h.auth(h.acting(h.suspend)))
	mux.HandleFunc("POST /v1/deployments/{id}/resume", h.auth(h.acting(h.resume)))
	mux.HandleFunc("POST /v1/deployments/{id}/migrate", h.auth(h.acting(h.migrate)))
}

// acting admits a request that changes the PoP (a create, a delete, a
// suspend, a resume, a migration) only while the agent may act on etcd's
// word: while it is fenced (plane.go), it writes nothing into an etcd
// that is not the one it knew, and answers 503 with why and what to do.
func (h *hooks) acting(next authed) authed {
	return func(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
		if h.a != nil && h.a.plane != nil {
			if err := h.a.plane.err(); err != nil {
				w.Header().Set("Retry-After", "30")
				h.error(w, err)
				return
			}
		}
		next(w, r, c)
	}
}

// apiError is the body of every error response.
type apiError struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
	Hint  string `json:"hint,omitempty"`
}

// client authenticates r's bearer token: the caller's client, or
// ErrUnauthorized. Without keys (--dev without a token), an admin.
func (h *hooks) client(r *http.Request) (*apiauth.Client, error) {
	if h.keys == nil {
		return &apiauth.Client{Admin: true}, nil
	}
	return h.keys.Authenticate(apiauth.BearerToken(r.Header.Get("Authorization")))
}

// auth admits a request of a known token within its client's rate: 401
// without one, 429 (with Retry-After) beyond the rate. Nothing else runs
// for a refused request.
func (h *hooks) auth(next authed) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := h.client(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fogdeploy"`)
			writeJSON(w, http.StatusUnauthorized, apiError{Error: "missing or unknown bearer token",
				Hint: "send Authorization: Bearer <a token of the agent's agent.tokens_file or agent.token_file>"})
			return
		}
		now := time.Now()
		if h.now != nil {
			now = h.now()
		}
		if wait, ok := c.Allow(now); !ok {
			secs := max(1, int(math.Ceil(wait.Seconds())))
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			rate, burst := c.Limits()
			writeJSON(w, http.StatusTooManyRequests, apiError{Error: fmt.Sprintf("client %s: over its rate limit of %g requests per second (burst %d)", c.Name, rate, burst),
				Hint: fmt.Sprintf("retry after %d s; the rate and burst of the client are in the agent's tokens file", secs)})
			if h.a != nil && h.a.log != nil {
				h.a.log.Debug("hook API: rate limit", "client", c.Name, "path", r.URL.Path)
			}
			return
		}
		next(w, r, c)
	}
}

// take counts one request of kind k for client c (h.inflight), or answers
// the 429 of a client beyond its bound; release it once the request ends.
func (h *hooks) take(w http.ResponseWriter, c *apiauth.Client, k apiauth.Kind) (release func(), ok bool) {
	release, err := h.inflight.Take(c, k)
	if err != nil {
		h.error(w, err)
		return nil, false
	}
	return release, true
}

// takeWait takes one of c's long polls when the request waits (wait > 0),
// as take does; a request that does not wait takes nothing.
func (h *hooks) takeWait(w http.ResponseWriter, c *apiauth.Client, wait time.Duration) (release func(), ok bool) {
	if wait <= 0 {
		return func() {}, true
	}
	return h.take(w, c, apiauth.KindWait)
}

// forbidden is the 403 error of a client outside its scope.
func forbidden(err error, c *apiauth.Client) error {
	return hint.With(err, fmt.Sprintf("the token of client %s reaches the deployments of its apps that it created only (agent.tokens_file); use that client's own deployments, or an admin's token", c.Name))
}

// visible reads deployment id for c: 404 if there is none, 403 if it is
// not c's.
func (h *hooks) visible(ctx context.Context, c *apiauth.Client, id string) (state.Deployment, error) {
	d, err := h.a.st.Deployment(ctx, id)
	if err != nil {
		return d, err
	}
	if !c.Sees(d.App, d.Client) {
		return d, forbidden(fmt.Errorf("deployment %s: %w: not one of client %s's", id, apiauth.ErrForbidden, c.Name), c)
	}
	return d, nil
}

// healthz answers GET /healthz: the full body of full() to a caller with
// a token (or to anyone without keys); to others its status only (ok or
// degraded, and etcd's state), the node's name and the version: nothing
// that names an app or a deployment.
func (h *hooks) healthz(full func() map[string]any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body := full()
		if _, err := h.client(r); err != nil {
			body = map[string]any{"status": body["status"], "etcd": body["etcd"], "node": body["node"], "version": body["version"]}
		}
		writeJSON(w, http.StatusOK, body)
	}
}

// metrics guards /metrics, whose series carry app names: an admin's token
// or one with metrics: true, unless openMetrics (--dev).
func (h *hooks) metrics(next http.Handler) http.HandlerFunc {
	if h.openMetrics {
		return next.ServeHTTP
	}
	return h.auth(func(w http.ResponseWriter, r *http.Request, c *apiauth.Client) {
		if !c.MayReadMetrics() {
			writeJSON(w, http.StatusForbidden, apiError{Error: fmt.Sprintf("client %s may not read /metrics: %s", c.Name, apiauth.ErrForbidden),
				Hint: "its series name the node's apps: give the client metrics: true in agent.tokens_file, or use an admin's token"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (h *hooks) error(w http.ResponseWriter, err error) {
	var fe *fieldErr
	body := apiError{Error: err.Error()}
	body.Hint = hint.Of(err)
	code := http.StatusInternalServerError
	switch {
	case errors.As(err, &fe):
		code, body.Field, body.Error = http.StatusBadRequest, fe.field, fe.msg
	case errors.Is(err, apiauth.ErrForbidden):
		code = http.StatusForbidden
	case errors.Is(err, errTooLarge):
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, apiauth.ErrTooMany):
		code = http.StatusTooManyRequests
	case errors.Is(err, state.ErrNotFound), errors.Is(err, spec.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, state.ErrExists), errors.Is(err, state.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, placement.ErrNoNode), errors.Is(err, state.ErrContended), errors.Is(err, scheduler.ErrNotMoved):
		code = http.StatusServiceUnavailable
	case errors.Is(err, state.ErrUnavailable), errors.Is(err, state.ErrFenced):
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, body)
}
