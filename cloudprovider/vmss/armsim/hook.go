package armsim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/klog/v2"
)

// VM describes a scale set VM to a NodeHook. InstanceID is, as in
// VMState, a Uniform scale set VM's instance ID or a Flexible one's VM
// name; ProviderID is "azure://" + its ARM resource ID, of either form.
type VM struct {
	ResourceGroup, ScaleSet, InstanceID, ComputerName, ProviderID string
	SKU                                                           SKU
	Location                                                      string
	Zone                                                          string            // "" or e.g. "1"
	Tags                                                          map[string]string // the scale set's tags
	// Spot is a Spot VM: AKS labels and taints its node
	// ScaleSetPriorityLabel=spot.
	Spot bool
	// Deallocated says the VM was deallocated (a Spot VM evicted under
	// eviction policy Deallocate) when it was described, or when it
	// started deleting: nothing runs on it, so a deletion of it kills
	// nothing (its processes died with the eviction).
	Deallocated bool
}

// ScaleSetPriorityLabel is the label (and the NoSchedule taint's key) AKS
// puts on a Spot node pool's nodes, with the value ScaleSetPrioritySpot.
const (
	ScaleSetPriorityLabel = "kubernetes.azure.com/scalesetpriority"
	ScaleSetPrioritySpot  = "spot"
)

// NodeHook is told when VMs start running and when they are gone, so that a
// test environment can register and remove the matching Kubernetes nodes.
// The server calls it from Advance, never while holding its lock; a call
// that returns an error is retried at the next Advance.
type NodeHook interface {
	// VMRunning is called once a VM has booted.
	VMRunning(ctx context.Context, vm VM) error
	// VMDeleted is called once a VM that VMRunning was told about is gone.
	VMDeleted(ctx context.Context, vm VM) error
}

// DeletionWatcher is an optional interface of a NodeHook: a hook that
// implements it is told the moment an ARM request makes VMs start deleting,
// which is when, in Azure, the processes on them die (the VM is shut down at
// once; the rest of the deletion, which Options.DeleteDelay models and after
// which VMDeleted is called, is ARM's bookkeeping). A test environment uses
// it to check what was still running on the machines at that moment.
//
// The server calls VMsDeleting from the request's handler, synchronously,
// after releasing its lock and before writing the response, so the caller
// that asked for the deletion cannot observe it before the watcher has. It is
// called for the requests that changed VMs to Deleting: an instance deletion
// (POST .../delete) and a scale set update (PATCH) that lowers the capacity,
// including one answered with an error after it took effect
// (FaultCommitThenServerError). An update that lands late (FaultCommitLate)
// is reported with the request about the scale set before which it lands
// (not when it lands at Advance). A refused request changes nothing and
// calls nothing. vms are the VMs that the request newly started deleting (not
// those already deleting), in instance ID order per scale set; some may never
// have run (still Creating, or Failed to boot) and have no node. Calls for
// concurrent requests may run concurrently. Changes made by Go calls
// (SetCapacity) and by Advance are not reported. A VM reported deleting
// may come back: its deletion failed (FaultDeleteFails), or a later write
// preempted it before the VM was gone (see operations.go).
type DeletionWatcher interface {
	VMsDeleting(ctx context.Context, vms []VM)
}

// Advance applies every time-based transition due by Options.Clock (VMs
// finishing booting or deleting, Spot VMs evicted) and then calls the hook
// for VMs that started running or are gone (or deallocated by an
// eviction), retrying calls that failed before.
func (s *Server) Advance(ctx context.Context) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()

	s.mu.Lock()
	removed, deallocated := s.transition(s.clock.Now())
	if s.hook == nil {
		s.gone, s.repaired = nil, nil
		s.mu.Unlock()
		return
	}
	s.noteGone(append(removed, deallocated...))
	running, deleted := s.pendingHookCalls()
	s.mu.Unlock()

	res := s.callHook(ctx, running, deleted)
	s.mu.Lock()
	repairs := s.repaired
	s.repaired = nil
	s.mu.Unlock()
	unrepaired := s.tellRepaired(ctx, repairs)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.repaired = append(unrepaired, s.repaired...)
	s.recordHookCalls(res)
}

// hookCall is a pending call of the hook about a VM.
type hookCall struct {
	rec      *vmRecord
	vm       VM
	failures int // earlier failed calls for this VM
}

// hookCalls are the outcomes of Advance's hook calls.
type hookCalls struct {
	mu                sync.Mutex // guards ran, done and failed
	ran, done, failed []*vmRecord
}

// noteGone adds the VMs removed or deallocated to those whose VMDeleted
// call is pending. Callers hold s.mu.
func (s *Server) noteGone(vms []*vmRecord) {
	for _, vm := range vms {
		// Nodes never told about need no removal; a deallocated VM's
		// node may be on its way out already.
		if vm.notified && !slices.Contains(s.gone, vm) {
			s.gone = append(s.gone, vm)
		}
	}
}

// pendingHookCalls are the VMRunning calls due, by provider ID, and the
// VMDeleted calls due. Callers hold s.mu.
func (s *Server) pendingHookCalls() (running, deleted []hookCall) {
	for _, set := range s.sets {
		for _, rec := range set.vms {
			if rec.state == StateRunning && !rec.notified {
				running = append(running, hookCall{rec, s.hookVM(rec), rec.hookFailures})
			}
		}
	}
	slices.SortFunc(running, func(a, b hookCall) int { return strings.Compare(a.vm.ProviderID, b.vm.ProviderID) })
	for _, rec := range s.gone {
		deleted = append(deleted, hookCall{rec, s.hookVM(rec), rec.hookFailures})
	}
	return running, deleted
}

