package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// lazyPages is CRIU's page server of a lazy restore: `criu lazy-pages`
// reads the image's pages and hands them to the restored process through
// userfaultfd, each on its first touch, and the rest in the background;
// it exits once every page is in. It runs beside the restore, on the host,
// and meets it at lazy-pages.socket in the instance's work directory.
//
// A page server that fails before every page is in must not leave the
// app running: once its userfaultfd is closed, a page it never handed in
// reads as zeros, not as an error. Its failure calls failed, which stops
// the app.
type lazyPages struct {
	cmd      *exec.Cmd
	done     chan struct{}
	once     sync.Once
	log      *slog.Logger
	stopping atomic.Bool
	failed   func()
}

// lazySocket is where criu restore --lazy-pages finds the page server.
const lazySocket = "lazy-pages.socket"

// startLazyPages starts the page server of the image in imgDir for a
// restore whose work directory is inst, and returns once it listens;
// failed is called if it fails before every page is in (not once stopped).
//
// With remote (a connection to the page server of the node that holds the
// pages, PagesSocket), it asks that server for the pages instead of
// reading the image's files.
func startLazyPages(ctx context.Context, criu, imgDir, inst string, remote *os.File, log *slog.Logger, failed func()) (*lazyPages, error) {
	// Not CommandContext: the server outlives the restore's context, until
	// every page is in the app (or the instance goes).
	args := []string{"lazy-pages", "-D", imgDir, "--work-dir", inst, "-o", "lazy-pages.log"}
	cmd := exec.Command(criu)
	if remote != nil {
		args = append(args, "--page-server", "--ps-socket", "3")
		cmd.ExtraFiles = []*os.File{remote}
	}
	cmd.Args = append(cmd.Args, args...)
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("criu lazy-pages: %w", err)
	}
	lp := &lazyPages{cmd: cmd, done: make(chan struct{}), log: log, failed: failed}
	start := time.Now()
	go func() {
		err := cmd.Wait()
		if err != nil && !lp.stopping.Load() {
			log.Error("lazy page server failed before every page was in: the app is stopped (a page it lacks would read as zeros)",
				"err", err, "after", time.Since(start).Round(time.Millisecond), "log", logTail(filepath.Join(inst, "lazy-pages.log"), 5))
			if lp.failed != nil {
				lp.failed()
			}
		} else {
			log.Debug("lazy page server gone", "err", err, "after", time.Since(start).Round(time.Millisecond))
		}
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
		lp.stopping.Store(true)
		select {
		case <-lp.done:
		default:
			_ = lp.cmd.Process.Kill()
			<-lp.done
		}
	})
}

// remotePages is a connection to the page server of image directory dir,
// when the image's pages are elsewhere (PagesSocket in it): only a lazy
// restore can have them (ErrInvalid otherwise), and a page server that
// does not answer fails the restore (a page it lacks would read as
// zeros). Nil when the image holds its pages.
func remotePages(dir string, lazy bool) (*os.File, error) {
	sock := filepath.Join(dir, PagesSocket)
	if _, err := os.Lstat(sock); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if !lazy {
		return nil, fmt.Errorf("its memory pages are on a remote page server (%s), which only a lazy restore reads: %w", PagesSocket, ErrInvalid)
	}
	// Through the directory's descriptor: a socket's path is bounded
	// (108 bytes), the directory's path is not.
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), PagesSocket), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("the page server of its memory pages does not answer: %w (%w)", err, ErrRestore)
	}
	defer conn.Close()
	return conn.File()
}
