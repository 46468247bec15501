//go:build !no_ceph

package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestMigratePostCopyPoP: a redis holding 96 MiB of random values moves
// under CRIU from n1 to n2. Its target restores it from a hand-over read
// without the pages a lazy restore fetches later, and fetches them from
// n1 once the app answers: each side counts one page session done, n1
// keeps its hand-over until then, and every value is whole at n2.
func TestMigratePostCopyPoP(t *testing.T) {
	ctx, p, f, app := redisOnPoP(t, "e2e-pc", engine.NameCRIU, nil, "n1", "n2")
	api := "http://" + p.apis["n1"]
	client := &http.Client{}
	big, dep, src := largeOnN1(ctx, t, p, client, api, app, "-pc", "512M")
	sums := map[string][32]byte{}
	blob := make([]byte, 4<<20)
	for i := range 24 {
		_, _ = rand.Read(blob)
		k := "blob" + strconv.Itoa(i)
		if got, err := testenv.RedisDo(ctx, nil, src, "SET", k, string(blob)); err != nil || got != "OK" {
			t.Fatalf("SET %s: %q, %v", k, got, err)
		}
		sums[k] = sha256.Sum256(blob)
	}
	done := func(node, side string) float64 {
		return metricCount(t, p.apis[node], fmt.Sprintf(`fogdeploy_migrate_page_sessions_total{result="done",side=%q}`, side))
	}
	srcBefore, dstBefore := done("n1", "source"), done("n2", "target")
	down, moved := migrateUnderPings(ctx, t, client, api, dep.ID, src)
	dst := moved.Ports[drivers.PortKey(6379, "tcp")]
	for k, sum := range sums {
		got, err := testenv.RedisDo(ctx, nil, dst, "GET", k)
		if err != nil || sha256.Sum256([]byte(got)) != sum {
			t.Errorf("after the post-copy migration: GET %s: %d bytes, %v; want the 4 MiB written", k, len(got), err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for done("n1", "source") < srcBefore+1 || done("n2", "target") < dstBefore+1 {
		if time.Now().After(deadline) {
			t.Fatalf("page sessions done: n1 (source) %v, n2 (target) %v; want one more each (the restore fetched its pages from n1)",
				done("n1", "source")-srcBefore, done("n2", "target")-dstBefore)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("96 MiB of values: migrated after the memory, no answer for %s (checkpoint %d bytes)", down.Round(time.Millisecond), moved.Bytes)
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dropLarge(cctx, t, p, f, big, dep.ID)
}
