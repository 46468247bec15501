// Retention: keep the newest agent.keep_generations checkpoint generations of an app, never one in
// use.

package agent

import (
	"context"

	"github.com/fogdeploy/fogdeploy/internal/gc"
)

// retain removes the generations of app beyond agent.keep_generations that
// no deployment uses; the caller holds the app's checkpoint lock.
func (a *agent) retain(ctx context.Context, app string) {
	items, err := gc.Retain(ctx, a.store, app, a.c.Agent.KeepGenerations, false)
	for _, it := range items {
		if it.Skip {
			a.log.Info("keeping an old generation", "generation", it.Name, "reason", it.Reason)
			continue
		}
		_ = a.st.DeleteCheckpoint(ctx, app, it.Gen)
		a.log.Info("old generation removed", "generation", it.Name, "reason", it.Reason)
	}
	if err != nil {
		a.log.Warn("retention", "app", app, "err", err)
	}
}
