package secureserve

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

const scraperUser = "system:serviceaccount:monitoring:prometheus"

// fakeAPI is an API server's TokenReviews and SubjectAccessReviews: the
// token "scraper" is Prometheus' ServiceAccount, allowed get /metrics;
// "other" is a ServiceAccount without the grant; every other token is
// unknown. Tokens starting with "slow-" are answered only once release is
// closed.
type fakeAPI struct {
	client          kubernetes.Interface
	tokens, access  atomic.Int64
	release         chan struct{}
	inFlightReached chan struct{} // closed when waitFor slow tokens are in review
	waitFor         int64
	slow            atomic.Int64
}

func newFakeAPI(waitFor int64) *fakeAPI {
	cs := fake.NewClientset()
	f := &fakeAPI{release: make(chan struct{}), inFlightReached: make(chan struct{}), waitFor: waitFor}
	// The fake clientset holds a lock while a reactor runs: the slow
	// tokens wait in front of it (slowClient), not in the reactor.
	f.client = slowClient{Clientset: cs, f: f}
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.tokens.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		switch tr.Spec.Token {
		case "scraper":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: scraperUser, Groups: []string{"system:serviceaccounts"}}}
		case "other":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "system:serviceaccount:default:default"}}
		default:
			// What the API server says of a token that is not a JWT it signed.
			tr.Status = authenticationv1.TokenReviewStatus{Error: "[invalid bearer token, token lookup failed]"}
		}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.access.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		nr := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == scraperUser && nr != nil && nr.Verb == "get" && nr.Path == "/metrics"
		return true, sar, nil
	})
	return f
}

type slowClient struct {
	*fake.Clientset
	f *fakeAPI
}

func (c slowClient) AuthenticationV1() authenticationv1client.AuthenticationV1Interface {
	return slowAuthentication{c.Clientset.AuthenticationV1(), c.f}
}

type slowAuthentication struct {
	authenticationv1client.AuthenticationV1Interface
	f *fakeAPI
}

func (a slowAuthentication) TokenReviews() authenticationv1client.TokenReviewInterface {
	return slowTokenReviews{a.AuthenticationV1Interface.TokenReviews(), a.f}
}

type slowTokenReviews struct {
	authenticationv1client.TokenReviewInterface
	f *fakeAPI
}

func (r slowTokenReviews) Create(ctx context.Context, tr *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	if strings.HasPrefix(tr.Spec.Token, "slow-") {
		if r.f.slow.Add(1) == r.f.waitFor {
			close(r.f.inFlightReached)
		}
		<-r.f.release
	}
	return r.TokenReviewInterface.Create(ctx, tr, opts)
}

// randomToken is what a flood sends: a token never seen before.
func randomToken() string { return rand.Text() + rand.Text() }

var metricsMux = func() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "up 1\n") })
	return mux
}()

func serve(h http.Handler, token string) int {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func handlerFor(t *testing.T, client kubernetes.Interface, o ReviewOptions) http.Handler {
	t.Helper()
	authn, authz, err := Delegating(client, o)
	if err != nil {
		t.Fatal(err)
	}
	return Handler(metricsMux, authn, authz, []string{"/healthz"})
}

// 1,000 random tokens at once: as many TokenReviews as there are slots
// for unknown callers (6 of 8), the rest answered 429 at once without a
// call; the reviewed ones answered 401 and cached, so sending them again
// costs nothing; a token turned away busy was not answered, so it is
// reviewed when sent again.
func TestRandomTokensCostAtMostTheCap(t *testing.T) {
	const n, maxInFlight, unknownSlots = 1000, 8, 6
	api := newFakeAPI(unknownSlots)
	h := handlerFor(t, api.client, ReviewOptions{MaxInFlight: maxInFlight})
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = "slow-" + randomToken()
	}
	codes := make([]int, n)
	var wg sync.WaitGroup
	var done atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = serve(h, tokens[i])
			done.Add(1)
		}()
	}
	select {
	case <-api.inFlightReached:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d reviews in flight, want %d", api.slow.Load(), unknownSlots)
	}
	// Every request but those in review is answered while they wait.
	deadline := time.Now().Add(10 * time.Second)
	for done.Load() < n-unknownSlots && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := done.Load(); got != n-unknownSlots {
		t.Fatalf("%d requests answered while %d reviews were in flight, want %d answered at once", got, unknownSlots, n-unknownSlots)
	}
	close(api.release)
	wg.Wait()
	count := map[int]int{}
	for _, c := range codes {
		count[c]++
	}
	if got := api.tokens.Load(); got != unknownSlots {
		t.Fatalf("%d TokenReviews for %d random tokens, want %d (the slots for unknown callers)", got, n, unknownSlots)
	}
	if count[http.StatusTooManyRequests] != n-unknownSlots || count[http.StatusUnauthorized] != unknownSlots {
		t.Fatalf("answers %v, want %d 429 and %d 401", count, n-unknownSlots, unknownSlots)
	}
	t.Logf("%d random tokens at once: %d TokenReviews, answers %v", n, api.tokens.Load(), count)

	// The rejected tokens again: answered from the cache of negative answers.
	for i, c := range codes {
		if c == http.StatusUnauthorized {
			if got := serve(h, tokens[i]); got != http.StatusUnauthorized {
				t.Fatalf("a rejected token again: %d, want 401", got)
			}
		}
	}
	if got := api.tokens.Load(); got != unknownSlots {
		t.Fatalf("%d TokenReviews after the rejected tokens came again, want still %d", got, unknownSlots)
	}
	// A token turned away busy is reviewed when it comes back.
	for i, c := range codes {
		if c == http.StatusTooManyRequests {
			if got := serve(h, tokens[i]); got != http.StatusUnauthorized {
				t.Fatalf("a token turned away busy, again: %d, want 401", got)
			}
			break
		}
	}
	if got := api.tokens.Load(); got != unknownSlots+1 {
		t.Fatalf("%d TokenReviews, want %d", got, unknownSlots+1)
	}
}

