package actuation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// pods is a PodReader over two views: what the informer has seen, and
// what the API server holds (a pod bound a moment ago is only there).
type pods struct {
	cached, fresh []*apiv1.Pod
	err           error
	freshReads    int
}

func (p *pods) Cached(string) []*apiv1.Pod { return p.cached }
func (p *pods) Fresh(context.Context, string) ([]*apiv1.Pod, error) {
	p.freshReads++
	return p.fresh, p.err
}

func TestRemoveBatchesPerGroup(t *testing.T) {
	p := inmemory.New()
	a := p.AddGroup("a", 0, 10, to.Node("a", "4", "8Gi"), inmemory.WithTarget(3))
	b := p.AddGroup("b", 0, 10, to.Node("b", "4", "8Gi"), inmemory.WithTarget(2))
	b.SetDeleteError(errors.New("ARM said no"))
	groups := GroupsByID(p.NodeGroups())
	machines := []Machine{
		{Group: "b", ProviderID: b.ProviderIDs()[0]},
		{Group: "a", ProviderID: a.ProviderIDs()[0]},
		{Group: "gone", ProviderID: "inmemory://gone/0"},
		{Group: "a", ProviderID: a.ProviderIDs()[1]},
	}
	r := NewRemover(&pods{}, nil, clocktesting.NewFakeClock(time.Now()))
	var got []string
	for _, o := range r.Remove(context.Background(), groups, machines) {
		got = append(got, fmt.Sprintf("%s:%v:%v", o.Group, o.Deleted, o.Err != nil))
		if o.Err != nil && !strings.Contains(o.Err.Error(), "node group "+o.Group) {
			t.Errorf("error %q does not name node group %s", o.Err, o.Group)
		}
	}
	if got, want := strings.Join(got, ","), "b:false:true,a:true:false,gone:false:true,a:true:false"; got != want {
		t.Fatalf("outcomes %s, want %s (in the order given)", got, want)
	}
	if got := a.Deleted(); len(got) != 2 {
		t.Fatalf("group a deleted %v, want 2 machines in one call", got)
	}
	if got := b.Deleted(); len(got) != 0 {
		t.Fatalf("group b deleted %v despite the error", got)
	}
}

