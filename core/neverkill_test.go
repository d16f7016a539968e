package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/actuation"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaledown"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight"
)

// nodeName is the name register gives the node of a group's i-th machine.
func nodeName(g *inmemory.Group, i int) string {
	return strings.NewReplacer("://", "-", "/", "-").Replace(g.ProviderIDs()[i])
}

// emptyNodeDecided sets up a group of two nodes, one busy and one empty,
// and runs loops until scale-down decides to remove the empty one.
func emptyNodeDecided(t *testing.T, delay time.Duration) (*env, *fakeActions, *inmemory.Group, string) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), withOptions(func(o *Options) {
		o.ScaleDownUnneededTime = time.Minute
		o.NodeDeleteDelayAfterTaint = delay
	}))
	cpu := e.provider.AddGroup("cpu", 0, 10, cpuTemplate("cpu"), inmemory.WithTarget(2))
	e.start()
	e.register(cpu)
	e.add(to.Pod("busy", to.Requests("12", "10Gi"), to.OnNode(nodeName(cpu, 0)), to.ControlledBy("ReplicaSet", "db", "rs-db")))
	e.run()
	e.clock.Step(2 * time.Minute)
	return e, acts, cpu, nodeName(cpu, 1)
}

// TestScaleDownKeepsANodeAPodLandedOn: a pod bound to an empty node after
// the scale-down decision (the informer has not seen it; only the API
// server has) keeps its node: the removal is given up, the node untainted,
// the failure counted and told with the pod's name.
func TestScaleDownKeepsANodeAPodLandedOn(t *testing.T) {
	e, acts, cpu, empty := emptyNodeDecided(t, 0)
	e.late = append(e.late, to.Pod("late", to.Requests("1", "1Gi"), to.OnNode(empty), to.ControlledBy("ReplicaSet", "web", "rs-web")))
	e.run()
	if got := cpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v: the machine went with a pod bound to it", got)
	}
	if !slicesContain(acts.untaints(), empty+" "+scaledown.ToBeDeletedTaint) || slicesContain(acts.taintsOf(empty), scaledown.ToBeDeletedTaint) {
		t.Fatalf("taints of the kept node %v (removed: %v), want its ToBeDeleted taint taken back", acts.taintsOf(empty), acts.untaints())
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedScaleDowns.WithLabelValues("cpu", "recheck")); got != 1 {
		t.Fatalf("failed_scale_downs_total{step=recheck} = %v, want 1", got)
	}
	ev := e.events(EventScaleDownFailed)
	if len(ev) != 1 || !strings.Contains(ev[0], "pod default/late runs on the node") {
		t.Fatalf("events %q, want one naming the pod", ev)
	}
}

// TestScaleDownWaitsAfterTheTaint: with --node-delete-delay-after-taint
// the machine goes in a later loop, and a pod the informer sees in the
// meantime keeps it.
func TestScaleDownWaitsAfterTheTaint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		podLand bool
		want    int
	}{
		{"nothing lands: deleted after the delay", false, 1},
		{"a pod lands within the delay: kept", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, acts, cpu, empty := emptyNodeDecided(t, 5*time.Second)
			e.run()
			if got := cpu.Deleted(); len(got) != 0 {
				t.Fatalf("deleted %v in the loop that tainted it", got)
			}
			if got := acts.taintsOf(empty); !slicesContain(got, scaledown.ToBeDeletedTaint) {
				t.Fatalf("taints %v: the node was not tainted first", got)
			}
			if tc.podLand {
				e.add(to.Pod("landed", to.Requests("1", "1Gi"), to.OnNode(empty), to.ControlledBy("ReplicaSet", "web", "rs-web")))
			}
			e.clock.Step(4 * time.Second)
			e.run()
			if got := cpu.Deleted(); len(got) != 0 {
				t.Fatalf("deleted %v before the delay ran out", got)
			}
			e.clock.Step(2 * time.Second)
			e.run()
			if got := len(cpu.Deleted()); got != tc.want {
				t.Fatalf("%d machines deleted, want %d", got, tc.want)
			}
		})
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// failedWithWorker is a GPU group of one node a periodic preflight re-run
// failed, running a pod with the given options; evictions leave pods
// terminating for their grace period.
func failedWithWorker(t *testing.T, opts ...to.PodOption) (*env, *fakeActions, *inmemory.Group, string) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts), actOnFailuresAtOnce())
	acts.graceful = e.clock
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.register(gpu, func(n *apiv1.Node) { n.Labels[preflight.DefaultLabel] = preflight.ValueFailed })
	node := nodeName(gpu, 0)
	e.add(to.Pod("worker", append(append(wholeGPU(), to.OnNode(node)), opts...)...))
	return e, acts, gpu, node
}

