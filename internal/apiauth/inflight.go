package apiauth

import (
	"errors"
	"fmt"
	"sync"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// ErrTooMany: a client has as many requests of a kind under way as its
// token allows (429).
var ErrTooMany = errors.New("too many requests under way")

// Kind is a request that holds the agent's resources while it lasts.
type Kind string

// Kinds of bounded requests.
const (
	// KindWait is a long poll (?wait) of a create or a read: it holds a
	// watch of the deployment until it settles or the wait ends.
	KindWait Kind = "wait"
	// KindMigration is a migration: it goes on after its caller leaves,
	// and moves an instance's whole state.
	KindMigration Kind = "migration"
)

// Kinds are every Kind, in order.
var Kinds = []Kind{KindWait, KindMigration}

// Bounds a client without its own (an admin: none).
const (
	DefaultWaits       = 16
	DefaultMigrations  = 2
	DefaultDeployments = 64
	maxInflight        = 10000
)

// DeploymentQuota is how many deployments the client may hold at once;
// 0 is no bound (an admin that gives none).
func (c *Client) DeploymentQuota() int {
	if c.Deployments == 0 && !c.Admin {
		return DefaultDeployments
	}
	return c.Deployments
}

// CheckQuota refuses, wrapping ErrTooMany with a hint, a create by a
// client that holds held deployments already.
func (c *Client) CheckQuota(held int) error {
	if q := c.DeploymentQuota(); q > 0 && held >= q {
		return hint.With(fmt.Errorf("client %s: %w: it holds %d deployment(s), its quota", c.Name, ErrTooMany, held),
			"undeploy one of its deployments first, or raise deployments in the client's entry of the tokens file")
	}
	return nil
}

// Bound is how many requests of kind k the client may have under way at
// once; 0 is no bound (an admin that gives none).
func (c *Client) Bound(k Kind) int {
	n, def := c.Waits, DefaultWaits
	if k == KindMigration {
		n, def = c.Migrations, DefaultMigrations
	}
	if n == 0 && !c.Admin {
		n = def
	}
	return n
}

// Inflight counts each client's requests under way by kind, and refuses
// one beyond the client's bound. The zero value is ready; Changed, if
// set, is called with every new count (the agent's gauge).
type Inflight struct {
	Changed func(client string, k Kind, n int)

	mu sync.Mutex
	n  map[inflightKey]int
}

type inflightKey struct {
	client string
	kind   Kind
}

// Take counts one request of kind k for client c, and returns its release
// (call it once, when the request ends); beyond c's bound it counts
// nothing and returns an error wrapping ErrTooMany, with a hint.
func (f *Inflight) Take(c *Client, k Kind) (release func(), err error) {
	key := inflightKey{c.Name, k}
	bound := c.Bound(k)
	f.mu.Lock()
	if f.n == nil {
		f.n = map[inflightKey]int{}
	}
	if bound > 0 && f.n[key] >= bound {
		f.mu.Unlock()
		return nil, hint.With(fmt.Errorf("client %s: %w: %d %s request(s) at once at the most", c.Name, ErrTooMany, bound, k),
			fmt.Sprintf("wait until one of its %s requests ends (a long poll returns at its wait), or raise %s in the client's entry of the tokens file", k, boundField(k)))
	}
	f.n[key]++
	n := f.n[key]
	f.mu.Unlock()
	f.changed(key, n)
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.n[key]--
			n := f.n[key]
			if n == 0 {
				delete(f.n, key)
			}
			f.mu.Unlock()
			f.changed(key, n)
		})
	}, nil
}

// InUse is how many requests of kind k client has under way.
func (f *Inflight) InUse(client string, k Kind) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[inflightKey{client, k}]
}

func (f *Inflight) changed(key inflightKey, n int) {
	if f.Changed != nil {
		f.Changed(key.client, key.kind, n)
	}
}

// boundField is the tokens file's field of kind k's bound.
func boundField(k Kind) string {
	if k == KindMigration {
		return "migrations"
	}
	return "waits"
}
