package vmss

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
)

// Long-running operations as Azure runs them.
//
// A write to a scale set (a capacity PATCH, an instance deletion) is
// answered at once and goes on as an operation that is polled. A poll is
// a read like any other: ARM may answer it 429, the provider may hold it
// back during a Retry-After (errThrottled), the network may drop it, a
// front end may answer 5xx. None of that says anything about the
// operation, so a poll that fails is tried again (after the Retry-After,
// or the poll interval), never taken as the operation failing. azcore's
// Poller allows it: "If Poll fails, the poller's state is unmodified and
// the error is returned" (sdk/azcore/runtime/poller.go, v1.23.3, Poll),
// and its Azure-AsyncOperation poller (internal/pollers/async) updates
// its state only from a valid status answer, so the next Poll asks
// again.
//
// Only ARM's own terminal status decides: Succeeded, Failed or Canceled.
// A Canceled operation with error code OperationPreempted was superseded
// by a later write to the same scale set (ARM resolves the scale set to
// the newest goal state: "the older request will be pre-empted",
// cluster-autoscaler issue 3018): nothing failed. An operation followed
// for opDeadline without an answer is given up as unknown: what the next
// VM list shows decides.

// opDeadline bounds how long an operation is followed: cluster-autoscaler
// waits 30 minutes (asyncContextTimeout in
// cluster-autoscaler/cloudprovider/azure/azure_scale_set.go, the
// context of waitForCreateOrUpdateInstances and waitForDeleteInstances).
const opDeadline = 30 * time.Minute

// codePreempted is ARM's error code of an operation a later one superseded.
const codePreempted = "OperationPreempted"

// opOutcome is how an operation ended, as far as this process knows.
type opOutcome int

const (
	opSucceeded opOutcome = iota
	// opFailed: ARM reported it Failed, or Canceled for another reason
	// than a later operation.
	opFailed
	// opPreempted: Canceled with OperationPreempted.
	opPreempted
	// opUnknown: no terminal status within opDeadline, or ARM no longer
	// knows the operation.
	opUnknown
)

func (o opOutcome) String() string {
	switch o {
	case opSucceeded:
		return "succeeded"
	case opFailed:
		return "failed"
	case opPreempted:
		return "preempted"
	}
	return "unknown"
}

// opResult is an operation's end: ARM's error code and message for a
// failed or preempted one; why it is unknown for an unknown one.
type opResult struct {
	outcome       opOutcome
	code, message string
	why           string
}

// runningOp is a scale-up whose operation is watched.
type runningOp struct {
	op, target int
	sent       time.Time
}

// resourceID is the scale set's ARM resource ID, which the provider's
// throttle charges an operation's polls to (their URLs do not name it).
func (g *scaleSet) resourceID() string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s",
		g.p.cfg.SubscriptionID, g.rg, g.name)
}

// watch follows a long-running operation in the background until ARM
// reports it ended (or opDeadline passes, or Close) and then calls done,
// under no lock, with how it ended. A failure is counted in
// arm_operation_failures_total by its code after done ran (whoever sees
// it counted also sees what it left behind); a preemption is counted
// there with code OperationPreempted, and classed as nothing the core
// backs a group off for.
func watch[T any](g *scaleSet, poller *runtime.Poller[T], kind string, op int, done func(opResult)) {
	p := g.p
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		res, ok := follow(g, poller)
		if !ok {
			return // Close
		}
		logger := klog.Background().WithValues("scaleSet", g.ID(), "operation", kind, "op", op)
		switch res.outcome {
		case opSucceeded:
			logger.V(2).Info("Scale set operation succeeded")
		case opFailed:
			logger.Error(fmt.Errorf("%s: %s", res.code, res.message), "Scale set operation failed",
				"class", classOfCode(0, res.code, res.message).String())
		case opPreempted:
			logger.Info("Scale set operation superseded by a later one (OperationPreempted); not a failure", "message", res.message)
		case opUnknown:
			logger.Error(errors.New(res.why), "Gave up following a scale set operation; its outcome is unknown and the next VM list decides")
		}
		if done != nil {
			done(res)
		}
		switch res.outcome {
		case opFailed:
			p.metrics.lroFailures.WithLabelValues(g.ID(), res.code).Inc()
		case opPreempted:
			p.metrics.lroFailures.WithLabelValues(g.ID(), codePreempted).Inc()
		}
	}()
}

