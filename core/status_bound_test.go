package core

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/yaml"
)

// TestStatusBoundedWhateverTenantsWrite (#40): a buffer whose template
// name is 550 KB (its not-ready message quotes it twice) and thousands
// of waiting requests with long messages: every tenant message is cut,
// lists are shortened with their counts kept, and the rendered status
// stays within maxStatusBytes, so the ConfigMap keeps room for the safety
// state. Before, the status grew past the API server's 1 MiB and every
// loop failed.
func TestStatusBoundedWhateverTenantsWrite(t *testing.T) {
	huge := strings.Repeat("a", 550<<10)
	st := Status{CapacityBuffers: &CapacityBuffersStatus{}, ProvisioningRequests: &ProvisioningRequestsStatus{}}
	st.CapacityBuffers.Buffers = append(st.CapacityBuffers.Buffers, CapacityBufferStatus{Buffer: "ml/b",
		Message: `not ready: spec.podTemplateRef.name: PodTemplate ml/` + huge + `: podtemplate "` + huge + `" not found`})
	for range 3000 {
		st.ProvisioningRequests.Waiting = append(st.ProvisioningRequests.Waiting, WaitingRequest{Request: "ml/r", Class: "check-capacity.autoscaling.x-k8s.io",
			Message: strings.Repeat("é", 400)})
	}
	_, full, err := boundStatus(&st)
	if err != nil {
		t.Fatal(err)
	}
	if len(full) > maxStatusBytes {
		t.Fatalf("status of %d bytes, over %d", len(full), maxStatusBytes)
	}
	var back Status
	if err := yaml.Unmarshal([]byte(full), &back); err != nil {
		t.Fatalf("the bounded status does not parse: %v", err)
	}
	if m := back.CapacityBuffers.Buffers[0].Message; len(m) > maxStatusMessage || !utf8.ValidString(m) || !strings.HasSuffix(m, "(cut)") {
		t.Fatalf("buffer message of %d bytes (valid UTF-8 %v), want at most %d, cut", len(m), utf8.ValidString(m), maxStatusMessage)
	}
	p := back.ProvisioningRequests
	if len(p.Waiting) == 3000 || len(p.Waiting)+p.More != 3000 {
		t.Fatalf("%d waiting requests listed, %d more: want the list shortened, every request counted", len(p.Waiting), p.More)
	}
	for _, w := range p.Waiting {
		if len(w.Message) > maxStatusMessage || !utf8.ValidString(w.Message) {
			t.Fatalf("a waiting request's message of %d bytes", len(w.Message))
		}
	}
}

// TestStatusWriteFailureIsNoFailedLoop (#40): a status write the API
// server refuses is counted and told once; the loop succeeds (before, it
// failed every loop and /healthz restarted the leader, then the
// standby).
func TestStatusWriteFailureIsNoFailedLoop(t *testing.T) {
	e := newEnv(t)
	e.start()
	e.status.fail = errors.New(`ConfigMap "vmss-autoscaler-status" is invalid: []: Too long: may not be more than 1048576 bytes`)
	e.run()
	e.run()
	if got := testutil.ToFloat64(e.a.metrics.StatusWriteFailures); got != 2 {
		t.Fatalf("status write failures %v, want 2", got)
	}
	if got := e.events(EventStatusWriteFailed); len(got) != 1 {
		t.Fatalf("StatusWriteFailed events %q, want 1 for the run of failures", got)
	}
	e.status.fail = nil
	e.run()
	if len(e.status.writes) != 1 {
		t.Fatalf("%d status writes once the API server takes it, want 1", len(e.status.writes))
	}
}
