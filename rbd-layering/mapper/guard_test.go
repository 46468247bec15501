package mapper

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

// stallingBackend is a Backend whose device blocks until Abort.
type stallingBackend struct {
	probeOnly
	aborted chan struct{}
}

func (b stallingBackend) Abort(context.Context, Record) (bool, error) {
	close(b.aborted)
	return true, nil
}

// A step blocked on a stalled device is cut loose after the timeout and
// fails with ErrStalled; a step that ends in time is left alone.
func TestGuard(t *testing.T) {
	calls := 0
	b := stallingBackend{probeOnly: probeOnly{name: "stall", calls: &calls}, aborted: make(chan struct{})}
	rec := Record{ID: "m1", Image: Image{Pool: "p", Name: "img"}}
	log := slog.New(slog.DiscardHandler)
	start := time.Now()
	err := guard(context.Background(), b, rec, 100*time.Millisecond, log, func() error {
		<-b.aborted // what a read of the device does until rbd-fuse dies
		return errors.New("input/output error")
	})
	if !errors.Is(err, ErrStalled) || time.Since(start) > 10*time.Second {
		t.Fatalf("guard of a stalled step = %v after %s; want ErrStalled", err, time.Since(start))
	}
	fast := stallingBackend{probeOnly: probeOnly{name: "stall", calls: &calls}, aborted: make(chan struct{})}
	want := errors.New("plain failure")
	if err := guard(context.Background(), fast, rec, time.Minute, log, func() error { return want }); err != want {
		t.Fatalf("guard of a step that ends in time = %v; want its own error", err)
	}
	select {
	case <-fast.aborted:
		t.Fatal("a step that ended in time was cut off")
	default:
	}
}