// follow polls the operation until it is in a terminal state, opDeadline
// passes (opUnknown) or the provider is closed (false). A poll that fails
// is tried again: after the hold of a poll held back, the Retry-After of
// a 429, the poll interval otherwise. Each poll is one request (the SDK's
// retries are off: this loop retries, on the provider's clock).
func follow[T any](g *scaleSet, poller *runtime.Poller[T]) (opResult, bool) {
	p := g.p
	clk := p.cfg.Clock
	deadline := clk.Now().Add(opDeadline)
	ctx := withResource(p.bg, g.resourceID())
	ctx = policy.WithRetryOptions(ctx, policy.RetryOptions{MaxRetries: -1})
	for {
		rctx, cancel := withTimeout(ctx)
		resp, err := poller.Poll(rctx)
		var res opResult
		terminal := err == nil && poller.Done()
		if terminal {
			res = outcomeOf(rctx, poller, resp)
		}
		cancel()
		if p.bg.Err() != nil {
			return opResult{}, false
		}
		if terminal {
			return res, true
		}
		wait := p.cfg.LROPollInterval
		if err == nil {
			if d := retryAfterOf(resp); d > 0 {
				wait = d
			}
		} else {
			d, gone := pollRetry(err, clk.Now())
			if gone {
				return opResult{outcome: opUnknown, why: "ARM no longer knows the operation: " + err.Error()}, true
			}
			if d > 0 {
				wait = d
			}
			klog.V(2).InfoS("Polling a scale set operation failed; polling again", "scaleSet", g.ID(), "in", wait, "err", err.Error())
		}
		now := clk.Now()
		if !now.Before(deadline) {
			why := fmt.Sprintf("no terminal status after %s", opDeadline)
			if err != nil {
				why += "; last poll: " + err.Error()
			}
			return opResult{outcome: opUnknown, why: why}, true
		}
		if !p.sleep(min(wait, deadline.Sub(now))) {
			return opResult{}, false
		}
	}
}

// sleep waits d on the provider's clock; false when the provider closed.
func (p *Provider) sleep(d time.Duration) bool {
	if d <= 0 {
		return p.bg.Err() == nil
	}
	t := p.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-p.bg.Done():
		return false
	}
}

// pollRetry says how long to wait before polling again after a poll
// failed (0: the poll interval), or that ARM answered it does not know
// the operation (404, 410), which no retry changes.
func pollRetry(err error, now time.Time) (time.Duration, bool) {
	var th *errThrottled
	if errors.As(err, &th) {
		return th.until.Sub(now), false
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		switch re.StatusCode {
		case http.StatusNotFound, http.StatusGone:
			return 0, true
		case http.StatusTooManyRequests:
			if re.RawResponse != nil {
				return retryAfter(re.RawResponse.Header.Get("Retry-After")), false
			}
		}
	}
	return 0, false // a 5xx, a transport error: the poll interval
}

// retryAfterOf is a poll answer's Retry-After, or 0.
func retryAfterOf(resp *http.Response) time.Duration {
	if resp == nil || resp.Header.Get("Retry-After") == "" {
		return 0
	}
	return retryAfter(resp.Header.Get("Retry-After"))
}

