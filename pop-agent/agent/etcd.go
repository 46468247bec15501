// `pop-agent etcd`: the embedded single-node etcd of one machine.

package agent

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// etcdMain runs `pop-agent etcd`: the embedded single-node etcd.
func etcdMain(args []string, errOut io.Writer) int {
	fs := flag.NewFlagSet("pop-agent etcd", flag.ContinueOnError)
	fs.SetOutput(errOut)
	dir := fs.String("data-dir", filepath.Join(devenv.Dir(), "etcd"), "etcd data directory")
	listen := fs.String("listen", devenv.EtcdEndpoint, "client address host:port (the peer port is the next one)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(errOut, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := state.Embedded(ctx, *dir, *listen, log); err != nil {
		log.Error("embedded etcd stopped", "err", err)
		return 1
	}
	return 0
}
