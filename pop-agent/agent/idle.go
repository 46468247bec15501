// Idle instances: this node's running deployments whose app has suspend_after, and that served
// no connection and used no more CPU than an idle app for that long, are suspended (suspend.go);
// those made on demand (ondemand.go) are undeployed after their app's frontend.idle_after.

package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/activity"
	"github.com/fogdeploy/fogdeploy/internal/spec"
)

const (
	// idleCheck is how often instances are sampled.
	idleCheck = 2 * time.Second
	// idleCPU is the share of one CPU an idle app may use (timers, a
	// runtime's housekeeping).
	idleCPU = 0.02
)

// idleSince is a deployment's last sample and since when it is idle.
type idleSince struct {
	last  activity.Sample
	since time.Time
}

// watchIdle samples this node's deployments every idleCheck until ctx
// ends, and asks for the suspend of those idle for their app's
// suspend_after.
func (a *agent) watchIdle(ctx context.Context) {
	t := time.NewTicker(idleCheck)
	defer t.Stop()
	seen := map[string]idleSince{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if a.plane.err() == nil {
				a.checkIdle(ctx, seen)
			}
		}
	}
}

func (a *agent) checkIdle(ctx context.Context, seen map[string]idleSince) {
	recs, err := a.d.Records().List()
	if err != nil {
		return
	}
	apps := map[string]spec.App{}
	here := map[string]bool{}
	for _, r := range recs {
		if r.Phase != spec.PhaseRunning {
			continue
		}
		app, ok := apps[r.App]
		if !ok {
			if app, err = a.st.App(ctx, r.App); err != nil {
				continue
			}
			apps[r.App] = app
		}
		after, undeploy := time.Duration(app.SuspendAfter), false
		if d, ok := a.st.WatchedDeployment(r.ID); ok && d.OnDemand {
			// Made on demand: undeployed when idle, with what it holds
			// (after the default, if the app is served on demand no more).
			after, undeploy = time.Duration(app.WithDefaults().Frontend.IdleAfter), true
			if after <= 0 {
				after = spec.DefaultIdleAfter
			}
		}
		if after <= 0 {
			continue
		}
		s, err := a.d.Activity(ctx, r.ID)
		if err != nil {
			continue
		}
		here[r.ID] = true
		prev, ok := seen[r.ID]
		if !ok || !activity.Idle(prev.last, s, idleCPU) {
			seen[r.ID] = idleSince{last: s, since: s.At}
			continue
		}
		prev.last = s
		seen[r.ID] = prev
		if idle := s.At.Sub(prev.since); idle >= after && undeploy {
			if err := a.st.DeleteDeployment(ctx, r.ID); err != nil {
				a.log.Warn("idle: undeploying an instance made on demand", "deployment", r.ID, "err", err)
				continue
			}
			delete(seen, r.ID)
			a.m.idleUndeploys.Inc()
			a.log.Info("idle: undeploying an instance made on demand", "deployment", r.ID, "app", r.App, "idle", idle.Round(time.Second))
		} else if idle >= after {
			if _, err := a.st.RequestSuspend(ctx, r.ID); err != nil {
				a.log.Warn("idle suspend: asking for the suspend", "deployment", r.ID, "err", err)
				continue
			}
			delete(seen, r.ID)
			a.m.idleSuspends.Inc()
			a.event(ctx, r.ID, "idle", fmt.Sprintf("no connection and under %.0f%% of a CPU for %s (suspend_after %s): suspending", idleCPU*100, idle.Round(time.Second), after))
			a.log.Info("idle: suspending", "deployment", r.ID, "app", r.App, "idle", idle.Round(time.Second))
		}
	}
	for id := range seen {
		if !here[id] {
			delete(seen, id)
		}
	}
}
