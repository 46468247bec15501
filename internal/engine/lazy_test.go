package engine

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeLazyPages writes a stand-in for criu that, run as `criu lazy-pages`,
// listens (its socket appears in --work-dir) and then runs then.
func fakeLazyPages(t *testing.T, then string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "criu")
	script := "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --work-dir ] && dir=$2; shift; done\n: > \"$dir/" + lazySocket + "\"\n" + then + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// A page server that fails before every page is in stops the app (its
// missing pages would read as zeros); one stopped with its instance, or
// done, does not.
func TestLazyPagesFailureStopsTheApp(t *testing.T) {
	for _, c := range []struct {
		name, then string
		stop, want bool
	}{
		{"fails", "sleep 0.1; exit 1", false, true},
		{"done", "sleep 0.1; exit 0", false, false},
		{"stopped", "sleep 30", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			failed := make(chan struct{}, 1)
			lp, err := startLazyPages(context.Background(), fakeLazyPages(t, c.then), t.TempDir(), t.TempDir(), nil, slog.New(slog.DiscardHandler),
				func() { failed <- struct{}{} })
			if err != nil {
				t.Fatal(err)
			}
			if c.stop {
				lp.stop()
			}
			select {
			case <-lp.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the page server did not end")
			}
			select {
			case <-failed:
				if !c.want {
					t.Error("the app was stopped; want it left alone")
				}
			default:
				if c.want {
					t.Error("the app was left running after its page server failed")
				}
			}
			lp.stop()
		})
	}
}
