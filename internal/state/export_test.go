package state

import (
	"context"
	"fmt"
	"reflect"
)

// PlacementViewMatches reports how the watched placement view differs
// from a read of etcd (nil: it is the same, and loaded).
func PlacementViewMatches(ctx context.Context, s *Store) error {
	c := s.watched.Load()
	if c == nil {
		return fmt.Errorf("no watched view")
	}
	got, ok := c.view()
	if !ok {
		return fmt.Errorf("the watched view is not loaded")
	}
	want, err := s.readPlacement(ctx)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("watched view\n%+v\nread\n%+v", got, want)
	}
	return nil
}
