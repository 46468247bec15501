// Package statetest runs an embedded etcd for one test.
package statetest

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// Store starts an embedded etcd on a free port, in a temporary directory,
// and returns a connected Store; both end with the test. A start that fails
// (the peer port, client port + 1, may be taken) is retried on other ports.
func Store(t testing.TB) *state.Store {
	t.Helper()
	_, st := Start(t)
	return st
}

// Start is Store that also returns the etcd endpoint (host:port), for
// processes the test starts.
func Start(t testing.TB) (endpoint string, st *state.Store) {
	t.Helper()
	var last error
	for range 5 {
		ep, st, err := start(t)
		if err == nil {
			return ep, st
		}
		last = err
	}
	t.Fatalf("embedded etcd: %v", last)
	return "", nil
}

func start(t testing.TB) (string, *state.Store, error) {
	endpoint := testenv.EtcdAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- state.Embedded(ctx, t.TempDir(), endpoint, slog.New(slog.DiscardHandler)) }()
	for range 100 {
		select {
		case err := <-done:
			cancel()
			return "", nil, fmt.Errorf("at %s: %w", endpoint, err)
		default:
		}
		st, err := state.Open(context.Background(), state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second})
		if err == nil {
			t.Cleanup(func() { cancel(); <-done })
			t.Cleanup(func() { st.Close() })
			return endpoint, st, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	<-done
	return "", nil, fmt.Errorf("at %s: no answer in 10 s", endpoint)
}
