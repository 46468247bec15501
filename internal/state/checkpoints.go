// The PoP's checkpoint generations in etcd, and the lock under which one is produced.

package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fogdeploy/fogdeploy/internal/adaptive"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// PutCheckpoint records a checkpoint generation. Restores of it cost what
// they cost: the restore samples of the app on every node start afresh.
func (s *Store) PutCheckpoint(ctx context.Context, g spec.Generation) error {
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	if _, err = s.cli.Put(ctx, checkpointKey(g.App, g.Gen), string(b)); err != nil {
		return wrapUnavailable(err)
	}
	// (Costs.Add also drops them at the first restore of the new
	// generation, should this fail.)
	if err := s.resetCosts(ctx, g.App, func(c *adaptive.Costs) {
		if g.Gen > c.Gen {
			c.Restore, c.Hit, c.Gen = nil, nil, g.Gen
		}
		if n, ok := c.EngineGen[g.Engine]; ok && g.Gen > n {
			delete(c.EngineRestore, g.Engine)
			c.EngineGen[g.Engine] = g.Gen
		}
	}); err != nil {
		return fmt.Errorf("generation %d of %s is recorded, but its restore costs are not reset: %w", g.Gen, g.App, err)
	}
	return nil
}

// sameBoot says whether apps a and b boot the same process: the same
// command, environment, variables, working directory, user and engine.
func sameBoot(a, b spec.App) bool {
	a, b = a.WithDefaults(), b.WithDefaults()
	return a.SameProcess(b) && a.Engine == b.Engine
}

// Checkpoints lists the generations recorded for app ("" = all apps).
func (s *Store) Checkpoints(ctx context.Context, app string) ([]spec.Generation, error) {
	p := Prefix + "checkpoints/"
	if app != "" {
		p += app + "/"
	}
	return listJSON[spec.Generation](ctx, s.cli, p)
}

// DeleteCheckpoint removes a generation's record.
func (s *Store) DeleteCheckpoint(ctx context.Context, app string, gen int) error {
	_, err := s.cli.Delete(ctx, checkpointKey(app, gen))
	return wrapUnavailable(err)
}

// LockCheckpoint takes the PoP-wide lock under which an app's checkpoint
// is produced; unlock releases it. The lock dies with sess (the agent).
// With wait false it fails at once, wrapping spec.ErrBusy, while another
// session holds it.
func (s *Store) LockCheckpoint(ctx context.Context, sess *concurrency.Session, app string, wait bool) (unlock func(), err error) {
	m := concurrency.NewMutex(sess, Prefix+"locks/checkpoint/"+app)
	lock := m.Lock
	if !wait {
		lock = m.TryLock
	}
	if err := lock(ctx); errors.Is(err, concurrency.ErrLocked) {
		return nil, fmt.Errorf("app %s: another node holds the checkpoint lock: %w", app, spec.ErrBusy)
	} else if err != nil {
		return nil, wrapUnavailable(err)
	}
	return func() { _ = m.Unlock(context.WithoutCancel(ctx)) }, nil
}

// CheckpointLocked reports whether some agent holds (or waits for) the
// checkpoint lock of app.
func (s *Store) CheckpointLocked(ctx context.Context, app string) (bool, error) {
	r, err := s.cli.Get(ctx, Prefix+"locks/checkpoint/"+app+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return false, wrapUnavailable(err)
	}
	return r.Count > 0, nil
}
