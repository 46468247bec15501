package fakestore_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
	"github.com/fogdeploy/fogdeploy/rbd-layering/storetest"
)

func newStore(t *testing.T) layering.Backend {
	s, err := fakestore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSuite(t *testing.T) {
	storetest.RunSuite(t, newStore)
}

// TestWatchers: a loop device on an image's file is the fake's live
// mapping, LeaveDeadWatcher its killed client.
func TestWatchers(t *testing.T) {
	testenv.NeedRoot(t) // attaching a loop device
	storetest.RunWatcherSuite(t, newStore, storetest.Watchers{
		Live: func(t *testing.T, b layering.Backend, name string) func() {
			path := b.(*fakestore.Store).Path(name)
			out, err := exec.Command("losetup", "--find", "--show", path).CombinedOutput()
			if err != nil {
				testenv.Unavailable(t, testenv.Root, fmt.Sprintf("losetup: %v: %s", err, out))
			}
			dev := strings.TrimSpace(string(out))
			return func() {
				f, err := os.Open(dev)
				if err == nil {
					_, err = f.ReadAt(make([]byte, 512), 0)
					f.Close()
				}
				if err != nil {
					t.Errorf("the live mapping %s no longer serves reads: %v", dev, err)
				}
				if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
					t.Errorf("losetup -d %s: %v: %s", dev, err, out)
				}
			}
		},
		Dead: func(t *testing.T, b layering.Backend, name string) {
			if err := b.(*fakestore.Store).LeaveDeadWatcher(name, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		},
	})
}