// TestRemoveLooksAgain: a machine whose Node exists is deleted only when
// nothing left on it would die with it, read from the cache and then
// from the API server at the moment of the deletion.
func TestRemoveLooksAgain(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	on := to.OnNode("n")
	rs := to.ControlledBy("ReplicaSet", "rs", "u1")
	ds := to.ControlledBy("DaemonSet", "ds", "u2")
	phase := func(ph apiv1.PodPhase) to.PodOption { return func(p *apiv1.Pod) { p.Status.Phase = ph } }
	deleting := func(at time.Time) to.PodOption {
		return func(p *apiv1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: at} }
	}
	mirror := func(p *apiv1.Pod) { p.Annotations = map[string]string{"kubernetes.io/config.mirror": "x"} }
	for _, tc := range []struct {
		name          string
		cached, fresh []*apiv1.Pod
		err           error
		want          string // deleted, held: <holder>, error
		freshReads    int
		events        int // EventDeletedWhileTerminating: on each overdue pod and on the node
	}{
		{name: "nothing on it", want: "deleted", freshReads: 1},
		{name: "DaemonSet, mirror and finished pods go with it",
			fresh: []*apiv1.Pod{to.Pod("d", on, ds), to.Pod("m", on, mirror), to.Pod("s", on, rs, phase(apiv1.PodSucceeded)), to.Pod("f", on, rs, phase(apiv1.PodFailed))},
			want:  "deleted", freshReads: 1},
		{name: "a pod the informer has not seen yet keeps it",
			fresh: []*apiv1.Pod{to.Pod("late", on, rs)}, want: "held: pod default/late runs on the node", freshReads: 1},
		{name: "a running pod in the cache keeps it without an API call",
			cached: []*apiv1.Pod{to.Pod("p", on, rs)}, want: "held: pod default/p runs on the node", freshReads: 0},
		{name: "a pod on another node does not count",
			fresh: []*apiv1.Pod{to.Pod("x", to.OnNode("other"), rs)}, want: "deleted", freshReads: 1},
		{name: "an evicted pod within its grace keeps it",
			fresh: []*apiv1.Pod{to.Pod("e", on, rs, deleting(now.Add(time.Second)))},
			want:  "held: pod default/e is terminating until 2026-01-01T00:00:31Z", freshReads: 1},
		{name: "an evicted pod whose grace ends this very moment keeps it for the margin",
			fresh: []*apiv1.Pod{to.Pod("e", on, rs, deleting(now))},
			want:  "held: pod default/e is terminating until 2026-01-01T00:00:30Z", freshReads: 1},
		{name: "an evicted pod whose grace ran out does not, and it is said",
			fresh: []*apiv1.Pod{to.Pod("e", on, rs, deleting(now.Add(-GraceMargin)))}, want: "deleted", freshReads: 1, events: 2},
		{name: "a finished pod past its grace is not overdue",
			fresh: []*apiv1.Pod{to.Pod("e", on, rs, phase(apiv1.PodSucceeded), deleting(now.Add(-GraceMargin)))}, want: "deleted", freshReads: 1},
		{name: "a running pod is named before a terminating one",
			fresh: []*apiv1.Pod{to.Pod("e", on, rs, deleting(now.Add(time.Minute))), to.Pod("p", on, rs)},
			want:  "held: pod default/p runs on the node", freshReads: 1},
		{name: "a pod bound to the node but not started keeps it",
			fresh: []*apiv1.Pod{to.Pod("p", on, rs, phase(apiv1.PodPending))}, want: "held: pod default/p runs on the node", freshReads: 1},
		{name: "pods that cannot be read: no deletion",
			err: errors.New("connection refused"), want: "error", freshReads: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := inmemory.New()
			g := p.AddGroup("g", 0, 10, to.Node("g", "4", "8Gi"), inmemory.WithTarget(1))
			node := to.Node("n", "4", "8Gi", to.ProviderID(g.ProviderIDs()[0]))
			reader := &pods{cached: tc.cached, fresh: tc.fresh, err: tc.err}
			rec := record.NewFakeRecorder(10)
			r := NewRemover(reader, rec, clocktesting.NewFakeClock(now))
			out := r.Remove(context.Background(), GroupsByID(p.NodeGroups()), []Machine{MachineOf("g", node)})
			if got := len(rec.Events); got != tc.events {
				t.Fatalf("%d events, want %d", got, tc.events)
			}
			// One on the pod (it names the node) and one on the node (it
			// names the pod).
			onPod, onNode := 0, 0
			for range tc.events {
				e := <-rec.Events
				switch {
				case !strings.Contains(e, EventDeletedWhileTerminating):
					t.Fatalf("event %q: want %s", e, EventDeletedWhileTerminating)
				case strings.Contains(e, "the machine of node n was sent for deletion with this pod"):
					onPod++
				case strings.Contains(e, "1 pod still terminating") && strings.Contains(e, "default/e"):
					onNode++
				default:
					t.Fatalf("event %q names neither the node (on the pod) nor the pod (on the node)", e)
				}
			}
			if tc.events > 0 && (onPod != 1 || onNode != 1) {
				t.Fatalf("%d events for the pod and %d for the node, want one each", onPod, onNode)
			}
			got := "deleted"
			switch o := out[0]; {
			case o.Held != nil:
				got = "held: " + o.Held.String()
			case o.Err != nil:
				got = "error"
			case !o.Deleted:
				got = "nothing"
			}
			if got != tc.want {
				t.Fatalf("outcome %q, want %q", got, tc.want)
			}
			if deleted := len(g.Deleted()) == 1; deleted != (tc.want == "deleted") {
				t.Fatalf("machine deleted: %v, want %v", deleted, tc.want == "deleted")
			}
			if reader.freshReads != tc.freshReads {
				t.Fatalf("%d fresh reads, want %d", reader.freshReads, tc.freshReads)
			}
		})
	}
}

