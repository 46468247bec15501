// The apps as the reconciler's watch has seen them, so that a deployment
// it sees created starts without a read of the cluster.

package agent

import (
	"encoding/json"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// appView is the apps' records as of the reconcile watch's event at hand:
// seeded by the list the watch starts after, and following the watch's
// app events, which come in one ordered stream with the deployments'.
// Only the reconcile loop uses it. A nil view knows no app.
type appView map[string]spec.App

// newAppView is the view of the apps' records kvs.
func newAppView(kvs []*mvccpb.KeyValue) appView {
	v := appView{}
	for _, kv := range kvs {
		v.put(kv)
	}
	return v
}

// put records kv, an app's record; one that does not decode is left out
// (dispatch then reads it, and says what is wrong).
func (v appView) put(kv *mvccpb.KeyValue) {
	name := strings.TrimPrefix(string(kv.Key), state.AppsPrefix)
	var a spec.App
	if err := json.Unmarshal(kv.Value, &a); err != nil || a.Name != name {
		delete(v, name)
		return
	}
	v[name] = a
}

// follow applies ev if it changes an app's record; other events of the
// watched range (checkpoints, costs) change nothing here.
func (v appView) follow(ev *clientv3.Event) {
	name, ok := strings.CutPrefix(string(ev.Kv.Key), state.AppsPrefix)
	if !ok || v == nil || strings.Contains(name, "/") {
		return
	}
	if ev.Type == clientv3.EventTypeDelete {
		delete(v, name)
		return
	}
	v.put(ev.Kv)
}

// created is app as of ev if ev created a deployment's record (its first
// version: its status is the Pending written with it) and the view holds
// app; nil otherwise, and dispatch reads both.
func (v appView) created(ev *clientv3.Event, app string) *spec.App {
	if ev.Type != clientv3.EventTypePut || !ev.IsCreate() {
		return nil
	}
	a, ok := v[app]
	if !ok {
		return nil
	}
	return &a
}

// isDeployment reports whether ev is a deployment record's.
func isDeployment(ev *clientv3.Event) bool {
	return strings.HasPrefix(string(ev.Kv.Key), state.DeploymentsPrefix)
}
