package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/secureserve"
)

// servers starts /metrics and /healthz: the plain listener (--address)
// and, with --secure-address, the TLS one with delegated authentication
// and authorization. A listener's error ends Run.
func (a *app) servers(ctx context.Context) error {
	c := a.c
	mux := newMux(a.reg, a.liveness)
	a.srvErr = serve(ctx, c.address, mux)
	if c.secureAddress == "" {
		return nil
	}
	// TokenReviews and SubjectAccessReviews on a client of their own,
	// with its own rate limiter, capped in flight and cached (negative
	// answers too): whoever reaches the port must not queue the lease
	// renewals and the loop's requests behind reviews of random tokens.
	reviewClient, err := secureserve.NewReviewClient(a.reviewCfg)
	if err != nil {
		return err
	}
	authn, authz, err := secureserve.Delegating(reviewClient, secureserve.ReviewOptions{Registerer: a.reg})
	if err != nil {
		return err
	}
	addr, errc, err := secureserve.Serve(ctx, secureserve.Options{Address: c.secureAddress, CertFile: c.tlsCertFile, KeyFile: c.tlsKeyFile},
		secureserve.Handler(mux, authn, authz, []string{"/healthz"}))
	if err != nil {
		return err
	}
	a.logger.Info("Serving metrics and health with delegated authentication and authorization", "address", addr.String(),
		"selfSignedCertificate", c.tlsCertFile == "")
	a.srvErr = mergeErrors(a.srvErr, errc)
	return nil
}

// newMux serves /metrics and /healthz.
func newMux(reg *prometheus.Registry, h *liveness) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/healthz", h)
	return mux
}

// mergeErrors forwards the first error of either channel.
func mergeErrors(a, b <-chan error) <-chan error {
	out := make(chan error, 1)
	go func() {
		select {
		case err := <-a:
			out <- err
		case err := <-b:
			out <- err
		}
	}()
	return out
}

// serve runs the plain listener of /metrics and /healthz (--address) until
// ctx ends; a listen error is sent.
func serve(ctx context.Context, addr string, mux http.Handler) <-chan error {
	errc := make(chan error, 1)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 2 * time.Minute, IdleTimeout: secureserve.DefaultIdleTimeout}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		errc <- fmt.Errorf("--address=%s: %w", addr, err)
		return errc
	}
	klog.FromContext(ctx).Info("Serving metrics and health", "address", ln.Addr().String())
	go func() {
		// As the secure listener: idle keep-alives closed, connections
		// bounded.
		if err := srv.Serve(secureserve.LimitListener(ln, secureserve.DefaultMaxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("metrics server: %w", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return errc
}