// A negative answer costs no call until DenyTTL; then it is asked again.
// So does a positive one, until AllowTTL; the access review likewise.
func TestAnswersCachedForTheirTTL(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_000_000, 0)}
	api := newFakeAPI(0)
	h := handlerFor(t, api.client, ReviewOptions{AllowTTL: 10 * time.Second, DenyTTL: 5 * time.Second, now: clk.Now})
	bad := randomToken()
	for range 100 {
		if got := serve(h, bad); got != http.StatusUnauthorized {
			t.Fatalf("random token: %d, want 401", got)
		}
	}
	if got := api.tokens.Load(); got != 1 {
		t.Fatalf("%d TokenReviews for one rejected token sent 100 times, want 1", got)
	}
	for range 100 {
		if got := serve(h, "scraper"); got != http.StatusOK {
			t.Fatalf("scraper: %d, want 200", got)
		}
		if got := serve(h, "other"); got != http.StatusForbidden {
			t.Fatalf("other: %d, want 403", got)
		}
	}
	if tr, sar := api.tokens.Load(), api.access.Load(); tr != 3 || sar != 2 {
		t.Fatalf("%d TokenReviews and %d SubjectAccessReviews, want 3 and 2", tr, sar)
	}
	clk.step(6 * time.Second) // past DenyTTL: the rejected token and the denied request are asked again
	serve(h, bad)
	serve(h, "scraper")
	serve(h, "other")
	if tr, sar := api.tokens.Load(), api.access.Load(); tr != 4 || sar != 3 {
		t.Fatalf("after DenyTTL: %d TokenReviews and %d SubjectAccessReviews, want 4 and 3", tr, sar)
	}
	clk.step(5 * time.Second) // past AllowTTL
	serve(h, "scraper")
	if tr, sar := api.tokens.Load(), api.access.Load(); tr != 5 || sar != 4 {
		t.Fatalf("after AllowTTL: %d TokenReviews and %d SubjectAccessReviews, want 5 and 4", tr, sar)
	}
}

// A scraper allowed before is re-reviewed on slots of its own: a flood of
// random tokens holding every other slot does not turn it away, while a
// valid token never allowed before is turned away busy.
func TestKnownScraperNotStarvedByAFlood(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_000_000, 0)}
	const unknownSlots = 6
	api := newFakeAPI(unknownSlots)
	h := handlerFor(t, api.client, ReviewOptions{MaxInFlight: 8, now: clk.Now})
	if got := serve(h, "scraper"); got != http.StatusOK {
		t.Fatalf("scraper: %d", got)
	}
	var wg sync.WaitGroup
	for range unknownSlots {
		wg.Add(1)
		go func() { defer wg.Done(); serve(h, "slow-"+randomToken()) }()
	}
	<-api.inFlightReached
	if got := serve(h, randomToken()); got != http.StatusTooManyRequests {
		t.Fatalf("random token with every slot busy: %d, want 429", got)
	}
	clk.step(time.Minute) // the scraper's answers are stale
	for range 3 {
		if got := serve(h, "scraper"); got != http.StatusOK {
			t.Fatalf("scraper during the flood: %d, want 200", got)
		}
	}
	// (The flood's reviews are still waiting: counted once answered.)
	if tr, sar, slow := api.tokens.Load(), api.access.Load(), api.slow.Load(); tr != 2 || sar != 2 || slow != unknownSlots {
		t.Fatalf("%d TokenReviews answered (%d waiting), %d SubjectAccessReviews; want the scraper's asked twice each, %d waiting", tr, slow, sar, unknownSlots)
	}
	if got := serve(h, "other"); got != http.StatusTooManyRequests {
		t.Fatalf("a valid token never allowed, during the flood: %d, want 429", got)
	}
	close(api.release)
	wg.Wait()
}

