package armsim

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	testingclock "k8s.io/utils/clock/testing"
)

const (
	testSub = "11111111-2222-3333-4444-555555555555"
	testRG  = "rg-test"
)

// staticToken is a credential handing out a fixed bearer token.
type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "static-test-token", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// testEnv is a started simulator with real armcompute clients pointed at it.
type testEnv struct {
	srv   *Server
	clock *testingclock.FakeClock
	sets  *armcompute.VirtualMachineScaleSetsClient
	vms   *armcompute.VirtualMachineScaleSetVMsClient
	skus  *armcompute.ResourceSKUsClient
	http  *http.Client
	// virtualMachines is the Virtual Machines API (Flexible scale sets).
	virtualMachines *armcompute.VirtualMachinesClient
}

// newTestEnv starts a simulator with opts (a fake clock and the test
// subscription are filled in) holding the given scale sets.
func newTestEnv(t *testing.T, opts Options, specs ...ScaleSetSpec) *testEnv {
	t.Helper()
	fc := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if opts.Clock == nil {
		opts.Clock = fc
	}
	if opts.SubscriptionID == "" {
		opts.SubscriptionID = testSub
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for _, spec := range specs {
		if err := srv.AddScaleSet(spec); err != nil {
			t.Fatalf("AddScaleSet(%+v): %v", spec, err)
		}
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(srv.Close)

	httpClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: srv.CertPool()}}}
	t.Cleanup(httpClient.CloseIdleConnections)
	factory, err := armcompute.NewClientFactory(opts.SubscriptionID, staticToken{}, &arm.ClientOptions{
		ClientOptions: policy.ClientOptions{
			Cloud: cloud.Configuration{Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
				cloud.ResourceManager: {Endpoint: srv.URL(), Audience: "https://management.azure.com"},
			}},
			Transport: httpClient,
			Retry:     policy.RetryOptions{MaxRetries: -1},
		},
	})
	if err != nil {
		t.Fatalf("NewClientFactory: %v", err)
	}
	return &testEnv{
		srv:   srv,
		clock: fc,
		sets:  factory.NewVirtualMachineScaleSetsClient(),
		vms:   factory.NewVirtualMachineScaleSetVMsClient(),
		skus:  factory.NewResourceSKUsClient(),
		http:  httpClient,

		virtualMachines: factory.NewVirtualMachinesClient(),
	}
}

// state returns a scale set's state or fails the test.
func (e *testEnv) state(t *testing.T, name string) ScaleSetState {
	t.Helper()
	st, err := e.srv.ScaleSet(testRG, name)
	if err != nil {
		t.Fatalf("ScaleSet(%s): %v", name, err)
	}
	return st
}

// vmStates maps instance ID to state.
func vmStates(st ScaleSetState) map[string]string {
	out := map[string]string{}
	for _, vm := range st.VMs {
		out[vm.InstanceID] = vm.State
	}
	return out
}

// responseError returns err as an *azcore.ResponseError or fails the test.
func responseError(t *testing.T, err error) *azcore.ResponseError {
	t.Helper()
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("error %v is not an *azcore.ResponseError", err)
	}
	return re
}

// scaleTo starts a PATCH of the scale set's capacity.
func (e *testEnv) scaleTo(ctx context.Context, name string, n int64, ifMatch *string) (*runtime.Poller[armcompute.VirtualMachineScaleSetsClientUpdateResponse], error) {
	return e.sets.BeginUpdate(ctx, testRG, name, armcompute.VirtualMachineScaleSetUpdate{
		SKU: &armcompute.SKU{Capacity: &n},
	}, &armcompute.VirtualMachineScaleSetsClientBeginUpdateOptions{IfMatch: ifMatch})
}

// pollOpts makes PollUntilDone poll often (it is only used for operations
// that are already due, so it polls once or twice).
func pollOpts() *runtime.PollUntilDoneOptions {
	return &runtime.PollUntilDoneOptions{Frequency: 5 * time.Millisecond}
}

// recordingHook records hook calls and can fail chosen ones.
type recordingHook struct {
	mu       sync.Mutex
	running  []string // provider IDs, one per successful VMRunning
	deleted  []string // provider IDs, one per successful VMDeleted
	attempts map[string]int
	failNext map[string]int // provider ID -> how many more calls to fail
}

func newRecordingHook() *recordingHook {
	return &recordingHook{attempts: map[string]int{}, failNext: map[string]int{}}
}

func (h *recordingHook) call(list *[]string, vm VM) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attempts[vm.ProviderID]++
	if h.failNext[vm.ProviderID] > 0 {
		h.failNext[vm.ProviderID]--
		return errors.New("injected hook failure")
	}
	*list = append(*list, vm.ProviderID)
	return nil
}

func (h *recordingHook) VMRunning(_ context.Context, vm VM) error { return h.call(&h.running, vm) }
func (h *recordingHook) VMDeleted(_ context.Context, vm VM) error { return h.call(&h.deleted, vm) }

func (h *recordingHook) snapshot() (running, deleted []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.running...), append([]string(nil), h.deleted...)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// wantError fails the test unless err is nil when want is empty, or an
// error containing want otherwise.
func wantError(t *testing.T, call string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("%s: %v", call, err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("%s error = %v, want it to contain %q", call, err, want)
	}
}
