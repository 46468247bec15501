// The deployments' records as an agent's reconcile loop acts on them: a list at one revision, then
// every change after it in order, with the apps of the same ordered stream, so that a deployment seen
// created names its app as of its creation and starts without a read of the cluster.

package state

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// errWatchClosed: etcd's client closed a watch that its caller had not
// ended.
var errWatchClosed = errors.New("watch closed")

// DesiredList is every deployment's record (those that decode) at one
// revision, and, when asked, the apps at the same one.
type DesiredList struct {
	Header  Header
	Desired []Desired
	// Apps by name (nil unless asked for).
	Apps map[string]spec.App
}

// ListDesired reads every deployment's record, and withApps the apps, in
// one transaction.
func (s *Store) ListDesired(ctx context.Context, withApps bool) (DesiredList, error) {
	ops := []clientv3.Op{clientv3.OpGet(DeploymentsPrefix, clientv3.WithPrefix())}
	if withApps {
		ops = append(ops, clientv3.OpGet(AppsPrefix, clientv3.WithPrefix()))
	}
	r, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return DesiredList{}, wrapUnavailable(err)
	}
	l := DesiredList{Header: HeaderOf(r.Header)}
	for _, kv := range r.Responses[0].GetResponseRange().Kvs {
		var d Desired
		if json.Unmarshal(kv.Value, &d) == nil {
			l.Desired = append(l.Desired, d)
		}
	}
	if withApps {
		l.Apps = map[string]spec.App{}
		for _, kv := range r.Responses[1].GetResponseRange().Kvs {
			putApp(l.Apps, kv)
		}
	}
	return l, nil
}

// DesiredChange is one change of a deployment's record.
type DesiredChange struct {
	ID string
	// Desired is the record written; for a withdrawal, the one withdrawn
	// when Known (a record that did not decode is not).
	Desired Desired
	Deleted bool
	Known   bool
	// Invalid: a record written that does not decode.
	Invalid bool
	// App is, for a record's first version (a create), its app as the
	// stream had it then; nil when the list and stream did not hold it.
	App *spec.App
}

// DesiredChanges are the changes of one watch response, in order, at the
// revision Header says; Err ends the stream.
type DesiredChanges struct {
	Header  Header
	Changes []DesiredChange
	Err     error
}

// WatchDesired sends the changes of the deployments' records after l,
// one DesiredChanges per etcd watch response (none for a response that
// changed apps only), until ctx ends or the watch fails: its last
// DesiredChanges then carries Err, and the channel is closed. The apps of
// l (ListDesired withApps) are followed through the same stream.
func (s *Store) WatchDesired(ctx context.Context, l DesiredList) <-chan DesiredChanges {
	out := make(chan DesiredChanges)
	apps := map[string]spec.App{}
	for n, a := range l.Apps {
		apps[n] = a
	}
	// The apps' keys sort before the deployments': one range, one
	// ordered stream of both.
	wch := s.cli.Watch(ctx, AppsPrefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(DeploymentsPrefix)),
		clientv3.WithRev(l.Header.Revision+1), clientv3.WithPrevKV())
	go func() {
		defer close(out)
		for wr := range wch {
			batch := DesiredChanges{Header: HeaderOf(&wr.Header), Err: wr.Err()}
			if batch.Err == nil {
				for _, ev := range wr.Events {
					if c, ok := desiredChange(ev, apps); ok {
						batch.Changes = append(batch.Changes, c)
					}
				}
			}
			if batch.Err == nil && len(batch.Changes) == 0 {
				continue
			}
			select {
			case out <- batch:
			case <-ctx.Done():
				return
			}
			if batch.Err != nil {
				return
			}
		}
		if ctx.Err() == nil {
			select {
			case out <- DesiredChanges{Err: wrapUnavailable(errWatchClosed)}:
			case <-ctx.Done():
			}
		}
	}()
	return out
}

// desiredChange is ev as a deployment's change (ok false for an app's
// event, which updates apps, or another key of the range).
func desiredChange(ev *clientv3.Event, apps map[string]spec.App) (DesiredChange, bool) {
	k := string(ev.Kv.Key)
	if name, ok := strings.CutPrefix(k, AppsPrefix); ok {
		if strings.Contains(name, "/") {
			return DesiredChange{}, false
		}
		if ev.Type == clientv3.EventTypeDelete {
			delete(apps, name)
		} else {
			putApp(apps, ev.Kv)
		}
		return DesiredChange{}, false
	}
	id, ok := strings.CutPrefix(k, DeploymentsPrefix)
	if !ok {
		return DesiredChange{}, false // checkpoints, costs between the two
	}
	c := DesiredChange{ID: id}
	if ev.Type == clientv3.EventTypeDelete {
		c.Deleted = true
		if ev.PrevKv != nil && json.Unmarshal(ev.PrevKv.Value, &c.Desired) == nil {
			c.Known = true
		}
		return c, true
	}
	if json.Unmarshal(ev.Kv.Value, &c.Desired) != nil {
		c.Invalid = true
		return c, true
	}
	c.Known = true
	if ev.IsCreate() {
		if a, ok := apps[c.Desired.App]; ok {
			c.App = &a
		}
	}
	return c, true
}

// putApp records an app's record kv in apps; one that does not decode, or
// names another app, is left out (a reader then reads it and says what
// is wrong).
func putApp(apps map[string]spec.App, kv *mvccpb.KeyValue) {
	name := strings.TrimPrefix(string(kv.Key), AppsPrefix)
	var a spec.App
	if err := json.Unmarshal(kv.Value, &a); err != nil || a.Name != name {
		delete(apps, name)
		return
	}
	apps[name] = a
}