// TestRemoveMachineWithoutNode: a machine that never registered is deleted
// without reading any pod.
func TestRemoveMachineWithoutNode(t *testing.T) {
	p := inmemory.New()
	g := p.AddGroup("g", 0, 10, to.Node("g", "4", "8Gi"), inmemory.WithTarget(1))
	reader := &pods{err: errors.New("must not be read")}
	out := NewRemover(reader, nil, clocktesting.NewFakeClock(time.Now())).Remove(context.Background(), GroupsByID(p.NodeGroups()),
		[]Machine{{Group: "g", ProviderID: g.ProviderIDs()[0]}})
	if !out[0].Deleted || reader.freshReads != 0 {
		t.Fatalf("outcome %+v after %d reads, want deleted without a read", out[0], reader.freshReads)
	}
}

func TestGrace(t *testing.T) {
	balloon := func(p *apiv1.Pod) bool { return p.Labels["balloon"] != "" }
	own := func(s int64) to.PodOption { return func(p *apiv1.Pod) { p.Spec.TerminationGracePeriodSeconds = &s } }
	for _, tc := range []struct {
		name string
		pod  *apiv1.Pod
		max  int
		want int64
	}{
		{"no own grace: the cap", to.Pod("p"), 600, 600},
		{"own grace below the cap", to.Pod("p", own(30)), 600, 30},
		{"own grace above the cap", to.Pod("p", own(3600)), 600, 600},
		{"a placeholder: none", to.Pod("p", own(30), to.Labels("balloon", "g")), 600, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := EvictOptions{MaxGracefulTerminationSec: tc.max, IsPlaceholder: balloon}
			if got := o.Grace(tc.pod); got != tc.want {
				t.Fatalf("grace %d, want %d", got, tc.want)
			}
		})
	}
}

// TestKubePods: the informer's index by node gives a node's pods; the
// fresh read lists them from the API server by field selector (the fake
// clientset ignores field selectors: the Remover keeps only the node's).
func TestKubePods(t *testing.T) {
	a, b := to.Pod("a", to.OnNode("n1")), to.Pod("b", to.OnNode("n2"))
	client := fake.NewClientset(a, b)
	factory := informers.NewSharedInformerFactory(client, 0)
	inf := factory.Core().V1().Pods().Informer()
	if err := AddNodeNameIndex(inf); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	k := KubePods{Client: client, Indexer: inf.GetIndexer()}
	if got := k.Cached("n1"); len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("cached pods of n1 %v, want [a]", got)
	}
	fresh, err := k.Fresh(ctx, "n1")
	if err != nil || firstHolder(fresh, "n1", time.Now()).Pod.Name != "a" {
		t.Fatalf("fresh read %v, %v: want a as n1's holder", fresh, err)
	}
	noIndex := KubePods{Client: client, Indexer: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	if got := noIndex.Cached("n1"); got != nil {
		t.Fatalf("cached pods without the index %v, want none (the fresh read decides)", got)
	}
}

// TestRemoveSaysWhetherTheDeletionWasSent: an error the provider returns
// before sending anything is certain (nothing changed); any other may
// have started a deletion.
func TestRemoveSaysWhetherTheDeletionWasSent(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		sent bool
	}{
		{"refused before sending", fmt.Errorf("below the minimum: %w", cloudprovider.ErrNotSent), false},
		{"fenced", cloudprovider.NewError(cloudprovider.ClassFenced, "", "not the leader", nil), false},
		{"a timeout", errors.New("context deadline exceeded"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := inmemory.New()
			g := p.AddGroup("g", 0, 10, to.Node("g", "4", "8Gi"), inmemory.WithTarget(1))
			g.SetDeleteError(tc.err)
			out := NewRemover(&pods{}, nil, clocktesting.NewFakeClock(time.Now())).Remove(context.Background(), GroupsByID(p.NodeGroups()),
				[]Machine{{Group: "g", ProviderID: g.ProviderIDs()[0]}})
			if out[0].Err == nil || out[0].Sent != tc.sent {
				t.Fatalf("outcome %+v, want an error with Sent %v", out[0], tc.sent)
			}
		})
	}
}
