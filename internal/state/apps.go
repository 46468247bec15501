// The apps' records: a spec per app, its costs removed with it.

package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// CreateApp stores a new app; ErrExists if the name is taken (unless
// replace).
func (s *Store) CreateApp(ctx context.Context, a spec.App, replace bool) error {
	a = a.WithDefaults()
	if err := a.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	// The first app of a PoP records the PoP's identity, if no agent did.
	if _, _, err := s.EnsurePoP(ctx); err != nil {
		return err
	}
	if replace {
		var old spec.App
		oldErr := getJSON(ctx, s.cli, appKey(a.Name), &old)
		if oldErr != nil && !errors.Is(oldErr, ErrNotFound) {
			return oldErr
		}
		if _, err = s.cli.Put(ctx, appKey(a.Name), string(b)); err != nil {
			return wrapUnavailable(err)
		}
		if oldErr == nil && sameBoot(old, a) {
			return nil // its pool size, mode, labels or resources: boots cost as before
		}
		// Another process boots another way: measure boots afresh.
		if err := s.resetCosts(ctx, a.Name, func(c *adaptive.Costs) { c.Boot = nil }); err != nil {
			return fmt.Errorf("app %s is replaced, but its boot costs are not reset: %w", a.Name, err)
		}
		return nil
	}
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(appKey(a.Name)), "=", 0)).
		Then(clientv3.OpPut(appKey(a.Name), string(b))).Commit()
	if err != nil {
		return wrapUnavailable(err)
	}
	if !r.Succeeded {
		return hint.With(fmt.Errorf("app %s: %w", a.Name, ErrExists), "use --replace to change its spec")
	}
	return nil
}

// App returns an app.
func (s *Store) App(ctx context.Context, name string) (spec.App, error) {
	var a spec.App
	if err := getJSON(ctx, s.cli, appKey(name), &a); err != nil {
		if errors.Is(err, ErrNotFound) {
			return a, appNotFound(name)
		}
		return a, err
	}
	return a, nil
}

func appNotFound(name string) error {
	return hint.With(fmt.Errorf("app %s: %w", name, ErrNotFound), "`fogctl app ls` lists the apps; `fogctl app create` adds one")
}

// Apps lists the apps by name.
func (s *Store) Apps(ctx context.Context) ([]spec.App, error) {
	return listJSON[spec.App](ctx, s.cli, AppsPrefix)
}

// DeleteApp removes an app, and what its deploys cost on each node;
// ErrInUse while it has deployments.
func (s *Store) DeleteApp(ctx context.Context, name string) error {
	if _, err := s.App(ctx, name); err != nil {
		return err
	}
	deps, err := s.Deployments(ctx)
	if err != nil {
		return err
	}
	var ids []string
	for _, d := range deps {
		if d.App == name {
			ids = append(ids, d.ID)
		}
	}
	if len(ids) > 0 {
		return hint.With(fmt.Errorf("app %s has %d deployment(s) (%s): %w", name, len(ids), strings.Join(ids, ", "), ErrInUse),
			"undeploy them first with `fogctl undeploy ID`")
	}
	_, err = s.cli.Txn(ctx).Then(clientv3.OpDelete(appKey(name)), clientv3.OpDelete(costsPrefix(name), clientv3.WithPrefix())).Commit()
	return wrapUnavailable(err)
}
