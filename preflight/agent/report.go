package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
)

const (
	// Event reasons on the Node.
	ReasonPassed = "PreflightPassed"
	ReasonFailed = "PreflightFailed"

	// eventComponent is the events' source.
	eventComponent = "vmss-autoscaler-preflight"
	// eventMessageLimit keeps event messages within what the events API
	// accepts for its newer clients (1 KiB).
	eventMessageLimit = 1024
	// flushTimeout bounds how long the agent waits for its events to be
	// written before it exits.
	flushTimeout = 5 * time.Second
)

// reportBackoff retries a node update through transient API errors (the
// API server restarting, throttling) for about a minute, so that minutes of
// checks are not thrown away and run again by a restarted pod.
func reportBackoff() wait.Backoff {
	return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 8, Cap: 15 * time.Second}
}

// nodeClient reads and updates the agent's own Node, the one named
// nodeName, and no other.
type nodeClient struct {
	client   kubernetes.Interface
	nodeName string
}

func (c nodeClient) get(ctx context.Context) (*corev1.Node, error) {
	node, err := c.client.CoreV1().Nodes().Get(ctx, c.nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", c.nodeName, err)
	}
	return node, nil
}

// update applies mutate to the node as it is now and writes it back with
// Update, which carries the resourceVersion read: if anyone changed the
// node in between (another taint, a label), the API server answers Conflict
// and the node is read and mutated again, so their change is kept. mutate
// reports whether it changed anything; nothing is written when not. update
// returns the node as last read or written, and whether it wrote.
func (c nodeClient) update(ctx context.Context, mutate func(*corev1.Node) bool) (*corev1.Node, bool, error) {
	var node *corev1.Node
	var wrote bool
	attempt := func() error {
		wrote = false
		current, err := c.get(ctx)
		if err != nil {
			return err
		}
		node = current
		if !mutate(current) {
			return nil
		}
		updated, err := c.client.CoreV1().Nodes().Update(ctx, current, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("update node %s: %w", c.nodeName, err)
		}
		node, wrote = updated, true
		return nil
	}
	var lastErr error
	err := wait.ExponentialBackoffWithContext(ctx, reportBackoff(), func(context.Context) (bool, error) {
		err := retry.RetryOnConflict(retry.DefaultRetry, attempt)
		switch {
		case err == nil:
			return true, nil
		case isTransient(err):
			lastErr = err
			return false, nil
		default:
			return false, err
		}
	})
	if wait.Interrupted(err) && lastErr != nil {
		err = fmt.Errorf("gave up retrying: %w", lastErr)
	}
	return node, wrote, err
}

// isTransient reports whether an API error may go away by itself: anything
// but a definite answer about the request.
func isTransient(err error) bool {
	switch {
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err), apierrors.IsUnauthorized(err),
		apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err),
		apierrors.IsConflict(err), apierrors.IsRequestEntityTooLargeError(err):
		return false
	}
	return true
}

// events records events on the Node through an EventBroadcaster that
// writes to the API server. Call close before exiting: events are written
// asynchronously.
type events struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	sink        *deliverySink
	emitted     int // events handed to the recorder; only the agent's goroutine touches it
}

func newEvents(ctx context.Context, client kubernetes.Interface, nodeName string) *events {
	return newEventsToSink(ctx, &typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, nodeName)
}

func newEventsToSink(ctx context.Context, to record.EventSink, nodeName string) *events {
	sink := &deliverySink{EventSink: to, notify: make(chan struct{})}
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(sink)
	return &events{
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: eventComponent, Host: nodeName}),
		sink:        sink,
	}
}

func (e *events) emit(node *corev1.Node, eventType, reason, message string) {
	e.emitted++
	e.recorder.Event(node, eventType, reason, truncateHead(message, eventMessageLimit))
}

// close waits (at most flushTimeout, or until ctx ends) until every emitted
// event has been sent to the API server once, then shuts the broadcaster
// down. An event the recorder's spam filter dropped is never sent; the
// timeout covers that case.
func (e *events) close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	e.sink.waitFor(ctx, e.emitted)
	e.broadcaster.Shutdown()
}

// deliverySink counts the writes of events to the API server, so that the
// agent can wait for them before it exits.
type deliverySink struct {
	record.EventSink
	mu       sync.Mutex
	attempts int
	notify   chan struct{} // closed and replaced at every attempt
}

func (s *deliverySink) Create(e *corev1.Event) (*corev1.Event, error) {
	out, err := s.EventSink.Create(e)
	s.attempted()
	return out, err
}

func (s *deliverySink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	out, err := s.EventSink.Patch(e, data)
	if !apierrors.IsNotFound(err) { // on NotFound the broadcaster creates the event instead
		s.attempted()
	}
	return out, err
}

func (s *deliverySink) attempted() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	close(s.notify)
	s.notify = make(chan struct{})
}

// waitFor waits until n events were attempted or ctx ends.
func (s *deliverySink) waitFor(ctx context.Context, n int) {
	for {
		s.mu.Lock()
		done, notify := s.attempts >= n, s.notify
		s.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-notify:
		}
	}
}
