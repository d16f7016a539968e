package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	apiv1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Whoever reaches the secure metrics listener makes the autoscaler ask the
// API server: a TokenReview per unknown bearer token. Flooded with random
// tokens from 256 connections (up to 500 requests a second) for 30 s and
// more, the leader must keep its lease, renewed within the lease
// duration at every poll, and keep scaling: a workload created 10 s into
// the flood has its pods Running before it ends. A scraper allowed before
// is served throughout, and the TokenReviews sent stay within the
// reviews' own rate limit.
//
// The autoscaler runs with the chart's client limits (--kube-client-qps=50,
// --kube-client-burst=100) and a 4 s lease (3 s renew deadline): when the
// reviews shared its client (before), the renewals queued behind 256
// reviews, 5 s at 50 a second, and the leader lost its lease within
// seconds.
//
// Serial (no t.Parallel): the flood loads the two CPUs, and would slow the
// scenarios running beside it (and blur what this one measures).
func TestSecurityMetricsFloodKeepsTheLease(t *testing.T) {
	sc := newScenario(t)
	sc.failover = true // a 4 s lease, 3 s renew deadline: a starved renewal shows at once
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	secureAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := sc.autoscaler("leader", "--nodes=0:20:"+cpu, "--secure-address="+secureAddr,
		"--kube-client-qps=50", "--kube-client-burst=100")
	sc.eventually("the autoscaler leading", time.Minute, func() (bool, string) {
		return sc.logContains(p, "Starting autoscaler loop"), "not yet"
	})
	ctx, admin := sc.ctx, sc.s.cp.Client
	leases := admin.CoordinationV1().Leases(sc.ns)
	lease, err := leases.Get(ctx, "vmss-autoscaler", metav1.GetOptions{})
	must(t, err)
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("lease %s/vmss-autoscaler has no holder", sc.ns)
	}
	holder := *lease.Spec.HolderIdentity
	leaseDuration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second

	// A scraper, allowed get /metrics, reads it before and during the flood.
	scraperToken := sc.metricsScraper()
	insecure := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the listener's certificate is self-signed
	scrapeClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: insecure}}
	scrape := func() (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+secureAddr+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+scraperToken)
		resp, err := scrapeClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer func() { _ = resp.Body.Close() }()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	sc.eventually("the scraper reading /metrics before the flood", 30*time.Second, func() (bool, string) {
		code, err := scrape()
		return code == http.StatusOK, fmt.Sprintf("%d %v", code, err)
	})
	_, body := sc.get(p, "/metrics")
	reviewsBefore := floodMetric(body, `vmss_autoscaler_delegated_reviews_total{kind="token",result="denied"}`)

	floodCtx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	st := &floodStats{}
	floodDone := flood(floodCtx, secureAddr, 256, 2*time.Millisecond, st)
	floodStart := time.Now()
	var scrapes struct {
		sync.Mutex
		ok     int
		failed []string
	}
	scraperDone := make(chan struct{})
	go func() {
		defer close(scraperDone)
		for floodCtx.Err() == nil {
			code, err := scrape()
			scrapes.Lock()
			if code == http.StatusOK {
				scrapes.ok++
			} else if floodCtx.Err() == nil {
				scrapes.failed = append(scrapes.failed, fmt.Sprintf("at %s: %d %v", time.Since(floodStart).Round(time.Millisecond), code, err))
			}
			scrapes.Unlock()
			select {
			case <-floodCtx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}()

	// A scale-up in the midst of the flood, 10 s in.
	const pods = 8
	// The flood lasts at least minFlood: 7 lease durations, the scale-up
	// done within it (a starved renewal shows within one; 60 s, as it was,
	// cost 30 s more of a test that runs alone).
	const scaleAfter, minFlood, maxFlood = 10 * time.Second, 30 * time.Second, 3 * time.Minute
	var maxAge time.Duration
	scaling, running := false, false
	for {
		select {
		case <-p.Exited():
			t.Fatalf("the leader exited %s into the flood (%d requests sent): %v; lost its lease? See %s",
				time.Since(floodStart).Round(time.Millisecond), st.sent.Load(), p.ExitErr(), p.LogFile)
		default:
		}
		l, err := leases.Get(ctx, "vmss-autoscaler", metav1.GetOptions{})
		must(t, err)
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != holder {
			t.Fatalf("lease holder %v %s into the flood, want %s throughout", l.Spec.HolderIdentity, time.Since(floodStart).Round(time.Millisecond), holder)
		}
		if l.Spec.RenewTime == nil {
			t.Fatal("lease without renewTime")
		}
		age := time.Since(l.Spec.RenewTime.Time)
		maxAge = max(maxAge, age)
		if age > leaseDuration {
			t.Fatalf("lease last renewed %s ago, %s into the flood (%d requests sent): past its %s duration, another replica could take it",
				age.Round(time.Millisecond), time.Since(floodStart).Round(time.Millisecond), st.sent.Load(), leaseDuration)
		}
		if !scaling && time.Since(floodStart) >= scaleAfter {
			sc.workload("web", pods, "9", 0, cpu) // one pod a node
			scaling = true
		}
		if scaling && !running {
			ph := sc.podPhases()
			running = ph[apiv1.PodRunning] == pods
			if running {
				t.Logf("%d pods Running %s into the flood, %s after they were created (%d requests sent)", pods,
					time.Since(floodStart).Round(time.Second), (time.Since(floodStart) - scaleAfter).Round(time.Second), st.sent.Load())
			}
		}
		elapsed := time.Since(floodStart)
		if running && elapsed >= minFlood {
			break
		}
		if elapsed > maxFlood {
			t.Fatalf("after %s of flood: pods %v, nodes %v; want %d Running", elapsed.Round(time.Second), sc.podPhases(), sc.nodesOf(), pods)
		}
		time.Sleep(250 * time.Millisecond)
	}
	stopFlood()
	floodDone()
	<-scraperDone
	elapsed := time.Since(floodStart)

	_, body = sc.get(p, "/metrics")
	reviews := floodMetric(body, `vmss_autoscaler_delegated_reviews_total{kind="token",result="denied"}`) - reviewsBefore
	busy := floodMetric(body, `vmss_autoscaler_delegated_reviews_skipped_total{kind="token",reason="busy"}`)
	rate := float64(st.sent.Load()) / elapsed.Seconds()
	t.Logf("flood: %d requests with random tokens in %s (%.0f/s): %d answered 401, %d 429, %d other, %d errors; "+
		"%v TokenReviews sent (%.1f/s), %v answered busy without one; lease renewed at most %s ago at every poll; scraper: %d reads, failed %q",
		st.sent.Load(), elapsed.Round(time.Millisecond), rate, st.unauthorized.Load(), st.tooMany.Load(), st.other.Load(), st.errs.Load(),
		reviews, reviews/elapsed.Seconds(), busy, maxAge.Round(time.Millisecond), scrapes.ok, scrapes.failed)
	// The reviews' own limiter: 20 a second, bursts of 40 (secureserve.ReviewQPS, ReviewBurst).
	if limit := 40 + 20*elapsed.Seconds() + 5; reviews > limit || reviews < 0 {
		t.Errorf("%v TokenReviews in %s of flood, want at most %.0f (the reviews' limiter)", reviews, elapsed.Round(time.Second), limit)
	}
	if st.tooMany.Load() == 0 || busy <= 0 {
		t.Errorf("no request answered 429 (busy %v): the flood did not saturate the reviews", busy)
	}
	if rate < 100 {
		t.Errorf("the flood reached %.0f requests a second, want at least 100", rate)
	}
	if len(scrapes.failed) > 0 || scrapes.ok < 10 {
		t.Errorf("the scraper, allowed before the flood: %d reads, failed %q; want every read served", scrapes.ok, scrapes.failed)
	}
	if sc.logContains(p, "failed to renew lease") {
		t.Errorf("the leader failed a renewal during the flood: see %s", p.LogFile)
	}
}

// floodStats count the flood's answers.
type floodStats struct {
	sent, unauthorized, tooMany, other, errs atomic.Int64
}

// flood sends GET /metrics with a fresh random bearer token from workers
// connections (kept alive), one request every `every` at most, until ctx
// ends; the returned func waits for the workers.
func flood(ctx context.Context, addr string, workers int, every time.Duration, st *floodStats) func() {
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed
		MaxIdleConns:        workers,
		MaxIdleConnsPerHost: workers,
		MaxConnsPerHost:     workers,
	}
	client := &http.Client{Timeout: 15 * time.Second, Transport: tr}
	tick := time.NewTicker(every)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 32)
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				_, _ = rand.Read(b)
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
				if err != nil {
					st.errs.Add(1)
					continue
				}
				req.Header.Set("Authorization", "Bearer "+hex.EncodeToString(b))
				st.sent.Add(1)
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						st.errs.Add(1)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusUnauthorized:
					st.unauthorized.Add(1)
				case http.StatusTooManyRequests:
					st.tooMany.Add(1)
				default:
					st.other.Add(1)
				}
			}
		}()
	}
	return func() {
		wg.Wait()
		tick.Stop()
		tr.CloseIdleConnections()
	}
}

// metricsScraper makes a ServiceAccount of the scenario's namespace that
// RBAC lets get /metrics and returns a token of it.
func (sc *scenario) metricsScraper() string {
	sc.t.Helper()
	t, ctx, admin := sc.t, sc.ctx, sc.s.cp.Client
	name := sc.ns + "-metrics-scraper"
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{})
	must(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "metrics-scraper", Namespace: sc.ns}},
	}, metav1.CreateOptions{})
	must(t, err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	_, err = admin.CoreV1().ServiceAccounts(sc.ns).Create(ctx, &apiv1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "metrics-scraper"}}, metav1.CreateOptions{})
	must(t, err)
	exp := int64(3600)
	tok, err := admin.CoreV1().ServiceAccounts(sc.ns).CreateToken(ctx, "metrics-scraper", &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	must(t, err)
	return tok.Status.Token
}

// floodMetric is metricValue of a labelled sample, 0 when absent.
func floodMetric(body, sample string) float64 {
	return max(0, metricValue(body, sample))
}
