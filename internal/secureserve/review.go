package secureserve

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Whoever can reach the listener makes it ask the API server: every
// unknown bearer token is a TokenReview, every request of an authenticated
// caller not answered recently a SubjectAccessReview. Random tokens are
// all unknown. So the reviews are fenced in three ways:
//
//   - their own client (NewReviewClient), with its own rate limiter
//     (ReviewQPS, ReviewBurst): they never queue the lease renewals or the
//     loop's requests behind them;
//   - a cap on reviews in flight (ReviewOptions.MaxInFlight): a request
//     that needs a review beyond it is answered 429 at once, without
//     calling the API server, so the requests waiting for the limiter are
//     bounded too;
//   - bounded caches of the answers, negative ones included
//     (ReviewOptions.CacheSize, AllowTTL, DenyTTL): a token or a request
//     answered recently costs no call, and random tokens cannot grow
//     memory without bound.
//
// A token or a request allowed before (a scraper's) is re-reviewed, when its
// answer is stale, on slots of its own (a quarter of MaxInFlight), so a
// flood of random tokens that holds every other slot does not turn the
// scraper away.

// The reviews' client-side rate limit: at most ReviewQPS reviews a second
// (bursts of ReviewBurst) reach the API server, whatever reaches the port.
const (
	ReviewQPS   = 20
	ReviewBurst = 40
)

// ErrBusy is the answer to a request that needs a review while
// MaxInFlight are in flight: the handler answers 429 with Retry-After.
var ErrBusy = errors.New("too many delegated authentication or authorization reviews in flight")

// ReviewOptions bound what the delegated reviews cost.
type ReviewOptions struct {
	// MaxInFlight caps the TokenReviews and SubjectAccessReviews in flight
	// (default 8), a quarter of them (rounded down) kept for callers
	// allowed before.
	MaxInFlight int
	// CacheSize bounds each cache of answers: accepted tokens, rejected
	// tokens, allowed and denied requests (default 4096 entries each; an
	// entry holds a hash of its key, not the token).
	CacheSize int
	// AllowTTL is how long an accepted token or an allowed request is
	// trusted without asking again (default 10s).
	AllowTTL time.Duration
	// DenyTTL is how long a rejected token or a denied request is answered
	// from the cache (default 10s).
	DenyTTL time.Duration
	// Timeout of one review (default 10s).
	Timeout time.Duration
	// Registerer takes the reviews' metrics (nil: not exported).
	Registerer prometheus.Registerer

	now func() time.Time // tests
}

func (o ReviewOptions) withDefaults() ReviewOptions {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 8
	}
	if o.CacheSize <= 0 {
		o.CacheSize = 4096
	}
	if o.AllowTTL <= 0 {
		o.AllowTTL = 10 * time.Second
	}
	if o.DenyTTL <= 0 {
		o.DenyTTL = 10 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.now == nil {
		o.now = time.Now
	}
	return o
}

// knownFor is how long an allowed token or request keeps its claim on the
// reserved slots after its answer went stale.
const knownFor = time.Hour

// maxReason bounds the API server's reason kept with a cached answer.
const maxReason = 256

// NewReviewClient is the client of the reviews: base's (the autoscaler's
// identity and endpoint) with a rate limiter of its own at ReviewQPS and
// ReviewBurst. Give it a base without the autoscaler's request observers:
// the adaptive node-addition rate must not be moved by whoever reaches the
// port.
func NewReviewClient(base *rest.Config) (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(base)
	cfg.QPS, cfg.Burst = ReviewQPS, ReviewBurst
	cfg.RateLimiter = nil // never the base's limiter
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	cfg.UserAgent += " (delegated-auth)"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client of delegated authentication: %w", err)
	}
	return c, nil
}

// Delegating builds the authenticator (TokenReview of the bearer token)
// and authorizer (SubjectAccessReview) that ask the API server through
// client (NewReviewClient's), within o's bounds. The caller's identity
// needs create on tokenreviews and subjectaccessreviews (the
// system:auth-delegator ClusterRole's rules).
func Delegating(client kubernetes.Interface, o ReviewOptions) (authenticator.Request, authorizer.Authorizer, error) {
	tokens, access, err := newReviewers(client, o)
	if err != nil {
		return nil, nil, err
	}
	return group.NewAuthenticatedGroupAdder(bearertoken.New(tokens)), access, nil
}

