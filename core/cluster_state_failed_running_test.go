package core

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
)

// A VM that turns Failed while it runs (a failed extension) keeps its node
// and is told of once: a FailedVMRunning event on its node, the
// failed_running_instances gauge by code, the failed_running node state;
// it is never deleted for it. Repaired, it is told of as recovered.
func TestFailedButRunningVMIsToldOfAndKept(t *testing.T) {
	e := newEnv(t)
	cpu := e.provider.AddGroup("cpu", 1, 10, cpuTemplate("cpu"), inmemory.WithTarget(2))
	e.start()
	e.register(cpu)
	id := cpu.ProviderIDs()[0]
	ext := &cloudprovider.InstanceError{Class: cloudprovider.ClassOther, Code: "VMExtensionProvisioningError", Message: "extension 'gpu-driver' failed"}
	if !cpu.SetInstanceFailure(id, true, ext) {
		t.Fatalf("no instance %s", id)
	}
	e.run()
	evs := e.events(EventFailedVMRunning)
	if len(evs) != 1 || !strings.Contains(evs[0], "VMExtensionProvisioningError") || !strings.Contains(evs[0], "never deleted") {
		t.Fatalf("events %v, want one FailedVMRunning naming the code", evs)
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedRunning.WithLabelValues("cpu", ext.Code)); got != 1 {
		t.Errorf("failed_running_instances = %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.Nodes.WithLabelValues("cpu", "failed_running")); got != 1 {
		t.Errorf("nodes{state=failed_running} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.Nodes.WithLabelValues("cpu", "in_error")); got != 0 {
		t.Errorf("nodes{state=in_error} = %v, want 0", got)
	}
	for range 3 {
		e.clock.Step(e.opts.ScanInterval)
		e.run()
	}
	if evs := e.events(EventFailedVMRunning); len(evs) != 0 {
		t.Fatalf("told of again: %v", evs)
	}
	if d := cpu.Deleted(); len(d) != 0 {
		t.Fatalf("deleted %v: a running VM deleted for a failed extension", d)
	}
	cpu.SetInstanceFailure(id, true, nil)
	e.run()
	if evs := e.events(EventFailedVMRecovered); len(evs) != 1 || !strings.Contains(evs[0], ext.Code) {
		t.Fatalf("events %v, want one FailedVMRecovered naming the code it had", evs)
	}
	if n := testutil.CollectAndCount(e.a.metrics.FailedRunning); n != 0 {
		t.Errorf("failed_running_instances has %d series after the repair, want none", n)
	}
}
