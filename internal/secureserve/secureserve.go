// Package secureserve serves /metrics and /healthz over TLS with the API
// server's delegated authentication and authorization, as Kubernetes
// components do: a bearer token is checked with a TokenReview, and the
// request (verb get, the non-resource path) with a SubjectAccessReview, so
// RBAC decides who may scrape (for example a ClusterRole granting get on
// the non-resource URL /metrics, bound to Prometheus' ServiceAccount).
// Paths listed in AlwaysAllowPaths (the kubelet's probe of /healthz) are
// served to anyone. The reviews are bounded (review.go): their own client
// and rate limiter, a cap on those in flight, caches of the answers,
// negative ones included.
package secureserve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
)

// Options configure the secure listener.
type Options struct {
	// Address is host:port to listen on.
	Address string
	// CertFile and KeyFile hold the serving certificate and key (PEM);
	// both empty: a self-signed certificate is made at start.
	CertFile, KeyFile string
	// AlwaysAllowPaths are served without authentication or authorization.
	AlwaysAllowPaths []string
	// IdleTimeout closes a keep-alive connection idle this long, and
	// MaxConns bounds the connections open at once from one source IP
	// (the next ones are closed at once): whoever reaches the port cannot
	// hold it open for good. Zero: DefaultIdleTimeout, DefaultMaxConns.
	IdleTimeout time.Duration
	MaxConns    int
}

// Defaults of Options.IdleTimeout and MaxConns: a scraper every 15 s
// keeps its connection; 64 from one address is far above what a
// scraper or the kubelet's probes open.
const (
	DefaultIdleTimeout = 90 * time.Second
	DefaultMaxConns    = 64
)

// Timeouts of a request on the secure listener: reading it (headers and
// its small body), and writing the answer (a /metrics page of a 7,500-node
// cluster is a few MiB).
const (
	readTimeout  = 30 * time.Second
	writeTimeout = 2 * time.Minute
)

// Handler serves h to requests whose bearer token the authenticator
// accepts (401 otherwise) and that the authorizer allows for the HTTP
// verb, lower-cased, on the request's path as a non-resource URL (403
// otherwise); paths in alwaysAllow are served to anyone. A request that
// would need a review while too many are in flight (ErrBusy) is answered
// 429 with Retry-After at once. Refusals are logged (-v=2) at most once
// every 10 seconds each, with a count: whoever reaches the port must not
// fill the log either.
func Handler(h http.Handler, authn authenticator.Request, authz authorizer.Authorizer, alwaysAllow []string) http.Handler {
	g := &guard{h: h, authn: authn, authz: authz, allow: map[string]bool{}}
	for _, p := range alwaysAllow {
		g.allow[p] = true
	}
	return g
}

// guard is Handler's: h behind authentication and authorization, with
// its refusals sampled for the log.
type guard struct {
	h     http.Handler
	authn authenticator.Request
	authz authorizer.Authorizer
	allow map[string]bool

	unauthenticated, forbidden, busy sampled
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.allow[r.URL.Path] {
		g.h.ServeHTTP(w, r)
		return
	}
	logger := klog.FromContext(r.Context())
	u, ok := g.authenticate(w, r, logger)
	if !ok {
		return
	}
	if !g.authorize(w, r, logger, u) {
		return
	}
	g.h.ServeHTTP(w, r)
}

