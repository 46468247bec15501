// The node's checkpoint cache in the agent: fetch a newly sealed generation ahead of its
// restores (agent.fetch sealed), drop what no generation needs and what exceeds the budget
// (agent.checkpoint_cache), report what the node holds (for placement and `fogctl pool ls`), and
// export it as metrics.

package agent

import (
	"context"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/gencache"
	"github.com/prometheus/client_golang/prometheus"
)

// prefetch copies generation g's checkpoint to the node ahead of any
// restore when agent.fetch is sealed; a warm pool's slot fetches it on
// its own. It waits while deploys are under way.
func (a *agent) prefetch(ctx context.Context, g spec.Generation) {
	if a.c.Agent.Fetch != config.FetchSealed || a.holds(g.App, g.Gen) || !a.waitIdle(ctx) {
		return
	}
	start := time.Now()
	fetched, err := a.d.Checkpoints().Prefetch(ctx, g)
	if err != nil {
		a.log.Warn("fetching a sealed checkpoint; its first restore fetches it", "app", g.App, "gen", g.Gen, "err", err)
		return
	}
	if fetched {
		a.m.fetches.WithLabelValues("ahead").Inc()
		a.log.Info("sealed checkpoint fetched to the node", "app", g.App, "gen", g.Gen, "took", time.Since(start).Round(time.Millisecond))
	}
}

// holds reports whether the node has a copy of generation gen of app.
func (a *agent) holds(app string, gen int) bool {
	es, err := a.d.Checkpoints().Cached()
	if err != nil {
		return false
	}
	for _, e := range es {
		if e.App == app && e.Gen == gen {
			return true
		}
	}
	return false
}

// trimCache drops the copies of generations that are gone (their app
// removed, or the generation itself) and then the least recently used
// beyond the budget, and exports what is left.
func (a *agent) trimCache(ctx context.Context, apps []spec.App, current map[string]int) {
	es, err := a.d.Checkpoints().Cached()
	if err != nil {
		a.log.Warn("listing the checkpoint cache", "err", err)
		return
	}
	known := map[string]bool{}
	for _, app := range apps {
		known[app.Name] = true
	}
	// The generations that exist, of the apps the cache holds.
	exists := map[gencache.Key]bool{}
	listed := map[string]bool{}
	for _, e := range es {
		if !known[e.App] || listed[e.App] {
			continue
		}
		listed[e.App] = true
		gens, err := a.d.Checkpoints().Generations(ctx, e.App)
		if err != nil {
			return // keep everything while the cluster does not answer
		}
		for _, g := range gens {
			exists[deploy.CacheKey(g)] = true
		}
	}
	dropped, err := a.d.Checkpoints().TrimCache(func(k gencache.Key) bool { return exists[k] })
	for _, e := range dropped {
		a.m.evictions.Inc()
		a.log.Info("checkpoint cache: generation dropped", "app", e.App, "gen", e.Gen, "bytes", e.Bytes)
	}
	if err != nil {
		a.log.Warn("trimming the checkpoint cache; retried at the next refill", "err", err)
	}
	if n, err := a.d.Checkpoints().SettleCache(ctx); err != nil {
		a.log.Warn("flushing the checkpoint cache to disk; retried at the next refill", "err", err)
	} else if n > 0 {
		a.log.Debug("checkpoint cache flushed to disk", "generations", n)
	}
	a.trimLowers(ctx, current)
	a.exportCache()
}

// trimLowers drops the node's read-only copies of environments that no
// instance uses, but for the current generation of each app (current: the
// one its pool and its restores take here; unknownGen keeps them all): a
// copy is a clone, which keeps gc from removing its generation.
func (a *agent) trimLowers(ctx context.Context, current map[string]int) {
	dropped, err := a.d.EnvCopies().TrimLowers(ctx, func(l deploy.Lower) bool {
		g, ok := current[l.App]
		return ok && (g == l.Gen || g == unknownGen)
	})
	for _, l := range dropped {
		a.log.Info("node copy of an environment dropped", "app", l.App, "gen", l.Gen, "image", l.Image)
	}
	if err != nil {
		a.log.Warn("dropping the node's copies of environments; retried at the next refill", "err", err)
	}
}

// exportCache sets the cache's metrics.
func (a *agent) exportCache() {
	es, err := a.d.Checkpoints().Cached()
	if err != nil {
		return
	}
	var n, unflushed int64
	for _, e := range es {
		n += e.Bytes
		if e.Unflushed {
			unflushed += e.Bytes
		}
	}
	a.m.cacheBytes.Set(float64(n))
	a.m.unflushed.Set(float64(unflushed))
	a.m.cacheGens.Set(float64(len(es)))
	if ls, err := a.d.EnvCopies().Lowers(); err == nil {
		a.m.envCopies.Set(float64(len(ls)))
	}
}

// registerFetchBytes exports what the node's checkpoint fetches copied,
// by where each byte came from: read from the cluster, copied from a
// block the fetch already held (the generation's block index), or left
// as a hole (zero).
func registerFetchBytes(reg prometheus.Registerer, d *deploy.Deployer) {
	for _, c := range []struct {
		from string
		of   func(gencache.CopyStats) int64
	}{
		{"cluster", func(s gencache.CopyStats) int64 { return s.Read }},
		{"node", func(s gencache.CopyStats) int64 { return s.Reused }},
		{"zero", func(s gencache.CopyStats) int64 { return s.Zero }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "fogdeploy_checkpoint_fetch_bytes_total", ConstLabels: prometheus.Labels{"from": c.from},
			Help: "Bytes of the checkpoints fetched to this node, by where they came from: cluster (read), node (a block the fetch already held, by the generation's block index), zero (left as a hole).",
		}, func() float64 { return float64(c.of(d.Checkpoints().FetchBytes())) }))
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "fogdeploy_checkpoint_pages_served_bytes_total",
		Help: "Bytes of memory pages this node read from the cluster for lazy resumes after their apps ran (the rest of their checkpoints is in fogdeploy_checkpoint_fetch_bytes_total).",
	}, func() float64 { return float64(d.Checkpoints().PagesServed()) }))
}
