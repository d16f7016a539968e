// Package simtest builds the scheduler-framework simulator for tests.
package simtest

import (
	"context"
	"testing"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// New returns a simulator whose plugins read listers from an empty, synced
// informer factory (the simulation itself reads only the snapshot). It is
// closed when the test ends.
func New(t testing.TB) *simulator.Simulator {
	t.Helper()
	ctx := context.Background()
	factory := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	s, err := simulator.New(ctx, factory, testobjects.GPU)
	if err != nil {
		t.Fatalf("building the simulator: %v", err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	t.Cleanup(func() { _ = s.Close() })
	return s
}
