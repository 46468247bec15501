// A deployment's events, as fogctl and the hook API show them.

package state

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Event is one line of a deployment's history.
type Event struct {
	Time       time.Time `json:"time"`
	Deployment string    `json:"deployment"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message,omitempty"`
}

// Event records an event, kept for a day; failures are ignored.
func (s *Store) Event(ctx context.Context, id, reason, msg string) {
	op, err := s.eventOp(ctx, id, reason, msg)
	if err != nil {
		return
	}
	if _, err := s.cli.Do(ctx, op); errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.events.drop()
	}
}

// eventOp is the put of an event, for a transaction of its own or of the
// change it records.
func (s *Store) eventOp(ctx context.Context, id, reason, msg string) (clientv3.Op, error) {
	lease, err := s.events.get(ctx, s.cli)
	if err != nil {
		return clientv3.Op{}, err
	}
	now := time.Now().UTC()
	b, _ := json.Marshal(Event{Time: now, Deployment: id, Reason: reason, Message: msg})
	return clientv3.OpPut(Prefix+"events/"+strconv.FormatInt(now.UnixNano(), 10)+"-"+id, string(b), clientv3.WithLease(lease)), nil
}

// Events are kept for a day: they share one lease, granted for
// eventTTL+eventLeaseUse and used for eventLeaseUse, so that recording an
// event costs one write, not a grant and a write.
const (
	eventTTL      = 24 * time.Hour
	eventLeaseUse = time.Hour
)

// eventLease is the lease the store's events are written with.
type eventLease struct {
	mu      sync.Mutex
	id      clientv3.LeaseID
	granted time.Time
}

func (l *eventLease) get(ctx context.Context, cli *clientv3.Client) (clientv3.LeaseID, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id != 0 && time.Since(l.granted) < eventLeaseUse {
		return l.id, nil
	}
	r, err := cli.Grant(ctx, int64((eventTTL + eventLeaseUse).Seconds()))
	if err != nil {
		return 0, err
	}
	l.id, l.granted = r.ID, time.Now()
	return l.id, nil
}

// drop forgets a lease etcd no longer knows (it was emptied or restored).
func (l *eventLease) drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.id = 0
}

// Events lists the events of a deployment ("" = all), oldest first.
func (s *Store) Events(ctx context.Context, id string) ([]Event, error) {
	all, err := listJSON[Event](ctx, s.cli, Prefix+"events/")
	if err != nil || id == "" {
		return all, err
	}
	var out []Event
	for _, e := range all {
		if e.Deployment == id {
			out = append(out, e)
		}
	}
	return out, nil
}
