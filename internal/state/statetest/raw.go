package statetest

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/state"
)

// The PoP's state as a fault or a check sees it below the Store's
// operations: its keys counted, listed, watched or wiped, under
// state.Prefix+sub. Only tests reach etcd this way; nothing outside
// internal/state builds a key.

// Count is how many keys are under sub.
func Count(ctx context.Context, t testing.TB, st *state.Store, sub string) int64 {
	t.Helper()
	r, err := st.Client().Get(ctx, state.Prefix+sub, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

// CountNow is Count that reports an error instead of failing t: for a
// poll whose etcd may not answer yet.
func CountNow(ctx context.Context, st *state.Store, sub string) (int64, error) {
	r, err := st.Client().Get(ctx, state.Prefix+sub, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return r.Count, nil
}

// KV is one key of the PoP's state, without state.Prefix, and its value.
type KV struct {
	Key   string
	Value []byte
	Lease int64
}

// List returns the keys under sub with their values.
func List(ctx context.Context, t testing.TB, st *state.Store, sub string) []KV {
	t.Helper()
	r, err := st.Client().Get(ctx, state.Prefix+sub, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]KV, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		out = append(out, KV{Key: string(kv.Key[len(state.Prefix):]), Value: kv.Value, Lease: kv.Lease})
	}
	return out
}

// Watch sends each key put under sub, until ctx ends.
func Watch(ctx context.Context, st *state.Store, sub string) <-chan KV {
	out := make(chan KV)
	events := st.Client().Watch(ctx, state.Prefix+sub, clientv3.WithPrefix())
	go func() {
		defer close(out)
		for resp := range events {
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				select {
				case out <- KV{Key: string(ev.Kv.Key[len(state.Prefix):]), Value: ev.Kv.Value, Lease: ev.Kv.Lease}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// Wipe deletes every key of the PoP's state: an etcd emptied behind the
// agents' back.
func Wipe(ctx context.Context, t testing.TB, st *state.Store) {
	t.Helper()
	if _, err := st.Client().Delete(ctx, state.Prefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
}

// Revision is etcd's revision now.
func Revision(ctx context.Context, t testing.TB, st *state.Store) int64 {
	t.Helper()
	r, err := st.Client().Get(ctx, state.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}
