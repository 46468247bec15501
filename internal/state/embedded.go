package state

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Embedded runs a single-member etcd in this process (the default of one
// machine) until ctx ends. listen is host:port for clients; the peer port is
// the next one.
func Embedded(ctx context.Context, dataDir, listen string, log *slog.Logger) error {
	cfg := embed.NewConfig()
	cfg.Name = "fogdeploy-dev"
	cfg.Dir = dataDir
	cu, err := url.Parse("http://" + listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", listen, err)
	}
	pu := *cu
	port := cu.Port()
	var p int
	if _, err := fmt.Sscanf(port, "%d", &p); err != nil {
		return fmt.Errorf("--listen %q: give host:port", listen)
	}
	pu.Host = fmt.Sprintf("%s:%d", cu.Hostname(), p+1)
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
	case <-time.After(30 * time.Second):
		e.Server.Stop()
		return fmt.Errorf("embedded etcd in %s did not become ready in 30s", dataDir)
	}
	log.Info("embedded etcd ready", "client", cu.String(), "data_dir", dataDir)
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		return err
	}
}
