package apiauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Keyring is the clients an agent accepts.
type Keyring struct {
	clients []*Client
}

// NewKeyring holds clients (the operator's and the tokens file's), each
// with its own rate limiter. Two clients with one name or one token are
// refused.
func NewKeyring(clients ...Client) (*Keyring, error) {
	k := &Keyring{}
	names := map[string]bool{}
	sums := map[[sha256.Size]byte]string{}
	for _, c := range clients {
		if names[c.Name] {
			return nil, fmt.Errorf("client %s: two clients have this name: %w", c.Name, layering.ErrInvalid)
		}
		if other, ok := sums[c.sum]; ok {
			return nil, fmt.Errorf("clients %s and %s have the same token: mint one per client: %w", other, c.Name, layering.ErrInvalid)
		}
		names[c.Name], sums[c.sum] = true, c.Name
		if r, b := c.Limits(); r > 0 {
			c.lim = rate.NewLimiter(rate.Limit(r), b)
		}
		k.clients = append(k.clients, &c)
	}
	if len(k.clients) == 0 {
		return nil, fmt.Errorf("no client: %w", layering.ErrInvalid)
	}
	return k, nil
}

// Authenticate returns the client whose token is token, comparing its
// SHA-256 with every client's in constant time (no early exit), or
// ErrUnauthorized.
func (k *Keyring) Authenticate(token string) (*Client, error) {
	if token == "" {
		return nil, ErrUnauthorized
	}
	sum := sha256.Sum256([]byte(token))
	var found *Client
	for _, c := range k.clients {
		if subtle.ConstantTimeCompare(sum[:], c.sum[:]) == 1 {
			found = c
		}
	}
	if found == nil {
		return nil, ErrUnauthorized
	}
	return found, nil
}

// BearerToken is the token of an Authorization header ("Bearer TOKEN"),
// or "".
func BearerToken(header string) string {
	t, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(t)
}

// Allow takes one request from the client's rate at now; refused, it says
// after how long the next one will be allowed.
func (c *Client) Allow(now time.Time) (time.Duration, bool) {
	if c.lim == nil {
		return 0, true
	}
	r := c.lim.ReserveN(now, 1)
	if !r.OK() {
		return time.Second, false
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}

// MayApp says whether the client may deploy and see app.
func (c *Client) MayApp(app string) bool {
	return c.Admin || slices.Contains(c.Apps, AllApps) || slices.Contains(c.Apps, app)
}

// Sees says whether a deployment of app created by creator (a client's
// name, "" for fogctl's and --dev's) is the client's to see, delete,
// suspend and move: an admin's always; else one of its apps that it
// created itself. Another client's deployment of the same app is never
// its: scoped to an app, a client still acts for its own users only.
func (c *Client) Sees(app, creator string) bool {
	if c.Admin {
		return true
	}
	return c.MayApp(app) && creator == c.Name
}

// MayCreate checks a create of app with labels against the client's
// scope; the error wraps ErrForbidden and says what is allowed.
func (c *Client) MayCreate(app string, labels map[string]string) error {
	if !c.MayApp(app) {
		return hint.With(fmt.Errorf("app %s: %w: client %s may deploy %s only", app, ErrForbidden, c.Name, strings.Join(c.Apps, ", ")),
			"use a token of a client whose apps hold it (apps in agent.tokens_file)")
	}
	if c.Label != "" && labels[c.Label] == "" {
		return hint.With(fmt.Errorf("labels.%s is missing: %w: client %s creates deployments with a value of labels.%s only", c.Label, ErrForbidden, c.Name, c.Label),
			fmt.Sprintf(`give "labels": {%q: "..."} in the body, e.g. the user's ID`, c.Label))
	}
	return nil
}

// MayReadMetrics says whether the client may read /metrics.
func (c *Client) MayReadMetrics() bool { return c.Admin || c.Metrics }

// Names are the clients' names, sorted (for logs).
func (k *Keyring) Names() []string {
	set := map[string]bool{}
	for _, c := range k.clients {
		set[c.Name] = true
	}
	return slices.Sorted(maps.Keys(set))
}
