// How many deployments a hook client holds: what its token's quota bounds.

package state

import "context"

// DeploymentsOf counts the deployments that the hook API's client created
// (Desired.Client). It counts from the agent's view
// (Watch) where it is loaded, with no read of etcd; otherwise it
// reads the deployments.
func (s *Store) DeploymentsOf(ctx context.Context, client string) (int, error) {
	if c := s.watched.Load(); c != nil {
		c.mu.Lock()
		loaded, n := c.loaded, 0
		for _, d := range c.deps {
			if d.Client == client {
				n++
			}
		}
		c.mu.Unlock()
		if loaded {
			return n, nil
		}
	}
	ds, err := listJSON[Desired](ctx, s.cli, DeploymentsPrefix)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range ds {
		if d.Client == client {
			n++
		}
	}
	return n, nil
}
