package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// EmbeddedTLS is the TLS of the embedded etcd's client listener: its
// certificate and key, and the CA that its clients' certificates must be
// signed by (client certificate authentication). All three, or none.
type EmbeddedTLS struct {
	CertFile      string
	KeyFile       string
	TrustedCAFile string
}

// On says whether TLS is configured.
func (t EmbeddedTLS) On() bool { return t.CertFile != "" || t.KeyFile != "" || t.TrustedCAFile != "" }

// ErrInsecureListen: the embedded etcd would serve a network address
// without TLS and client certificates.
var ErrInsecureListen = errors.New("etcd without TLS and client certificate authentication on a network address")

// CheckEmbedded says whether the embedded etcd may serve on listen
// (host:port) with tls: on a loopback address with or without TLS; on any
// other address (an empty host is every interface) only with TLS and client
// certificate authentication, since etcd holds the whole PoP. names are
// the flags (or settings) of cert, key and CA, for the errors.
func CheckEmbedded(listen string, tls EmbeddedTLS, names [3]string) error {
	host, port, err := net.SplitHostPort(listen)
	if err != nil || port == "" {
		return fmt.Errorf("listen address %q: give host:port, e.g. 127.0.0.1:23790", listen)
	}
	var missing []string
	for i, v := range []string{tls.CertFile, tls.KeyFile, tls.TrustedCAFile} {
		if v == "" {
			missing = append(missing, names[i])
		}
	}
	if tls.On() && len(missing) > 0 {
		return fmt.Errorf("TLS needs a certificate, its key and the CA of the clients' certificates: give %s too", strings.Join(missing, " and "))
	}
	if loopback(host) || tls.On() {
		return nil
	}
	return fmt.Errorf("listening on %s: %w: anyone who reaches it could read or erase the PoP's state: give %s, %s and %s, or listen on 127.0.0.1",
		listen, ErrInsecureListen, names[0], names[1], names[2])
}

// loopback says whether host is a loopback address (or localhost).
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Embedded runs a single-member etcd in this process (the default of one
// machine) until ctx ends. listen is host:port for clients; the peer port is
// the next one.
func Embedded(ctx context.Context, dataDir, listen string, log *slog.Logger) error {
	return EmbeddedWith(ctx, dataDir, listen, EmbeddedTLS{}, log)
}

// EmbeddedWith is Embedded with TLS on the client listener (required on
// a network address, CheckEmbedded): clients connect over TLS and must
// present a certificate signed by tls.TrustedCAFile. The peer listener of
// a network address stays on 127.0.0.1 (a single member has no peer).
func EmbeddedWith(ctx context.Context, dataDir, listen string, tls EmbeddedTLS, log *slog.Logger) error {
	if err := CheckEmbedded(listen, tls, [3]string{"a certificate", "its key", "a trusted CA"}); err != nil {
		return err
	}
	cfg := embed.NewConfig()
	cfg.Name = "fogdeploy-dev"
	cfg.Dir = dataDir
	scheme := "http"
	if tls.On() {
		scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: tls.CertFile, KeyFile: tls.KeyFile, TrustedCAFile: tls.TrustedCAFile, ClientCertAuth: true}
	}
	cu, err := url.Parse(scheme + "://" + listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	pu := url.URL{Scheme: "http"}
	port := cu.Port()
	var p int
	if _, err := fmt.Sscanf(port, "%d", &p); err != nil {
		return fmt.Errorf("--listen %q: give host:port", listen)
	}
	peerHost := cu.Hostname()
	if !loopback(peerHost) {
		peerHost = "127.0.0.1"
	}
	pu.Host = net.JoinHostPort(peerHost, fmt.Sprint(p+1))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "error"
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start embedded etcd: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("embedded etcd in %s: %w", dataDir, err)
	case <-ctx.Done():
		e.Server.Stop()
		return nil
	case <-time.After(30 * time.Second):
		e.Server.Stop()
		return fmt.Errorf("embedded etcd in %s did not become ready in 30s", dataDir)
	}
	log.Info("embedded etcd ready", "client", cu.String(), "data_dir", dataDir, "tls", tls.On())
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		return err
	}
}