func newReviewers(client kubernetes.Interface, o ReviewOptions) (*tokenReviewer, *accessReviewer, error) {
	if client == nil {
		return nil, nil, errors.New("delegated authentication: no Kubernetes client")
	}
	o = o.withDefaults()
	m := newReviewMetrics(o.Registerer)
	reserved := o.MaxInFlight / 4
	s := &slots{any: make(chan struct{}, o.MaxInFlight-reserved)}
	if reserved > 0 {
		s.known = make(chan struct{}, reserved)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, nil, fmt.Errorf("delegated authentication: cache key: %w", err)
	}
	g := func(kind string) *gate {
		clk := clockFunc(o.now)
		return &gate{kind: kind, o: o, slots: s, hmacKey: key, metrics: m,
			pos: utilcache.NewLRUExpireCacheWithClock(o.CacheSize, clk),
			neg: utilcache.NewLRUExpireCacheWithClock(o.CacheSize, clk)}
	}
	return &tokenReviewer{client: client, gate: g("token")}, &accessReviewer{client: client, gate: g("access")}, nil
}

type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// slots are the reviews in flight: any for every review, known for the
// re-review of a token or request allowed before (tried first).
type slots struct {
	any, known chan struct{}
}

func (s *slots) acquire(known bool) (release func(), ok bool) {
	if known && s.known != nil {
		select {
		case s.known <- struct{}{}:
			return func() { <-s.known }, true
		default:
		}
	}
	select {
	case s.any <- struct{}{}:
		return func() { <-s.any }, true
	default:
		return nil, false
	}
}

// answer is a review's outcome, as cached.
type answer struct {
	allowed bool
	reason  string
	// user is the token's, when accepted.
	user user.Info
	// decision is the request's, when reviewed.
	decision authorizer.Decision
	// fresh: trusted until then; past it, an allowed answer only marks its
	// key as known (the reserved slots).
	fresh time.Time
}

// gate answers from the caches, or reviews within the slots.
type gate struct {
	kind     string
	o        ReviewOptions
	slots    *slots
	hmacKey  []byte
	metrics  *reviewMetrics
	pos, neg *utilcache.LRUExpireCache
}

// key is an HMAC of what is reviewed: neither tokens nor long paths are
// kept, and every entry has the same small size.
func (g *gate) key(b []byte) string {
	h := hmac.New(sha256.New, g.hmacKey)
	h.Write(b)
	return string(h.Sum(nil))
}

func (g *gate) do(ctx context.Context, key string, review func(context.Context) (*answer, error)) (*answer, error) {
	known := false
	if v, ok := g.pos.Get(key); ok {
		a := v.(*answer)
		if g.o.now().Before(a.fresh) {
			g.metrics.skipped.WithLabelValues(g.kind, "cached").Inc()
			return a, nil
		}
		known = true
	}
	if v, ok := g.neg.Get(key); ok {
		g.metrics.skipped.WithLabelValues(g.kind, "cached").Inc()
		return v.(*answer), nil
	}
	release, ok := g.slots.acquire(known)
	if !ok {
		g.metrics.skipped.WithLabelValues(g.kind, "busy").Inc()
		return nil, ErrBusy
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, g.o.Timeout)
	defer cancel()
	a, err := review(ctx)
	if err != nil {
		g.metrics.reviews.WithLabelValues(g.kind, "error").Inc()
		return nil, err
	}
	if len(a.reason) > maxReason {
		a.reason = a.reason[:maxReason]
	}
	if a.allowed {
		g.metrics.reviews.WithLabelValues(g.kind, "allowed").Inc()
		a.fresh = g.o.now().Add(g.o.AllowTTL)
		g.neg.Remove(key)
		g.pos.Add(key, a, knownFor)
	} else {
		g.metrics.reviews.WithLabelValues(g.kind, "denied").Inc()
		g.pos.Remove(key)
		g.neg.Add(key, a, g.o.DenyTTL)
	}
	return a, nil
}

// tokenReviewer is an authenticator.Token asking TokenReviews.
type tokenReviewer struct {
	client kubernetes.Interface
	gate   *gate
}

