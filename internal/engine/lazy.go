package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// lazyPages is CRIU's page server of a lazy restore: `criu lazy-pages`
// reads the image's pages and hands them to the restored process through
// userfaultfd, each on its first touch, and the rest in the background;
// it exits once every page is in. It runs beside the restore, on the host,
// and meets it at lazy-pages.socket in the instance's work directory.
type lazyPages struct {
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
	log  *slog.Logger
}

// lazySocket is where criu restore --lazy-pages finds the page server.
const lazySocket = "lazy-pages.socket"

// startLazyPages starts the page server of the image in imgDir for a
// restore whose work directory is inst, and returns once it listens.
func startLazyPages(ctx context.Context, criu, imgDir, inst string, log *slog.Logger) (*lazyPages, error) {
	// Not CommandContext: the server outlives the restore's context, until
	// every page is in the app (or the instance goes).
	cmd := exec.Command(criu, "lazy-pages", "-D", imgDir, "--work-dir", inst, "-o", "lazy-pages.log")
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("criu lazy-pages: %w", err)
	}
	lp := &lazyPages{cmd: cmd, done: make(chan struct{}), log: log}
	start := time.Now()
	go func() {
		err := cmd.Wait()
		log.Debug("lazy page server gone", "err", err, "after", time.Since(start).Round(time.Millisecond))
		close(lp.done)
	}()
	sock := filepath.Join(inst, lazySocket)
	for {
		if _, err := os.Stat(sock); err == nil {
			return lp, nil
		}
		select {
		case <-lp.done:
			return nil, WithOutput(fmt.Errorf("criu lazy-pages exited before it listened"), "criu lazy-pages log",
				logTail(filepath.Join(inst, "lazy-pages.log"), 10))
		case <-ctx.Done():
			lp.stop()
			return nil, fmt.Errorf("criu lazy-pages did not listen: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// wait blocks until the page server has given the app every page (and
// exited), or ctx ends. A nil server has nothing to wait for.
func (lp *lazyPages) wait(ctx context.Context) error {
	if lp == nil {
		return nil
	}
	select {
	case <-lp.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the lazy page server still restores the app's memory: %w", ctx.Err())
	}
}

// stop ends the page server if it still runs (the app it served is gone)
// and reaps it. A nil server is a no-op.
func (lp *lazyPages) stop() {
	if lp == nil {
		return
	}
	lp.once.Do(func() {
		select {
		case <-lp.done:
		default:
			_ = lp.cmd.Process.Kill()
			<-lp.done
		}
	})
}