// operationStatus is ARM's Azure-AsyncOperation status body.
type operationStatus struct {
	Status string `json:"status"`
	Error  *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// outcomeOf reads a terminal operation's outcome from its last status
// answer; without a status in it (a Location poller's final answer),
// from the poller's Result.
func outcomeOf[T any](ctx context.Context, poller *runtime.Poller[T], resp *http.Response) opResult {
	st := operationStatusOf(resp)
	if st.Status == "" {
		return resultOutcome(ctx, poller)
	}
	return st.outcome()
}

// operationStatusOf reads an Azure-AsyncOperation status body; zero when
// there is none.
func operationStatusOf(resp *http.Response) operationStatus {
	var st operationStatus
	if resp != nil {
		if body, err := runtime.Payload(resp); err == nil && len(body) > 0 {
			_ = json.Unmarshal(body, &st)
		}
	}
	return st
}

// resultOutcome is a terminal operation's outcome as its poller's Result
// tells it.
func resultOutcome[T any](ctx context.Context, poller *runtime.Poller[T]) opResult {
	_, err := poller.Result(ctx)
	if err == nil {
		return opResult{outcome: opSucceeded}
	}
	code := "OperationFailed"
	var re *azcore.ResponseError
	if errors.As(err, &re) && re.ErrorCode != "" {
		code = re.ErrorCode
	}
	return failedOutcome(code, err.Error())
}

// outcome is the outcome a terminal status body tells.
func (st operationStatus) outcome() opResult {
	if strings.EqualFold(st.Status, "Succeeded") {
		return opResult{outcome: opSucceeded}
	}
	code, message := "OperationFailed", "operation "+st.Status
	if st.Error != nil && st.Error.Code != "" {
		code = st.Error.Code
	}
	if st.Error != nil && st.Error.Message != "" {
		message = st.Error.Message
	}
	return failedOutcome(code, message)
}

// failedOutcome is a failed operation's outcome: preempted when its code
// says so.
func failedOutcome(code, message string) opResult {
	res := opResult{outcome: opFailed, code: code, message: message}
	if strings.EqualFold(code, codePreempted) {
		res.outcome = opPreempted
	}
	return res
}

// scaleUpInProgress is the error of a scale-up refused, unsent, while
// this process's previous capacity write of the scale set still runs.
// Called with g.mu held.
func (g *scaleSet) scaleUpInProgressLocked() error {
	r := g.scaleUp
	return cloudprovider.NewError(cloudprovider.ClassThrottled, "ScaleUpInProgress",
		fmt.Sprintf("scale-up operation %d of scale set %s (to capacity %d, sent %s) is still running: one capacity write in flight per scale set; the target is sent once it ends",
			r.op, g.ID(), r.target, r.sent.UTC().Format(time.RFC3339)), cloudprovider.ErrNotSent)
}

// scaleUpEnded records the end of a scale-up's operation: a failure
// leaves placeholders for the machines it never created (update); a
// preemption (superseded by a later write) and an unknown end leave
// none: the VM list shows what there is.
func (g *scaleSet) scaleUpEnded(op, delta int, before opBase, r opResult) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.scaleUp != nil && g.scaleUp.op == op {
		g.scaleUp = nil
	}
	if r.outcome != opFailed {
		return
	}
	g.failedOps = append(g.failedOps, failedOp{op: op, delta: delta, before: before,
		err: cloudprovider.InstanceError{Class: classOfCode(0, r.code, r.message), Code: r.code, Message: r.message}})
}

// Deletions.
//
// DeleteInstances names the instances; ARM answers 400 for the whole
// batch if one is not an active instance, so only IDs the latest VM list
// shows are sent. When its operation is preempted (another write to the
// scale set superseded it) or fails with some of the batch deleted (or
// deleting) and some not, what the next VM list still shows alive is
// sent again, once, checked against the write guards of the DeleteNodes
// call that asked for it: the guards (the leader fence, the deletion
// hold) travel in that call's context as values (cloudprovider.CheckWrite),
// so they are kept, detached from its cancellation, and asked again
// right before the second request. The machines stay reported deleting
// until then, so the core does not take them back in between (its
// nodes stay tainted and drained). A deletion that failed outright
// (nothing of it deleted), or that fails again, or whose guard refuses,
// lists its machines as ARM has them: the core sees them alive and takes
// the deletion back.

// deletion is one DeleteInstances call this process made and watches.
type deletion struct {
	keys []string // provider ID keys of the machines
	// guards carries the write guards of the DeleteNodes call (its
	// values, not its cancellation).
	guards context.Context
	forced bool
	// resend: this call is the one send-again (never sent again itself).
	resend bool
	// set when its operation ended preempted or failed:
	preempted, forceRefused bool
}

