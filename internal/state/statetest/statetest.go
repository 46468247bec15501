// Package statetest runs an embedded etcd for one test.
package statetest

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

// Store starts an embedded etcd on a free port, in a temporary directory,
// and returns a connected Store; both end with the test.
func Store(t testing.TB) *state.Store {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- state.Embedded(ctx, t.TempDir(), endpoint, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() { cancel(); <-done })
	for range 100 {
		st, err := state.Open(context.Background(), state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second})
		if err == nil {
			t.Cleanup(func() { st.Close() })
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("embedded etcd at %s did not answer", endpoint)
	return nil
}
