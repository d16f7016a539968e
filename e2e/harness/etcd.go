package harness

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// etcdStartTimeout bounds how long an embedded etcd may take to become ready.
const etcdStartTimeout = time.Minute

// startEtcd starts an in-process single-member etcd with its client and peer
// listeners on 127.0.0.1 and waits until it serves. Its log goes to logFile.
func startEtcd(ctx context.Context, dataDir, logFile string, clientPort, peerPort int) (*embed.Etcd, error) {
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}

	cfg := embed.NewConfig()
	cfg.Name = "harness"
	cfg.Dir = dataDir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ListenMetricsUrls = nil
	cfg.LogOutputs = []string{logFile}
	cfg.LogLevel = "info"
	// NewConfig leaves this at 0, which logs every request as slow.
	cfg.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
	// A throw-away test cluster: durability across power loss does not
	// matter, and fsync dominates write latency on small machines.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting embedded etcd on %s: %w", clientURL.Host, err)
	}
	timer := time.NewTimer(etcdStartTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd on %s failed while starting: %w", clientURL.Host, err)
	case <-timer.C:
		e.Close()
		return nil, fmt.Errorf("embedded etcd on %s not ready after %s", clientURL.Host, etcdStartTimeout)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("waiting for embedded etcd on %s: %w", clientURL.Host, context.Cause(ctx))
	}
}