// sendDelete sends one DeleteInstances of ids if the write guards in ctx
// pass, with force deletion when configured and not refused before. When
// ARM refuses the force deletion (OperationNotAllowed: isolated VM sizes,
// dedicated hosts, maintenance control), the same batch is sent again
// without force, and the scale set is not forced again; this is
// cluster-autoscaler's fallback (deleteInstances in
// cluster-autoscaler/cloudprovider/azure/azure_force_delete_scale_set.go
// falls back to a normal delete on OperationNotAllowed).
func (g *scaleSet) sendDelete(ctx context.Context, ids []string) (*runtime.Poller[armcompute.VirtualMachineScaleSetsClientDeleteInstancesResponse], bool, error) {
	if err := cloudprovider.CheckWrite(ctx); err != nil {
		return nil, false, err
	}
	g.mu.Lock()
	force := g.p.cfg.ForceDelete && !g.noForce
	g.mu.Unlock()
	poller, err := g.beginDelete(ctx, ids, force)
	if force && isForceRefused(err) {
		g.mu.Lock()
		g.noForce = true
		g.mu.Unlock()
		klog.FromContext(ctx).Info("ARM refused force deletion; deleting without force, and no longer forcing deletions in this scale set",
			"scaleSet", g.ID(), "instances", len(ids), "err", err.Error())
		if err := cloudprovider.CheckWrite(ctx); err != nil {
			return nil, false, err
		}
		force = false
		poller, err = g.beginDelete(ctx, ids, false)
	}
	return poller, force, err
}

func (g *scaleSet) beginDelete(ctx context.Context, ids []string, force bool) (*runtime.Poller[armcompute.VirtualMachineScaleSetsClientDeleteInstancesResponse], error) {
	ctx, cancel := withTimeout(ctx)
	defer cancel()
	return g.p.vmss.BeginDeleteInstances(ctx, g.rg, g.name,
		armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs{InstanceIDs: to.SliceOfPtrs(ids...)},
		&armcompute.VirtualMachineScaleSetsClientBeginDeleteInstancesOptions{ForceDeletion: to.Ptr(force)})
}

// isUnknownInstance says ARM refused a deletion batch because an ID in it
// is not an active instance: 400 InvalidParameter, target instanceIds,
// "The provided instanceId 7 is not an active Virtual Machine Scale Set
// VM instanceId." (quoted in microsoft/onefuzz issue 2547). ARM refuses
// the whole batch: nothing of it was deleted.
func isUnknownInstance(err error) bool {
	var re *azcore.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusBadRequest &&
		strings.EqualFold(re.ErrorCode, "InvalidParameter") &&
		strings.Contains(strings.ToLower(re.Error()), "is not an active virtual machine scale set vm instanceid")
}

// deleteStillListed answers ARM's refusal of a whole deletion batch for an
// ID that is no longer an active instance (refused; a VM deleted out of
// band after the latest VM list, which the batch was made from): the
// scale set's VMs are listed once more (one list, not applied to the
// cache: the next refresh does that) and the IDs of the batch that list
// still shows, and not deleting, are sent once (sendDelete: through the
// write guards of ctx, with the force fallback). It returns the IDs sent
// (none when every one is gone or going: nothing to send), the IDs the
// list no longer shows at all (gone: the caller reports them deleting
// until a refresh drops them), and the send's result. A list that fails,
// or that still shows every ID, leaves refused as the error: the core
// takes the deletion back, and its next one is made from a newer list.
// cluster-autoscaler meets the same refusal: it sends one batch per scale
// set too (DeleteInstancesAsync in
// cluster-autoscaler/cloudprovider/azure/azure_scale_set.go) and leaves
// the retry to its next loop, after its cache was refreshed.
func (g *scaleSet) deleteStillListed(ctx context.Context, ids []string, refused error) (sent, gone []string, poller *runtime.Poller[armcompute.VirtualMachineScaleSetsClientDeleteInstancesResponse], forced bool, err error) {
	g.p.vmLists.take(g.p.cfg.Clock.Now(), true) // counted in the VM-list budget (vmlist.go), in debt if need be
	vms, err := g.p.listVMs(ctx, g.rg, &armcompute.VirtualMachineScaleSet{Name: to.Ptr(g.name)}, g.flexible)
	if err != nil {
		return ids, nil, nil, false, fmt.Errorf("%w (listing its VMs again to send the rest failed: %v)", refused, err)
	}
	listed := make(map[string]bool, len(vms)) // by lower-case ID: deleting or not
	for _, vm := range vms {
		listed[strings.ToLower(lastSegment(vm.id))] = !strings.EqualFold(vm.provisioningState, "Deleting")
	}
	for _, id := range ids {
		alive, ok := listed[strings.ToLower(id)]
		switch {
		case alive:
			sent = append(sent, id)
		case !ok:
			gone = append(gone, id)
		}
	}
	klog.FromContext(ctx).Info("ARM refused a deletion batch naming an instance it no longer has; sending the instances a new VM list still shows",
		"scaleSet", g.ID(), "gone", gone, "instances", sent, "err", refused.Error())
	if len(sent) == len(ids) {
		// The list shows every one alive: the refusal is not what it
		// seemed, and sending the same batch again would not help.
		return ids, nil, nil, false, refused
	}
	if len(sent) == 0 {
		return nil, gone, nil, false, nil
	}
	poller, forced, err = g.sendDelete(ctx, sent)
	return sent, gone, poller, forced, err
}