// authenticate returns the user of r's bearer token; false when it
// answered r itself (429, 401).
func (g *guard) authenticate(w http.ResponseWriter, r *http.Request, logger klog.Logger) (user.Info, bool) {
	res, ok, err := g.authn.AuthenticateRequest(r)
	if errors.Is(err, ErrBusy) {
		if n := g.busy.take(); n > 0 {
			logger.V(2).Info("Requests to the secure metrics server refused: too many token reviews in flight", "refused", n, "remote", r.RemoteAddr)
		}
		tooMany(w)
		return nil, false
	}
	if err != nil || !ok {
		if n := g.unauthenticated.take(); n > 0 && err != nil {
			logger.V(2).Info("Unauthenticated requests to the secure metrics server", "count", n, "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
		}
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return nil, false
	}
	return res.User, true
}

// authorize says u may use r's verb on its path; false when it answered
// r itself (429, 500, 403).
func (g *guard) authorize(w http.ResponseWriter, r *http.Request, logger klog.Logger, u user.Info) bool {
	attrs := authorizer.AttributesRecord{
		User:            u,
		Verb:            strings.ToLower(r.Method),
		Path:            r.URL.Path,
		ResourceRequest: false,
	}
	decision, reason, err := g.authz.Authorize(r.Context(), attrs)
	if errors.Is(err, ErrBusy) {
		if n := g.busy.take(); n > 0 {
			logger.V(2).Info("Requests to the secure metrics server refused: too many access reviews in flight", "refused", n, "user", u.GetName())
		}
		tooMany(w)
		return false
	}
	if err != nil {
		logger.Error(err, "Authorizing a request to the secure metrics server", "user", u.GetName(), "path", r.URL.Path)
		http.Error(w, "authorization failed", http.StatusInternalServerError)
		return false
	}
	if decision != authorizer.DecisionAllow {
		if n := g.forbidden.take(); n > 0 {
			logger.V(2).Info("Forbidden requests to the secure metrics server", "count", n, "user", u.GetName(), "path", r.URL.Path, "reason", reason)
		}
		http.Error(w, fmt.Sprintf("Forbidden: user %q may not %s %s", u.GetName(), attrs.Verb, r.URL.Path), http.StatusForbidden)
		return false
	}
	return true
}

func tooMany(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, "Too many requests awaiting authentication or authorization; retry later", http.StatusTooManyRequests)
}

// sampled counts events and lets one in every logEvery be logged.
type sampled struct {
	mu    sync.Mutex
	last  time.Time
	count int
}

const logEvery = 10 * time.Second

// take counts an event and returns how many to log now (this one and
// those since the last logged), or 0.
func (s *sampled) take() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count++
	if now := time.Now(); now.Sub(s.last) >= logEvery {
		n := s.count
		s.last, s.count = now, 0
		return n
	}
	return 0
}

// tlsConfig loads the serving certificate, or makes a self-signed one for
// host (the address's host, or localhost).
func tlsConfig(o Options) (*tls.Config, error) {
	var cert tls.Certificate
	var err error
	switch {
	case o.CertFile != "" && o.KeyFile != "":
		cert, err = tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert-file=%s, --tls-private-key-file=%s: %w", o.CertFile, o.KeyFile, err)
		}
	case o.CertFile != "" || o.KeyFile != "":
		return nil, errors.New("--tls-cert-file and --tls-private-key-file: give both or neither")
	default:
		host, _, _ := net.SplitHostPort(o.Address)
		if host == "" {
			host = "localhost"
		}
		certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("self-signed serving certificate: %w", err)
		}
		if cert, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
			return nil, fmt.Errorf("self-signed serving certificate: %w", err)
		}
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

const maxHeaderBytes = 64 << 10

// Serve listens on o.Address with TLS and serves h (already wrapped by
// Handler) until ctx ends. It returns the listener's address and a channel
// that receives the server's error, if it stops on one.
func Serve(ctx context.Context, o Options, h http.Handler) (net.Addr, <-chan error, error) {
	cfg, err := tlsConfig(o)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", o.Address)
	if err != nil {
		return nil, nil, fmt.Errorf("--secure-address=%s: %w", o.Address, err)
	}
	// Headers up to 64 KiB (a ServiceAccount token is about 1 KiB, an
	// OIDC one a few): net/http's default of 1 MiB would let every
	// TokenReview carry a megabyte.
	idle, maxConns := o.IdleTimeout, o.MaxConns
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: cfg, MaxHeaderBytes: maxHeaderBytes,
		ReadTimeout: readTimeout, WriteTimeout: writeTimeout, IdleTimeout: idle,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() {
		if err := srv.Serve(tls.NewListener(LimitListener(ln, maxConns), cfg)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("secure metrics server: %w", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr(), errc, nil
}

// LimitListener keeps at most n connections open at once from one source
// IP: a connection past that is closed as soon as it is accepted. A
// per-source bound, not a global one: a client holding its connections
// open must not keep the kubelet's probe out (a global cap would queue the
// probe behind it and fail it).
func LimitListener(l net.Listener, n int) net.Listener {
	return &limitListener{Listener: l, n: n, open: map[string]int{}}
}

type limitListener struct {
	net.Listener
	n    int
	mu   sync.Mutex
	open map[string]int
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(ip); err == nil {
			ip = host
		}
		l.mu.Lock()
		if l.open[ip] >= l.n {
			l.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.open[ip]++
		l.mu.Unlock()
		return &limitConn{Conn: c, release: func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[ip]--; l.open[ip] <= 0 {
				delete(l.open, ip)
			}
		}}, nil
	}
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
