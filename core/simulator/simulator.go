// Package simulator answers "where would the scheduler put this pod?" with
// the kube-scheduler framework's own PreFilter and Filter plugins, run
// against a snapshot.Fork instead of the scheduler's cache.
package simulator

import (
	"context"
	"fmt"
	"sync"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	schedframework "k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodevolumelimits"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/snapshot"
)

// FilterPlugins returns the scheduler plugins the simulation runs, in the
// scheduler's own order. Volume plugins are not run: the simulation does not
// model persistent volumes.
func FilterPlugins() []string {
	return []string{
		names.NodeUnschedulable,
		names.NodeName,
		names.TaintToleration,
		names.NodeAffinity,
		names.NodePorts,
		names.NodeResourcesFit,
		names.PodTopologySpread,
		names.InterPodAffinity,
	}
}

// preFilterPlugins returns the FilterPlugins that have a PreFilter step.
func preFilterPlugins() []string {
	return []string{names.NodeAffinity, names.NodePorts, names.NodeResourcesFit, names.PodTopologySpread, names.InterPodAffinity}
}

// Simulator runs the framework's plugins against a fork. It is not safe for
// concurrent use: one simulation at a time.
type Simulator struct {
	fw     schedframework.Framework
	lister *switchLister
	gpu    apiv1.ResourceName
	short  insufficientStatuses
}

// switchLister lets one framework instance read whichever fork is being
// simulated now.
type switchLister struct{ fork *snapshot.Fork }

func (l *switchLister) NodeInfos() fwk.NodeInfoLister           { return l.fork.NodeInfos() }
func (l *switchLister) StorageInfos() fwk.StorageInfoLister     { return l.fork.StorageInfos() }
func (l *switchLister) PodGroupStates() fwk.PodGroupStateLister { return l.fork.PodGroupStates() }

// initMetricsOnce guards the scheduler package's own metric globals, which
// InitMetrics reassigns without a guard of its own; it is the one piece of
// package state here, forced by that package.
var initMetricsOnce sync.Once

// New builds the framework once per process. The informer factory is used by
// plugins for listers (namespaces for affinity selectors, controllers for
// spreading defaults); start it after New so those informers run too.
func New(ctx context.Context, factory informers.SharedInformerFactory, gpu apiv1.ResourceName) (*Simulator, error) {
	// The framework's plugins record into the scheduler's metric vectors,
	// which are nil until initialised.
	initMetricsOnce.Do(schedmetrics.InitMetrics)
	cfg, err := latest.Default()
	if err != nil {
		return nil, fmt.Errorf("loading default scheduler configuration: %w", err)
	}
	profile := cfg.Profiles[0]
	enabled := func(names []string) schedconfig.PluginSet {
		var s schedconfig.PluginSet
		for _, n := range names {
			s.Enabled = append(s.Enabled, schedconfig.Plugin{Name: n})
		}
		return s
	}
	profile.Plugins = &schedconfig.Plugins{
		QueueSort: enabled([]string{names.PrioritySort}),
		PreFilter: enabled(preFilterPlugins()),
		Filter:    enabled(FilterPlugins()),
		Bind:      enabled([]string{names.DefaultBinder}),
	}
	lister := &switchLister{}
	f, err := frameworkruntime.NewFramework(ctx, plugins.NewInTreeRegistry(), &profile,
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithSnapshotSharedLister(lister),
		frameworkruntime.WithSharedDRAManager(noDRA{}),
		frameworkruntime.WithSharedCSIManager(nodevolumelimits.NewCSIManager(factory.Storage().V1().CSINodes().Lister())),
		frameworkruntime.WithParallelism(1),
		frameworkruntime.WithLogger(klog.FromContext(ctx)),
	)
	if err != nil {
		return nil, fmt.Errorf("building scheduler framework: %w", err)
	}
	return &Simulator{fw: f, lister: lister, gpu: gpu, short: newInsufficientStatuses(gpu)}, nil
}

// Close releases the framework.
func (s *Simulator) Close() error { return s.fw.Close() }

// preFilter runs PreFilter for pod on fork. A nil state with a status means
// the pod cannot be scheduled anywhere in this fork.
func (s *Simulator) preFilter(ctx context.Context, fork *snapshot.Fork, pod *apiv1.Pod) (fwk.CycleState, *fwk.PreFilterResult, *fwk.Status) {
	s.lister.fork = fork
	state := schedframework.NewCycleState()
	res, st, _ := s.fw.RunPreFilterPlugins(ctx, state, pod)
	if !st.IsSuccess() {
		return nil, nil, st
	}
	return state, res, nil
}

// CheckPod runs PreFilter and Filter for a pod on one node of the fork and
// returns nil when the pod fits, or the status that says why not.
func (s *Simulator) CheckPod(ctx context.Context, fork *snapshot.Fork, pod *apiv1.Pod, node int) *fwk.Status {
	state, res, st := s.preFilter(ctx, fork, pod)
	if st != nil {
		return st
	}
	ni := fork.NodeInfo(node)
	if !res.AllNodes() && !res.NodeNames.Has(ni.Node().Name) {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node(s) excluded by PreFilter")
	}
	if st := s.fw.RunFilterPlugins(ctx, state, pod, ni); !st.IsSuccess() {
		return st
	}
	return nil
}