func grace(s int64) to.PodOption {
	return func(p *apiv1.Pod) { p.Spec.TerminationGracePeriodSeconds = &s }
}

// TestReplacementGivesPodsTheirGrace: a node failed by a periodic preflight
// re-run while it runs a pod with a 60 s grace period: the pod is evicted
// with its 60 s, and the machine goes only once they ran out (or the pod
// is gone), never one loop after the eviction.
func TestReplacementGivesPodsTheirGrace(t *testing.T) {
	for _, tc := range []struct {
		name string
		exit bool // the pod's process exits at 20 s (the kubelet removes it)
	}{
		{"the pod takes all its grace", false},
		{"the pod exits early", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, acts, gpu, node := failedWithWorker(t, to.ControlledBy("ReplicaSet", "w", "rs-w"), grace(60))
			e.run()
			if g := acts.graces["worker"]; len(g) != 1 || g[0] != 60 {
				t.Fatalf("evictions with graces %v, want one with 60 s", g)
			}
			if !slicesContain(acts.cordoned, node) {
				t.Fatalf("cordoned %v, want the failed node", acts.cordoned)
			}
			for _, at := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 59 * time.Second} {
				e.clock.SetTime(e.clock.Now().Add(at - e.clock.Now().Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))))
				if tc.exit && at == 20*time.Second {
					obj, _, _ := e.pods.GetByKey("default/worker")
					if err := e.pods.Delete(obj); err != nil {
						t.Fatal(err)
					}
				}
				e.run()
				deleted := len(gpu.Deleted()) > 0
				if want := tc.exit && at >= 20*time.Second; deleted != want {
					t.Fatalf("at %s: machine deleted %v, want %v", at, deleted, want)
				}
			}
			if len(acts.graces["worker"]) != 1 {
				t.Fatalf("evicted %d times, want once (a terminating pod is not evicted again)", len(acts.graces["worker"]))
			}
			e.clock.Step(time.Second) // 60 s: the grace ran out, but not its margin
			e.run()
			if got := len(gpu.Deleted()); got != 0 && !tc.exit {
				t.Fatalf("%d machines deleted within the margin after the grace", got)
			}
			e.clock.Step(actuation.GraceMargin)
			e.run()
			if got := len(gpu.Deleted()); got != 1 {
				t.Fatalf("%d machines deleted once the grace ran out, want 1", got)
			}
		})
	}
}

// TestReplacementKeepsNodesItMayNotDrain: a failed node whose pod may not
// be evicted (scale-down's rules) stays cordoned: no eviction, no
// deletion, an event and a status line saying which pod.
func TestReplacementKeepsNodesItMayNotDrain(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []to.PodOption
		why  string
	}{
		{"safe-to-evict=false", []to.PodOption{to.ControlledBy("ReplicaSet", "w", "rs-w"),
			func(p *apiv1.Pod) { p.Annotations = map[string]string{scaledown.SafeToEvictAnnotation: "false"} }}, "safe-to-evict=false"},
		{"a bare pod", nil, "has no controller"},
		{"local storage", []to.PodOption{to.ControlledBy("ReplicaSet", "w", "rs-w"), func(p *apiv1.Pod) {
			p.Spec.Volumes = []apiv1.Volume{{Name: "scratch", VolumeSource: apiv1.VolumeSource{EmptyDir: &apiv1.EmptyDirVolumeSource{}}}}
		}}, "uses local storage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, acts, gpu, node := failedWithWorker(t, tc.opts...)
			for range 3 {
				e.run()
				e.clock.Step(11 * time.Minute) // past the cap, the brake's window
			}
			if len(acts.evicted) != 0 || len(gpu.Deleted()) != 0 {
				t.Fatalf("evicted %v, deleted %v: want neither", acts.evicted, gpu.Deleted())
			}
			if !slicesContain(acts.cordoned, node) {
				t.Fatalf("cordoned %v, want the failed node kept cordoned", acts.cordoned)
			}
			ev := e.events(EventReplacementBlocked)
			if len(ev) != 1 || !strings.Contains(ev[0], "pod default/worker") || !strings.Contains(ev[0], tc.why) {
				t.Fatalf("events %q, want one naming the pod and %q", ev, tc.why)
			}
			last := e.status.writes[len(e.status.writes)-1]
			if !strings.Contains(last, fmt.Sprintf("%s: pod default/worker", node)) {
				t.Fatalf("status does not name the blocked node and pod:\n%s", last)
			}
		})
	}
}