// callHook makes the hook calls, Options.HookParallelism at a time,
// without s.mu.
func (s *Server) callHook(ctx context.Context, running, deleted []hookCall) *hookCalls {
	res := &hookCalls{}
	s.eachCall(len(running), func(i int) {
		if res.invoke(ctx, running[i], "VMRunning", s.hook.VMRunning) {
			res.add(&res.ran, running[i].rec)
		}
	})
	s.eachCall(len(deleted), func(i int) {
		if res.invoke(ctx, deleted[i], "VMDeleted", s.hook.VMDeleted) {
			res.add(&res.done, deleted[i].rec)
		}
	})
	return res
}

// invoke makes one hook call and says whether it succeeded; a failure is
// recorded and logged.
func (res *hookCalls) invoke(ctx context.Context, c hookCall, name string, fn func(context.Context, VM) error) bool {
	err := fn(ctx, c.vm)
	if err == nil {
		return true
	}
	res.add(&res.failed, c.rec)
	// Log the first failure and every 50th retry (Run retries every
	// tick); the rest at higher verbosity.
	if c.failures%50 == 0 {
		klog.ErrorS(err, "Node hook failed; retrying at the next Advance", "call", name,
			"scaleSet", c.vm.ScaleSet, "instanceID", c.vm.InstanceID, "computerName", c.vm.ComputerName, "failures", c.failures+1)
	} else {
		klog.V(4).InfoS("Node hook failed again", "call", name, "computerName", c.vm.ComputerName, "failures", c.failures+1, "err", err)
	}
	return false
}

// add appends rec to one of res's lists.
func (res *hookCalls) add(list *[]*vmRecord, rec *vmRecord) {
	res.mu.Lock()
	*list = append(*list, rec)
	res.mu.Unlock()
}

// recordHookCalls records the outcomes of the hook calls on the VMs.
// Callers hold s.mu.
func (s *Server) recordHookCalls(res *hookCalls) {
	for _, rec := range res.ran {
		rec.notified = true
		rec.hookFailures = 0
	}
	for _, rec := range res.done {
		rec.notified = false // a deallocated VM's node is not removed twice
	}
	for _, rec := range res.failed {
		rec.hookFailures++
	}
	s.gone = slices.DeleteFunc(s.gone, func(rec *vmRecord) bool { return slices.Contains(res.done, rec) })
}

// eachCall runs call(0..n-1): in order, or Options.HookParallelism at a
// time, returning when all are done.
func (s *Server) eachCall(n int, call func(i int)) {
	workers := min(s.opts.HookParallelism, n)
	if workers <= 1 {
		for i := range n {
			call(i)
		}
		return
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				call(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// startedDeleting takes the VMs that the request being handled started
// deleting, described for the DeletionWatcher, and stops recording them.
// Callers hold s.mu.
func (s *Server) startedDeleting() []VM {
	recs := s.deleting
	s.recordDeleting, s.deleting = false, nil
	if len(recs) == 0 {
		return nil
	}
	slices.SortFunc(recs, func(a, b *vmRecord) int {
		if c := strings.Compare(setKey(a.set.rg, a.set.name), setKey(b.set.rg, b.set.name)); c != 0 {
			return c
		}
		return a.instanceID - b.instanceID
	})
	vms := make([]VM, 0, len(recs))
	for _, rec := range recs {
		vms = append(vms, s.hookVM(rec))
	}
	return vms
}

// hookVM describes a VM for the hook. Callers hold s.mu.
func (s *Server) hookVM(rec *vmRecord) VM {
	set := rec.set
	return VM{
		ResourceGroup: set.rg,
		ScaleSet:      set.name,
		InstanceID:    rec.instanceKey(),
		ComputerName:  rec.computerName(),
		ProviderID:    "azure://" + s.vmResourceID(rec),
		SKU:           set.sku,
		Location:      s.opts.Location,
		Zone:          rec.zone,
		Tags:          maps.Clone(set.tags),
		Spot:          set.spot,
		Deallocated:   rec.state == StateDeallocated || rec.wasDeallocated,
	}
}

// computerName is, as Azure names scale set VMs, the scale set's
// computer name prefix (its name by default) followed by the instance ID
// in base 36, zero-padded to six digits, in a Uniform scale set; the name
// drawn at creation in a Flexible one.
func (rec *vmRecord) computerName() string {
	if rec.set.flexible {
		return rec.computer
	}
	id := strconv.FormatInt(int64(rec.instanceID), 36)
	if len(id) < 6 {
		id = strings.Repeat("0", 6-len(id)) + id
	}
	return rec.set.computerPrefix + id
}

func (s *Server) scaleSetResourceID(set *scaleSet) string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s",
		s.opts.SubscriptionID, set.rg, set.name)
}

// vmResourceID is the VM's ARM resource ID: under its scale set in a
// Uniform scale set, a virtual machine of its own (no scale set in the
// path) in a Flexible one.
func (s *Server) vmResourceID(rec *vmRecord) string {
	if rec.set.flexible {
		return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachines/%s",
			s.opts.SubscriptionID, rec.set.rg, rec.name)
	}
	return s.scaleSetResourceID(rec.set) + "/virtualMachines/" + strconv.Itoa(rec.instanceID)
}
