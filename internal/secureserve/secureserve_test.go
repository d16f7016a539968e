package secureserve

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// tokens is an authenticator over a fixed token table; the delegating one
// (TokenReview, SubjectAccessReview) is proven against the real API server
// in e2e (TestChartAppliesAndRuns).
var tokens = authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
	switch r.Header.Get("Authorization") {
	case "Bearer scraper":
		return &authenticator.Response{User: &user.DefaultInfo{Name: "system:serviceaccount:monitoring:prometheus"}}, true, nil
	case "Bearer nobody":
		return &authenticator.Response{User: &user.DefaultInfo{Name: "nobody"}}, true, nil
	case "Bearer broken":
		return nil, false, errors.New("token review failed")
	}
	return nil, false, nil
})

// rbac allows get /metrics to the scraper only.
var rbac = authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if a.GetUser().GetName() == "system:serviceaccount:monitoring:prometheus" && a.GetVerb() == "get" && a.GetPath() == "/metrics" && !a.IsResourceRequest() {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "no rule", nil
})

func TestSecureServing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "up 1\n") })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr, errc, err := Serve(ctx, Options{Address: "127.0.0.1:0"}, Handler(mux, tokens, rbac, []string{"/healthz"}))
	if err != nil {
		t.Fatal(err)
	}
	// The certificate is self-signed: this test checks authentication and
	// authorization, not the chain (a client that trusts it is the operator's choice).
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed test server
	tests := []struct {
		name, method, path, token string
		want                      int
		body                      string
	}{
		{"probe without a token", "GET", "/healthz", "", http.StatusOK, "ok"},
		{"metrics without a token", "GET", "/metrics", "", http.StatusUnauthorized, "Unauthorized"},
		{"an unknown token", "GET", "/metrics", "guess", http.StatusUnauthorized, "Unauthorized"},
		{"a failing token review", "GET", "/metrics", "broken", http.StatusUnauthorized, "Unauthorized"},
		{"a user without the grant", "GET", "/metrics", "nobody", http.StatusForbidden, `user "nobody" may not get /metrics`},
		{"the scraper", "GET", "/metrics", "scraper", http.StatusOK, "up 1"},
		{"the scraper, another verb", "POST", "/metrics", "scraper", http.StatusForbidden, "may not post /metrics"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctx, tc.method, "https://"+addr.String()+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want || !strings.Contains(string(body), tc.body) {
				t.Fatalf("%s %s: %d %q, want %d with %q", tc.method, tc.path, resp.StatusCode, body, tc.want, tc.body)
			}
		})
	}
	// Plain HTTP is refused on the TLS port.
	if resp, err := http.Get("http://" + addr.String() + "/healthz"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP served on the secure port")
		}
	}
	select {
	case err := <-errc:
		t.Fatalf("server stopped: %v", err)
	default:
	}
}

func TestTLSOptions(t *testing.T) {
	for _, o := range []Options{{Address: "127.0.0.1:0", CertFile: "/no/such/cert"}, {Address: "127.0.0.1:0", CertFile: "/no/cert", KeyFile: "/no/key"}} {
		if _, _, err := Serve(context.Background(), o, http.NotFoundHandler()); err == nil || !strings.Contains(err.Error(), "--tls-") {
			t.Errorf("Serve(%+v): %v, want an error naming the TLS flags", o, err)
		}
	}
}

// TestIdleAndExtraConnectionsBounded (#40): a keep-alive connection left
// idle is closed after IdleTimeout (before, it stayed open for good: 200
// of 200 after 15 s), and past MaxConns from one address a new connection
// is closed at once, until one of them closes.
func TestIdleAndExtraConnectionsBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr, _, err := Serve(ctx, Options{Address: "127.0.0.1:0", IdleTimeout: 300 * time.Millisecond, MaxConns: 2},
		Handler(mux, tokens, rbac, []string{"/healthz"}))
	if err != nil {
		t.Fatal(err)
	}
	dial := func() (*tls.Conn, error) {
		d := &net.Dialer{Timeout: 5 * time.Second}
		return tls.DialWithDialer(d, "tcp", addr.String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // self-signed test server
	}
	get := func(c *tls.Conn) error {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	a, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close() }()
	if err := get(a); err != nil {
		t.Fatal(err)
	}
	// Idle: the server closes it (a read ends) within a deadline far
	// above IdleTimeout.
	_ = a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := a.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle keep-alive connection was not closed by the server: %v", err)
	}
	// Two connections held open from this address: a third is closed at
	// once (its handshake fails); once one of the two closes, a new one
	// is served.
	b, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	if d, err := dial(); err == nil {
		err = get(d)
		_ = d.Close()
		if err == nil {
			t.Fatal("a third connection from one address served while two are open (MaxConns 2)")
		}
	}
	_ = b.Close()
	var served error = errors.New("not tried")
	for deadline := time.Now().Add(10 * time.Second); served != nil && time.Now().Before(deadline); {
		// The server sees b's close when it reads from it: poll.
		var d *tls.Conn
		if d, served = dial(); served == nil {
			served = get(d)
			_ = d.Close()
		}
	}
	if served != nil {
		t.Fatalf("no connection served after one of the two closed: %v", served)
	}
	_ = c.Close()
}
