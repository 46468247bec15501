// A deployment's events, as fogctl and the hook API show them.

package state

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

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
	now := time.Now().UTC()
	b, _ := json.Marshal(Event{Time: now, Deployment: id, Reason: reason, Message: msg})
	l, err := s.cli.Grant(ctx, 86400)
	if err != nil {
		return
	}
	_, _ = s.cli.Put(ctx, Prefix+"events/"+strconv.FormatInt(now.UnixNano(), 10)+"-"+id, string(b), clientv3.WithLease(l.ID))
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
