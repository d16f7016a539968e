package app

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// liveness answers /healthz (the process's liveness, not the nodes'
// health): a leader is unhealthy when its loop has not run
// for --max-inactivity or not succeeded for --max-failing-time; a standby
// replica is healthy while it waits.
type liveness struct {
	maxInactivity, maxFailing time.Duration
	lastSuccess, lastRun      func() time.Time
	now                       func() time.Time

	mu          sync.Mutex
	leader      bool
	leaderSince time.Time
}

func newLiveness(maxInactivity, maxFailing time.Duration, lastSuccess, lastRun func() time.Time) *liveness {
	return &liveness{maxInactivity: maxInactivity, maxFailing: maxFailing, lastSuccess: lastSuccess, lastRun: lastRun, now: time.Now}
}

func (h *liveness) isLeader() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leader
}

func (h *liveness) setLeader(v bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leader = v
	h.leaderSince = h.now()
}

func (h *liveness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	leader, leaderSince := h.leader, h.leaderSince
	h.mu.Unlock()
	if !leader {
		fmt.Fprintln(w, "ok: standby")
		return
	}
	now := h.now()
	// Times before this replica became leader count from then.
	since := func(t time.Time) time.Time {
		if t.Before(leaderSince) {
			return leaderSince
		}
		return t
	}
	last, run := h.lastSuccess(), h.lastRun()
	if d := now.Sub(since(run)); d > h.maxInactivity {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "unhealthy: no loop has run for %s (--max-inactivity %s)\n", d.Round(time.Second), h.maxInactivity)
		return
	}
	if d := now.Sub(since(last)); d > h.maxFailing {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "unhealthy: no loop has succeeded for %s (--max-failing-time %s)\n", d.Round(time.Second), h.maxFailing)
		return
	}
	fmt.Fprintf(w, "ok: leader, last successful loop %s\n", last.UTC().Format(time.RFC3339))
}
