// What deploys of an app cost on each node (mode auto's numbers): costs/<app>/<node>, written by that
// node's agent after each deploy, forgotten with the app, restore and hit samples reset by a new generation,
// boot samples by a spec whose process is another (spec.App.SameProcess).

package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
)

func costsPrefix(app string) string   { return Prefix + "costs/" + app + "/" }
func costKey(app, node string) string { return costsPrefix(app) + node }

// maxCostTries bounds the compare-and-swap retries of one cost update.
const maxCostTries = 16

// Costs returns what deploys of app cost on each node that recorded some,
// by node.
func (s *Store) Costs(ctx context.Context, app string) ([]adaptive.Costs, error) {
	cs, err := listJSON[adaptive.Costs](ctx, s.cli, costsPrefix(app))
	if err != nil {
		return nil, err
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].Node < cs[j].Node })
	return cs, nil
}

// NodeCosts returns what deploys of app cost on node (zero Costs if none
// were recorded).
func (s *Store) NodeCosts(ctx context.Context, app, node string) (adaptive.Costs, error) {
	c := adaptive.Costs{App: app, Node: node}
	if err := getJSON(ctx, s.cli, costKey(app, node), &c); err != nil && !errors.Is(err, ErrNotFound) {
		return c, err
	}
	return c, nil
}

// RecordCost records one deploy of app on node (adaptive.Costs.Record).
// Only node's agent calls it; the update is a compare-and-swap, so that it
// never undoes a reset made meanwhile by another process. It records
// nothing once the app is gone.
func (s *Store) RecordCost(ctx context.Context, app, node string, r adaptive.Run) error {
	return s.updateCosts(ctx, app, []string{costKey(app, node)}, true, func(c *adaptive.Costs) {
		c.App, c.Node = app, node
		c.Record(r)
	})
}

// resetCosts applies reset to every node's costs of app.
func (s *Store) resetCosts(ctx context.Context, app string, reset func(*adaptive.Costs)) error {
	r, err := s.cli.Get(ctx, costsPrefix(app), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return wrapUnavailable(err)
	}
	keys := make([]string, len(r.Kvs))
	for i, kv := range r.Kvs {
		keys[i] = string(kv.Key)
	}
	return s.updateCosts(ctx, app, keys, false, reset)
}

// updateCosts applies f to each key's costs with a compare-and-swap,
// retried when another writer changed the key meanwhile. create says
// whether a missing key is made; either way the write requires that the
// app exists.
func (s *Store) updateCosts(ctx context.Context, app string, keys []string, create bool, f func(*adaptive.Costs)) error {
	for _, key := range keys {
		done := false
		for range maxCostTries {
			r, err := s.cli.Get(ctx, key)
			if err != nil {
				return wrapUnavailable(err)
			}
			var c adaptive.Costs
			var rev int64
			if len(r.Kvs) > 0 {
				if err := json.Unmarshal(r.Kvs[0].Value, &c); err != nil {
					return fmt.Errorf("record %s: %w", key, err)
				}
				rev = r.Kvs[0].ModRevision
			} else if !create {
				done = true
				break
			}
			f(&c)
			c.Updated = time.Now().UTC()
			b, err := json.Marshal(c)
			if err != nil {
				return err
			}
			tr, err := s.cli.Txn(ctx).If(
				clientv3.Compare(clientv3.ModRevision(key), "=", rev),
				clientv3.Compare(clientv3.CreateRevision(appKey(app)), ">", 0),
			).Then(clientv3.OpPut(key, string(b))).Else(clientv3.OpGet(appKey(app), clientv3.WithCountOnly())).Commit()
			if err != nil {
				return wrapUnavailable(err)
			}
			if tr.Succeeded || tr.Responses[0].GetResponseRange().Count == 0 {
				// Written, or the app is gone: nothing to keep.
				done = true
				break
			}
		}
		if !done {
			return fmt.Errorf("costs %s: changed by others %d times in a row; not recorded", key, maxCostTries)
		}
	}
	return nil
}
