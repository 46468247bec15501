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
// replace). An app served on demand (frontend.on_demand) takes its shared
// endpoint's ports in the same transaction; a replace keeps the ports of
// the app's ports it keeps, and frees the rest.
func (s *Store) CreateApp(ctx context.Context, a spec.App, replace bool) error {
	a = a.WithDefaults()
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Frontend.OnDemand && !s.endpoints.On() {
		return hint.With(fmt.Errorf("app %s: frontend.on_demand: %w: the PoP gives no endpoints", a.Name, spec.ErrInvalidSpec),
			"set pop.frontend.ports (e.g. 20000-29999) in the agents' and fogctl's configuration, or leave on_demand out")
	}
	// The first app of a PoP records the PoP's identity, if no agent did.
	if _, _, err := s.EnsurePoP(ctx); err != nil {
		return err
	}
	// A concurrent create may take a port this one picked: pick again.
	for range 8 {
		done, err := s.putApp(ctx, a, replace)
		if done || err != nil {
			return err
		}
	}
	return hint.With(fmt.Errorf("app %s: %w: the ports picked for its shared endpoint were taken by concurrent creates 8 times", a.Name, ErrNoEndpoint), "try again")
}

// putApp writes app a's record (done false: a port it picked was taken
// meanwhile, or the record changed since it was read).
func (s *Store) putApp(ctx context.Context, a spec.App, replace bool) (done bool, err error) {
	var old appRecord
	oldRev := int64(0)
	r, err := s.cli.Txn(ctx).Then(clientv3.OpGet(appKey(a.Name)),
		clientv3.OpGet(EndpointsPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return false, wrapUnavailable(err)
	}
	if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if !replace {
			return false, hint.With(fmt.Errorf("app %s: %w", a.Name, ErrExists), "use --replace to change its spec")
		}
		if err := json.Unmarshal(kvs[0].Value, &old); err != nil {
			return false, fmt.Errorf("record %s: %w", kvs[0].Key, err)
		}
		oldRev = kvs[0].ModRevision
	}
	taken := map[int]bool{}
	for _, kv := range r.Responses[1].GetResponseRange().Kvs {
		if p, ok := parseEndpointKey(string(kv.Key)); ok {
			taken[p] = true
		}
	}
	rec := appRecord{App: a}
	ops, cmps, err := s.sharedEndpointOps(&rec, old, taken)
	if err != nil {
		return false, err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(appKey(a.Name)), "=", oldRev))
	tr, err := s.cli.Txn(ctx).If(cmps...).Then(append(ops, clientv3.OpPut(appKey(a.Name), string(b)))...).Commit()
	if err != nil {
		return false, wrapUnavailable(err)
	}
	if !tr.Succeeded {
		return false, nil
	}
	if oldRev == 0 || sameBoot(old.App, a) {
		return true, nil // new, or its pool size, mode, labels or resources: boots cost as before
	}
	// Another process boots another way: measure boots afresh.
	if err := s.resetCosts(ctx, a.Name, func(c *adaptive.Costs) { c.Boot = nil }); err != nil {
		return true, fmt.Errorf("app %s is replaced, but its boot costs are not reset: %w", a.Name, err)
	}
	return true, nil
}

// App returns an app.
func (s *Store) App(ctx context.Context, name string) (spec.App, error) {
	a, err := s.appRecord(ctx, name)
	return a.App, err
}

// appRecord reads app name's record.
func (s *Store) appRecord(ctx context.Context, name string) (appRecord, error) {
	var a appRecord
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
	r, err := s.cli.Get(ctx, appKey(name))
	if err != nil {
		return wrapUnavailable(err)
	}
	if len(r.Kvs) == 0 {
		return appNotFound(name)
	}
	var rec appRecord
	if err := json.Unmarshal(r.Kvs[0].Value, &rec); err != nil {
		return fmt.Errorf("record %s: %w", r.Kvs[0].Key, err)
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
	ops := []clientv3.Op{clientv3.OpDelete(appKey(name)), clientv3.OpDelete(costsPrefix(name), clientv3.WithPrefix())}
	for _, p := range sortedPorts(rec.Endpoint) {
		ops = append(ops, clientv3.OpDelete(endpointKey(p)))
	}
	// Its shared endpoint's ports go with the record they were read
	// from (a replace meanwhile: asked again).
	tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(appKey(name)), "=", r.Kvs[0].ModRevision)).Then(ops...).Commit()
	if err != nil {
		return wrapUnavailable(err)
	}
	if !tr.Succeeded {
		return s.DeleteApp(ctx, name)
	}
	return nil
}