// Random tokens do not grow memory without bound: each cache keeps at
// most CacheSize entries, each a fixed-size hash of the token.
func TestCachesBounded(t *testing.T) {
	api := newFakeAPI(0)
	tokens, access, err := newReviewers(api.client, ReviewOptions{CacheSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	h := Handler(metricsMux, bearertoken.New(tokens), access, nil)
	const n = 10_000
	for range n {
		if got := serve(h, strings.Repeat("x", 1000)+randomToken()); got != http.StatusUnauthorized {
			t.Fatalf("random token: %d", got)
		}
	}
	if got := api.tokens.Load(); got != n {
		t.Fatalf("%d TokenReviews for %d distinct tokens one at a time", got, n)
	}
	neg, pos := tokens.gate.neg.Keys(), tokens.gate.pos.Keys()
	if len(neg) > 100 || len(pos) != 0 {
		t.Fatalf("caches hold %d negative and %d positive entries, want at most 100", len(neg), len(pos))
	}
	for _, k := range neg {
		if len(k.(string)) != 32 {
			t.Fatalf("a cache key of %d bytes, want a 32-byte hash", len(k.(string)))
		}
	}
}

// The reviews' client has its own limiter: flooding the listener with
// random tokens sends at most ReviewBurst + ReviewQPS a second TokenReviews
// to the API server, and the autoscaler's own client (the lease, the loop)
// is not slowed at all.
func TestReviewClientHasItsOwnLimiter(t *testing.T) {
	var reviews atomic.Int64
	apiServer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/apis/authentication.k8s.io/v1/tokenreviews":
			reviews.Add(1)
			var tr authenticationv1.TokenReview
			_ = json.NewDecoder(r.Body).Decode(&tr)
			tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
			_ = json.NewEncoder(w).Encode(tr)
		case r.URL.Path == "/version":
			_, _ = io.WriteString(w, `{"major":"1","minor":"36","gitVersion":"v1.36.3"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer apiServer.Close()
	// The autoscaler's client: a small limiter, as if nearly spent.
	base := &rest.Config{Host: apiServer.URL, QPS: 5, Burst: 5, UserAgent: "vmss-autoscaler"}
	own, err := kubernetes.NewForConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	reviewClient, err := NewReviewClient(base)
	if err != nil {
		t.Fatal(err)
	}
	h := handlerFor(t, reviewClient, ReviewOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, tooMany atomic.Int64
	start := time.Now()
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				sent.Add(1)
				if serve(h, randomToken()) == http.StatusTooManyRequests {
					tooMany.Add(1)
					time.Sleep(time.Millisecond) // a client that does not spin
				}
			}
		}()
	}
	// Meanwhile the autoscaler's own requests go straight through.
	for range 5 {
		time.Sleep(200 * time.Millisecond)
		t0 := time.Now()
		if _, err := own.Discovery().ServerVersion(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d > 500*time.Millisecond {
			t.Errorf("the autoscaler's request took %s during the flood", d)
		}
	}
	cancel()
	wg.Wait()
	elapsed := time.Since(start)
	limit := int64(ReviewBurst + ReviewQPS*elapsed.Seconds() + 2)
	if got := reviews.Load(); got > limit || got < ReviewBurst {
		t.Fatalf("%d TokenReviews in %s, want between %d and %d (burst %d, %d/s)", got, elapsed.Round(time.Millisecond), ReviewBurst, limit, ReviewBurst, ReviewQPS)
	}
	t.Logf("%d requests with random tokens in %s (%d answered 429 at once): %d TokenReviews", sent.Load(), elapsed.Round(time.Millisecond), tooMany.Load(), reviews.Load())
}