// isForceRefused says ARM refused a force deletion: OperationNotAllowed
// (cluster-autoscaler's isOperationNotAllowed), answered as a refusal
// and not as throttling: the Compute RP's 429 carries the same code
// ("Troubleshooting API throttling errors": code OperationNotAllowed,
// details[].code TooManyRequests), and a throttled force deletion says
// nothing about whether the scale set takes one.
func isForceRefused(err error) bool {
	var re *azcore.ResponseError
	return errors.As(err, &re) && re.StatusCode != http.StatusTooManyRequests &&
		strings.EqualFold(re.ErrorCode, "OperationNotAllowed")
}

// markDeletingLocked marks the instances whose instance ID (or Flexible
// VM name) is in ids deleting and returns their keys. Called with g.mu
// held.
func (g *scaleSet) markDeletingLocked(ids []string) []string {
	if g.deleting == nil {
		g.deleting = map[string]bool{}
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[strings.ToLower(id)] = true
	}
	var marked []string
	for i, in := range g.instances {
		if want[strings.ToLower(lastSegment(in.ProviderID))] && !isPlaceholder(in.ProviderID) {
			key := cloudprovider.ProviderIDKey(in.ProviderID)
			marked = append(marked, key)
			if !g.deleting[key] && g.view.capacity > 0 {
				g.view.capacity-- // ARM lowers the capacity with each deleted instance
			}
			g.deleting[key] = true
			g.instances[i].State = cloudprovider.InstanceDeleting
			g.instances[i].Error = nil
		}
	}
	return marked
}

func (g *scaleSet) unmark(keys []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range keys {
		delete(g.deleting, k) // the next VM list shows them as ARM has them
	}
}

// deleteEnded records the end of a deletion's operation.
func (g *scaleSet) deleteEnded(d *deletion, r opResult) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case r.outcome == opSucceeded:
		return // listed deleting until the VM list no longer shows them
	case r.outcome == opUnknown || d.resend:
		for _, k := range d.keys {
			delete(g.deleting, k)
		}
		return
	}
	d.preempted = r.outcome == opPreempted
	d.forceRefused = d.forced && strings.EqualFold(r.code, "OperationNotAllowed")
	if d.forceRefused {
		g.noForce = true
	}
	// The next VM list shows them as ARM has them (not overridden), and
	// settleRedeletesLocked decides; until then they stay listed
	// deleting.
	for _, k := range d.keys {
		delete(g.deleting, k)
	}
	g.redelete = append(g.redelete, d)
}

// settleRedeletesLocked is called once per VM list, after it is applied:
// for each deletion whose operation was preempted or failed, the machines
// the list shows alive are sent again (once) when the operation was
// preempted, ARM refused only its force, or some of the batch did go; a
// deletion of which nothing went leaves them alive (the core takes it
// back). Machines the list shows ARM deleting, or no longer shows, are
// left to it. Called with g.mu held.
func (g *scaleSet) settleRedeletesLocked() {
	if len(g.redelete) == 0 {
		return
	}
	at := make(map[string]int, len(g.instances))
	for i, in := range g.instances {
		at[cloudprovider.ProviderIDKey(in.ProviderID)] = i
	}
	for _, d := range g.redelete {
		var alive []int
		progressed := false
		for _, k := range d.keys {
			i, ok := at[k]
			switch {
			case !ok, g.instances[i].State == cloudprovider.InstanceDeleting:
				progressed = true
			default:
				alive = append(alive, i)
			}
		}
		if len(alive) == 0 {
			continue
		}
		if !d.preempted && !d.forceRefused && !progressed {
			klog.InfoS("Deletion failed with none of its machines deleted; they are listed alive again", "scaleSet", g.ID(), "machines", len(alive))
			continue
		}
		ids := make([]string, len(alive))
		for j, i := range alive {
			ids[j] = lastSegment(g.instances[i].ProviderID)
		}
		keys := g.markDeletingLocked(ids)
		g.sendAgain(d.guards, keys, ids)
	}
	g.redelete = nil
}

