package core

import (
	"context"
	"math/rand/v2"
	"reflect"
	"time"

	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// Reconfigure hands the loop new options (a live reload of the flags
// ConfigMap). They are validated now and take effect at the start of the
// next loop; an invalid set changes nothing. State is kept across: unneeded
// times, backoffs, the token bucket's fill, drains in flight.
func (a *Autoscaler) Reconfigure(o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if _, err := scaleup.NewChain(o.Expanders, o.GPUResourceName, a.priorities, nil); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending = &o
	return nil
}

// Options returns the options in force.
func (a *Autoscaler) Options() Options {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending != nil {
		return *a.pending
	}
	return a.opts
}

// applyPending installs options handed to Reconfigure, between loops.
func (a *Autoscaler) applyPending(ctx context.Context) {
	a.mu.Lock()
	o := a.pending
	a.pending = nil
	old := a.opts
	if o != nil {
		a.opts = *o // the loop reads a.opts without the lock: it is the only writer
	}
	a.mu.Unlock()
	if o == nil {
		return
	}
	a.registry.SetOptions(o.registryOptions())
	a.scaleDown.setOptions(*o)
	a.replace.brake.SetOptions(o.replacementBrakeOptions())
	a.events.max, a.events.interval = o.MaxPodEventsPerLoop, o.PodEventInterval
	if !reflect.DeepEqual(old.Expanders, o.Expanders) {
		chain, err := scaleup.NewChain(o.Expanders, o.GPUResourceName, a.priorities, rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2)))
		if err == nil { // validated by Reconfigure
			a.planner.Expander = chain
		}
	}
	a.nodeAdd.reconfigure(ctx, *o)
	klog.FromContext(ctx).Info("New options in force", "scanInterval", o.ScanInterval, "nodeAdditionRate", o.NodeAdditionRate,
		"nodeAdditionBurst", o.NodeAdditionBurst, "maxNodesInFlight", o.MaxNodesInFlight, "nodeGroupWriteInterval", o.NodeGroupWriteInterval, "expander", o.Expanders)
}

// reconfigure moves the queue to new bounds, keeping the bucket's fill. In
// adaptive mode the rate the controller reached is kept unless the
// configured rate or the adaptive bounds changed, which restart it at the
// configured rate.
func (na *nodeAddition) reconfigure(ctx context.Context, o Options) {
	na.enabled = o.NodeAdditionSmoothing
	na.gap = o.NodeGroupWriteInterval
	q := o.queueOptions()
	keep := na.adaptive != nil && o.NodeAdditionAdaptive && o.NodeAdditionAdaptiveOptions == na.adaptiveOpts && o.NodeAdditionRate == na.baseRate
	if keep {
		q.NodesPerMinute, _ = na.adaptive.Rate()
	}
	if err := na.queue.SetOptions(q); err != nil {
		klog.FromContext(ctx).Error(err, "Node-addition queue options refused")
		return
	}
	na.baseRate = o.NodeAdditionRate
	switch {
	case !o.NodeAdditionAdaptive:
		na.adaptive, na.reason = nil, ratelimit.ReasonConfigured
	case !keep:
		ad, err := ratelimit.NewAdaptive(o.NodeAdditionRate, o.NodeAdditionAdaptiveOptions)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Adaptive node-addition options refused")
			return
		}
		na.adaptive, na.adaptiveOpts, na.reason = ad, o.NodeAdditionAdaptiveOptions, ratelimit.ReasonConfigured
	}
}