// TestFailedMachineWithANodeIsDrainedFirst: a machine in error whose Node
// exists (not running, its node NotReady) may still hold pods: they are
// evicted with their grace before the machine goes.
func TestFailedMachineWithANodeIsDrainedFirst(t *testing.T) {
	acts := &fakeActions{}
	e := newEnv(t, withScaleDown(acts))
	acts.graceful = e.clock
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.register(gpu, to.NotReady())
	node := nodeName(gpu, 0)
	e.add(to.Pod("worker", append(wholeGPU(), to.OnNode(node), to.ControlledBy("ReplicaSet", "w", "rs-w"), grace(30))...))
	gpu.SetInstanceFailure(gpu.ProviderIDs()[0], false, &cloudprovider.InstanceError{Class: cloudprovider.ClassOther, Code: "OSProvisioningTimedOut"})
	e.run()
	if g := acts.graces["worker"]; len(g) != 1 || g[0] != 30 {
		t.Fatalf("evictions with graces %v, want one with 30 s", g)
	}
	if got := gpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v in the loop that evicted its pod", got)
	}
	e.clock.Step(29 * time.Second)
	e.run()
	if got := gpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v within the pod's grace", got)
	}
	e.clock.Step(time.Second + actuation.GraceMargin)
	e.run()
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v once the grace ran out, want the failed machine", got)
	}
}

// TestFailedMachineRetriedIsChargedOnce: a failed machine without a Node
// whose deletion keeps failing (ARM throttling, say) is asked again every
// loop but counted by the replacement brake once, so it cannot spend the
// budget every other replacement needs.
func TestFailedMachineRetriedIsChargedOnce(t *testing.T) {
	e := newEnv(t)
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	gpu.SetInstanceFailure(gpu.ProviderIDs()[0], false, &cloudprovider.InstanceError{Class: cloudprovider.ClassOther, Code: "OSProvisioningTimedOut"})
	gpu.SetDeleteError(errors.New("429 Too Many Requests"))
	for range 5 {
		e.run()
		e.clock.Step(10 * time.Second)
	}
	if got := e.a.replace.brake.Recent(e.clock.Now()); got != 1 {
		t.Fatalf("the brake counted %d replacements for one machine retried 5 times, want 1", got)
	}
	gpu.SetDeleteError(nil)
	e.run()
	if got := gpu.Deleted(); len(got) != 1 {
		t.Fatalf("deleted %v once the cloud answers, want the failed machine", got)
	}
}

// TestNodeWithAnotherIDSpellingIsItsMachines: a Node whose providerID is
// spelled with other slashes and case than its machine's (both name one
// VM) is that machine's node: counted registered, never deleted as a
// machine that did not register (with the Node's pods on it).
func TestNodeWithAnotherIDSpellingIsItsMachines(t *testing.T) {
	e := newEnv(t)
	gpu := e.provider.AddGroup("gpu", 0, 20, gpuTemplate("gpu"), inmemory.WithTarget(1))
	e.start()
	e.register(gpu, func(n *apiv1.Node) {
		n.Spec.ProviderID = strings.ToUpper(strings.Replace(n.Spec.ProviderID, "://", ":///", 1))
	})
	for range 3 {
		e.run()
		e.clock.Step(10 * time.Minute) // past --max-node-provision-time
	}
	if got := gpu.Deleted(); len(got) != 0 {
		t.Fatalf("deleted %v: a registered node's machine taken for one that never registered", got)
	}
	if rd := e.a.registry.Group("gpu").Readiness; rd.Registered != 1 || rd.LongUnregistered != 0 {
		t.Fatalf("readiness %+v, want the node registered", rd)
	}
}