// sendAgain sends the deletion of ids (the machines with keys) again in
// the background, once, through the guards; if it is refused, fails or
// its operation does not succeed, the machines are no longer reported
// deleting (the core takes the deletion back).
func (g *scaleSet) sendAgain(guards context.Context, keys, ids []string) {
	p := g.p
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithCancel(guards)
		defer cancel()
		defer context.AfterFunc(p.bg, cancel)()
		poller, forced, err := g.sendDelete(ctx, ids)
		if err != nil {
			klog.ErrorS(err, "Sending a preempted or partly refused deletion again failed; its machines are listed as ARM has them",
				"scaleSet", g.ID(), "instances", ids)
			g.unmark(keys)
			return
		}
		klog.InfoS("Sent a preempted or partly refused deletion again", "scaleSet", g.ID(), "instances", ids)
		g.mu.Lock()
		g.opSeq++
		op := g.opSeq
		g.mu.Unlock()
		d := &deletion{keys: keys, guards: guards, forced: forced, resend: true}
		watch(g, poller, "delete", op, func(r opResult) { g.deleteEnded(d, r) })
	}()
}

// lowerForPlaceholders lowers the capacity by the placeholders the core
// deletes (to base - n, and never below the VMs that exist: live): a
// failed scale-up leaves sku.capacity at its target though the machines
// were never made, and a capacity that counts machines that will never
// come stalls the group (cluster-autoscaler issue 8323: the failure is
// only seen at max-node-provision-time, and the capacity stays up). One
// PATCH guarded by the ETag and the write guards, like a scale-up; after
// an unclear answer or a 412, the scale set is read again: at or below
// the target, done; unchanged, the target once more; changed otherwise
// (another writer), left alone (a conflict: the core deletes the
// placeholders again later).
func (g *scaleSet) lowerForPlaceholders(ctx context.Context, n, base, live int, etag string) error {
	target := max(base-n, live)
	if target >= base {
		return nil
	}
	logger := klog.FromContext(ctx)
	poller, err := g.patchCapacity(ctx, target, etag)
	for attempt := 1; err != nil && (isAmbiguous(err) || isPreconditionFailed(err)) && attempt < maxScaleUpWrites; attempt++ {
		if cloudprovider.ClassOf(err) == cloudprovider.ClassFenced {
			break
		}
		fresh, ferr := g.reread(ctx)
		if ferr != nil {
			return fmt.Errorf("re-reading scale set %s after a failed write of capacity %d (%v): %w", g.ID(), target, err, ferr)
		}
		if fresh <= target {
			logger.Info("Scale set already at or below the capacity without the failed placeholders", "scaleSet", g.ID(), "target", target, "capacity", fresh)
			poller, err = nil, nil
			break
		}
		if fresh != base {
			return cloudprovider.NewError(cloudprovider.ClassConflict, "", fmt.Sprintf(
				"capacity of scale set %s changed from %d to %d while lowering it by %d failed placeholders; not writing it now", g.ID(), base, fresh, n), err)
		}
		g.mu.Lock()
		etag = g.etag
		g.mu.Unlock()
		poller, err = g.patchCapacity(ctx, target, etag)
	}
	if err != nil {
		if cloudprovider.ClassOf(err) == cloudprovider.ClassFenced {
			return err
		}
		werr := fmt.Errorf("lowering scale set %s to %d for %d failed placeholders: %w", g.ID(), target, n, classify(err))
		if !isAmbiguous(err) {
			// A refused write changed nothing, and nothing else was sent.
			return fmt.Errorf("%w (%w)", werr, cloudprovider.ErrNotSent)
		}
		return werr
	}
	logger.Info("Lowered the capacity by the machines a failed scale-up never created", "scaleSet", g.ID(),
		"placeholders", n, "from", base, "to", target)
	if poller == nil {
		return nil
	}
	g.mu.Lock()
	g.view.capacity = target
	g.opSeq++
	op := g.opSeq
	g.mu.Unlock()
	watch(g, poller, "decrease", op, nil)
	return nil
}
