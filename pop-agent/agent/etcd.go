// `pop-agent etcd`: the embedded single-node etcd of one machine.

package agent

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/fogdeploy/fogdeploy/internal/devenv"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// etcdMain runs `pop-agent etcd`: the embedded single-node etcd. It
// serves a loopback address as it is; any other only over TLS with client
// certificate authentication (exit 2 otherwise, naming the flags).
func etcdMain(args []string, errOut io.Writer) int {
	fs := flag.NewFlagSet("pop-agent etcd", flag.ContinueOnError)
	fs.SetOutput(errOut)
	dir := fs.String("data-dir", filepath.Join(devenv.Dir(), "etcd"), "etcd data directory")
	listen := fs.String("listen", devenv.EtcdEndpoint, "client address host:port (the peer port is the next one, on 127.0.0.1); beyond a loopback address only with --cert-file, --key-file and --trusted-ca-file")
	var tls state.EmbeddedTLS
	fs.StringVar(&tls.CertFile, "cert-file", "", "TLS certificate of the client listener (PEM)")
	fs.StringVar(&tls.KeyFile, "key-file", "", "its private key (PEM)")
	fs.StringVar(&tls.TrustedCAFile, "trusted-ca-file", "", "CA certificates that sign the clients' certificates: clients without one are refused (PEM)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(errOut, "pop-agent etcd: unexpected arguments %q: it takes flags only\n", fs.Args())
		return 2
	}
	if err := state.CheckEmbedded(*listen, tls, [3]string{"--cert-file", "--key-file", "--trusted-ca-file"}); err != nil {
		fmt.Fprintf(errOut, "pop-agent etcd: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(errOut, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := state.EmbeddedWith(ctx, *dir, *listen, tls, log); err != nil {
		log.Error("embedded etcd stopped", "err", err)
		return 1
	}
	return 0
}
