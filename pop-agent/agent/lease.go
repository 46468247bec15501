// The node's lease in etcd: registration, and riding out etcd outages (instances keep running, the
// node registers again when etcd answers).

package agent

import (
	"context"
	"errors"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

// session returns the node's current etcd session (its lease also holds
// the checkpoint locks this agent takes).
func (a *agent) session() *state.Session {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	return a.sess
}

// etcdState returns when the node lost its lease, or the zero time.
func (a *agent) etcdState() time.Time {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	return a.etcdLost
}

// keepRegistered watches the node's lease. When etcd does not answer for
// longer than the lease TTL the lease is lost: the agent says so in its log
// and in /healthz, keeps every instance running (it never undeploys for
// want of etcd), and registers the node again as soon as etcd answers,
// then reconciles what changed meanwhile.
func (a *agent) keepRegistered(ctx context.Context) {
	for {
		old := a.session()
		select {
		case <-ctx.Done():
			return
		case <-old.Done():
		}
		if ctx.Err() != nil {
			return
		}
		lost := time.Now()
		a.sessMu.Lock()
		a.etcdLost = lost
		a.sessMu.Unlock()
		a.log.Warn("etcd unavailable: the node lease is lost; instances keep running, registering again when etcd answers",
			"lease_ttl", a.c.Agent.LeaseTTL, "endpoints", a.c.Etcd.Endpoints)
		sess, err := a.register(ctx, old)
		if err != nil {
			return // shutting down
		}
		a.sessMu.Lock()
		a.sess, a.etcdLost = sess, time.Time{}
		a.sessMu.Unlock()
		a.log.Info("etcd available again: node registered", "unavailable_for", time.Since(lost).Round(time.Millisecond))
		// The fence may have lifted or fallen while the record was
		// written: write it again as it is now.
		a.fenceChanged(ctx)
		if _, err := a.resync(ctx); err != nil && !errors.Is(err, state.ErrFenced) {
			a.log.Warn("reconciling", "err", err)
		}
	}
}

// register retries until etcd answers, then drops the lost session's
// lease and registers the node with a new one. It fails only when ctx
// ends.
func (a *agent) register(ctx context.Context, old *state.Session) (*state.Session, error) {
	wait := time.Second
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := a.st.Answers(pctx, a.c.Node.Name)
		cancel()
		if err != nil {
			a.log.Debug("etcd still unavailable", "err", err)
			continue
		}
		_ = old.Close() // revokes the old lease if etcd still has it
		sess, err := a.st.Register(ctx, a.nodeRecord(), a.c.Agent.LeaseTTL)
		if err != nil {
			a.log.Warn("registering the node again", "err", err)
			continue
		}
		return sess, nil
	}
}

// etcdTimeout bounds the status and event writes of the deploy path, so
// that a deploy goes on while etcd is unavailable (resync writes a
// Running status again once etcd answers).
func (a *agent) etcdTimeout() time.Duration {
	if a.c.Etcd.DialTimeout > 0 {
		return a.c.Etcd.DialTimeout
	}
	return 5 * time.Second
}