func (t *tokenReviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	a, err := t.gate.do(ctx, t.gate.key([]byte(token)), func(ctx context.Context) (*answer, error) {
		r, err := t.client.AuthenticationV1().TokenReviews().Create(ctx,
			&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("TokenReview: %w", err)
		}
		if !r.Status.Authenticated {
			return &answer{reason: r.Status.Error}, nil
		}
		u := r.Status.User
		var extra map[string][]string
		if len(u.Extra) > 0 {
			extra = make(map[string][]string, len(u.Extra))
			for k, v := range u.Extra {
				extra[k] = v
			}
		}
		return &answer{allowed: true, user: &user.DefaultInfo{Name: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra}}, nil
	})
	switch {
	case err != nil:
		return nil, false, err
	case !a.allowed:
		// bearertoken turns this into "invalid bearer token"; the API
		// server's reason, if any, is not the caller's business.
		return nil, false, nil
	}
	return &authenticator.Response{User: a.user}, true, nil
}

// accessReviewer is an authorizer.Authorizer asking SubjectAccessReviews.
type accessReviewer struct {
	client kubernetes.Interface
	gate   *gate
}

func (r *accessReviewer) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	spec := accessSpec(attrs)
	raw, err := json.Marshal(spec)
	if err != nil {
		return authorizer.DecisionNoOpinion, "", err
	}
	a, err := r.gate.do(ctx, r.gate.key(raw), func(ctx context.Context) (*answer, error) {
		res, err := r.client.AuthorizationV1().SubjectAccessReviews().Create(ctx,
			&authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("SubjectAccessReview: %w", err)
		}
		st := res.Status
		switch {
		case st.Denied:
			return &answer{decision: authorizer.DecisionDeny, reason: st.Reason}, nil
		case st.Allowed:
			return &answer{allowed: true, decision: authorizer.DecisionAllow, reason: st.Reason}, nil
		}
		return &answer{decision: authorizer.DecisionNoOpinion, reason: st.Reason}, nil
	})
	if err != nil {
		return authorizer.DecisionNoOpinion, "", err
	}
	return a.decision, a.reason, nil
}

// accessSpec is the SubjectAccessReview of attrs.
func accessSpec(attrs authorizer.Attributes) authorizationv1.SubjectAccessReviewSpec {
	var spec authorizationv1.SubjectAccessReviewSpec
	if u := attrs.GetUser(); u != nil {
		spec.User, spec.UID, spec.Groups = u.GetName(), u.GetUID(), u.GetGroups()
		if ex := u.GetExtra(); len(ex) > 0 {
			spec.Extra = make(map[string]authorizationv1.ExtraValue, len(ex))
			for k, v := range ex {
				spec.Extra[k] = v
			}
		}
	}
	if attrs.IsResourceRequest() {
		spec.ResourceAttributes = &authorizationv1.ResourceAttributes{
			Namespace: attrs.GetNamespace(), Verb: attrs.GetVerb(), Group: attrs.GetAPIGroup(), Version: attrs.GetAPIVersion(),
			Resource: attrs.GetResource(), Subresource: attrs.GetSubresource(), Name: attrs.GetName(),
		}
	} else {
		spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: attrs.GetPath(), Verb: attrs.GetVerb()}
	}
	return spec
}

// reviewMetrics count the reviews asked of the API server and the requests
// answered without one.
type reviewMetrics struct {
	reviews, skipped *prometheus.CounterVec
}

func newReviewMetrics(reg prometheus.Registerer) *reviewMetrics {
	m := &reviewMetrics{
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmss_autoscaler_delegated_reviews_total",
			Help: "TokenReviews (kind token) and SubjectAccessReviews (kind access) the secure metrics listener asked of the API server, by result: allowed, denied, error."},
			[]string{"kind", "result"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmss_autoscaler_delegated_reviews_skipped_total",
			Help: "Requests to the secure metrics listener answered without asking the API server, by kind (token, access) and reason: cached (an answer, allow or deny, within its TTL), busy (every review slot in flight: answered 429)."},
			[]string{"kind", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.reviews, m.skipped)
	}
	return m
}
