package balloon

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

const ns = DefaultNamespace

func names(cs []Change) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	slices.Sort(out)
	return out
}

// assertInSync checks that the stored Deployment of s is what the
// controller wants (server defaults aside).
func (e *env) assertInSync(o Options, s GroupSpec) {
	e.t.Helper()
	want := o.Deployment(s)
	have := e.get(want.Namespace, want.Name)
	if why := o.drift(have, want); len(why) > 0 {
		e.t.Fatalf("Deployment %s differs from the wanted one in %v", want.Name, why)
	}
}

func TestSyncCreates(t *testing.T) {
	o := DefaultOptions()
	e := newEnv(t, o)
	specs := []GroupSpec{spec("gpu-h100", 2, tolerates(toleration("openai.com/team", "rl"))), spec("gpu-a100", 1)}

	res, err := e.sync(specs...)
	if err != nil {
		t.Fatal(err)
	}
	if !res.PriorityClassCreated || res.PriorityClassProblem != "" {
		t.Errorf("PriorityClass created %v, problem %q", res.PriorityClassCreated, res.PriorityClassProblem)
	}
	if got, want := names(res.Created), []string{"vmss-autoscaler-balloon-gpu-a100", "vmss-autoscaler-balloon-gpu-h100"}; !reflect.DeepEqual(got, want) {
		t.Errorf("created %v, want %v", got, want)
	}
	if len(res.Updated)+len(res.Deleted) > 0 || res.Unchanged != 0 || !res.Changed() {
		t.Errorf("result %+v", res)
	}
	want := []string{"create priorityclasses vmss-autoscaler-balloon",
		"create deployments vmss-autoscaler-balloon-gpu-h100", "create deployments vmss-autoscaler-balloon-gpu-a100"}
	if got := e.writes(); !reflect.DeepEqual(got, want) {
		t.Errorf("writes %v, want %v", got, want)
	}
	for _, s := range specs {
		e.assertInSync(o, s)
	}
	pc, err := e.client.SchedulingV1().PriorityClasses().Get(e.ctx, o.PriorityClassName, metav1.GetOptions{})
	if err != nil || pc.Value != -100 || *pc.PreemptionPolicy != apiv1.PreemptNever {
		t.Errorf("PriorityClass %+v, %v", pc, err)
	}
}

// TestSyncIdle: a second Sync with nothing changed reads only the cache,
// although the stored objects carry the API server's defaults.
func TestSyncIdle(t *testing.T) {
	o := DefaultOptions()
	e := newEnv(t, o)
	specs := []GroupSpec{spec("gpu-h100", 2, tolerates(toleration("openai.com/team", "rl"))), spec("gpu-a100", 0)}
	if _, err := e.sync(specs...); err != nil {
		t.Fatal(err)
	}
	if d := e.get(ns, "vmss-autoscaler-balloon-gpu-a100"); d.Spec.Template.Spec.RestartPolicy == "" || d.Spec.ProgressDeadlineSeconds == nil {
		t.Fatalf("the fake did not apply the API server's defaults: %+v", d.Spec)
	}
	for i := range 3 {
		res, err := e.sync(specs...)
		if err != nil {
			t.Fatal(err)
		}
		if res.Changed() || res.Unchanged != 2 {
			t.Errorf("sync %d: result %+v, want 2 unchanged", i, res)
		}
		if w, r := e.writes(), e.reads(); len(w)+len(r) > 0 {
			t.Errorf("sync %d: API writes %v, reads %v; want none", i, w, r)
		}
	}
}

func TestSyncRepairsDrift(t *testing.T) {
	o := DefaultOptions()
	s := spec("gpu-h100", 2, tolerates(toleration("openai.com/team", "rl")))
	name := DeploymentName(s.Group)
	for _, tc := range []struct {
		name      string
		edit      func(*appsv1.Deployment)
		wantField string // in the update's reason
	}{
		{"replicas", func(d *appsv1.Deployment) { d.Spec.Replicas = new(int32(7)) }, "replicas"},
		{"replicas unset (1)", func(d *appsv1.Deployment) { d.Spec.Replicas = nil }, "replicas"},
		{"hash annotation removed", func(d *appsv1.Deployment) { delete(d.Annotations, SpecHashAnnotation) }, "spec hash"},
		{"balloon label changed", func(d *appsv1.Deployment) { d.Labels[DefaultLabel] = "other" }, "labels"},
		{"paused", func(d *appsv1.Deployment) { d.Spec.Paused = true }, "paused"},
		{"strategy", func(d *appsv1.Deployment) {
			d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType}
		}, "strategy"},
		{"image", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "busybox" }, "containers"},
		{"requests", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers[0].Resources.Requests[gpu] = resource.MustParse("4")
		}, "containers"},
		{"sidecar", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, apiv1.Container{Name: "x", Image: "busybox"})
		}, "containers"},
		{"init container", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.InitContainers = []apiv1.Container{{Name: "x", Image: "busybox"}}
		}, "initContainers"},
		{"priorityClassName", func(d *appsv1.Deployment) { d.Spec.Template.Spec.PriorityClassName = "system-node-critical" }, "priorityClassName"},
		{"template labels", func(d *appsv1.Deployment) { d.Spec.Template.Labels["extra"] = "x" }, "template labels"},
		{"tolerations", func(d *appsv1.Deployment) {
			d.Spec.Template.Spec.Tolerations = append(d.Spec.Template.Spec.Tolerations, toleration(DefaultPreflightTaintKey, ""))
		}, "tolerations"},
		{"affinity", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Affinity = nil }, "affinity"},
		{"nodeSelector", func(d *appsv1.Deployment) { d.Spec.Template.Spec.NodeSelector = map[string]string{"a": "b"} }, "nodeSelector"},
		{"grace period", func(d *appsv1.Deployment) { d.Spec.Template.Spec.TerminationGracePeriodSeconds = new(int64(30)) }, "terminationGracePeriodSeconds"},
		{"security context", func(d *appsv1.Deployment) { d.Spec.Template.Spec.SecurityContext.RunAsNonRoot = new(false) }, "securityContext"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, o)
			if _, err := e.sync(s); err != nil {
				t.Fatal(err)
			}
			e.edit(ns, name, tc.edit)

			res, err := e.sync(s)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Updated) != 1 || !strings.Contains(res.Updated[0].Reason, tc.wantField) {
				t.Fatalf("updated %+v, want one update naming %q", res.Updated, tc.wantField)
			}
			if got := e.writes(); !reflect.DeepEqual(got, []string{"update deployments " + name}) {
				t.Fatalf("writes %v, want one update", got)
			}
			e.assertInSync(o, s)

			// Repaired: the next Sync writes nothing.
			if res, err := e.sync(s); err != nil || res.Changed() || len(e.writes()) > 0 {
				t.Fatalf("after repair: %+v, %v, writes %v", res, err, e.writes())
			}
		})
	}
}

// TestSyncKeepsOthersChanges: fields others may own (extra labels and
// annotations, rollout restarts) are not drift, and an update keeps them.
func TestSyncKeepsOthersChanges(t *testing.T) {
	o := DefaultOptions()
	s := spec("g", 1)
	name := DeploymentName(s.Group)
	e := newEnv(t, o)
	if _, err := e.sync(s); err != nil {
		t.Fatal(err)
	}
	e.edit(ns, name, func(d *appsv1.Deployment) {
		d.Labels["team"] = "infra"
		d.Annotations["example.com/note"] = "hi"
		d.Spec.Template.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"}
	})
	if res, err := e.sync(s); err != nil || res.Changed() || len(e.writes()) > 0 {
		t.Fatalf("extra labels and annotations counted as drift: %+v, %v, writes %v", res, err, e.writes())
	}

	s.Replicas = 4
	res, err := e.sync(s)
	if err != nil || len(res.Updated) != 1 {
		t.Fatalf("updated %+v, %v", res.Updated, err)
	}
	if r := res.Updated[0].Reason; !strings.Contains(r, "replicas") || !strings.Contains(r, "spec hash") {
		t.Errorf("reason %q, want replicas and spec hash", r)
	}
	d := e.get(ns, name)
	if *d.Spec.Replicas != 4 || d.Labels["team"] != "infra" || d.Annotations["example.com/note"] != "hi" {
		t.Errorf("after update: replicas %d, labels %v, annotations %v", *d.Spec.Replicas, d.Labels, d.Annotations)
	}
}

func TestSyncDeletesGroupsWithoutPolicy(t *testing.T) {
	o := DefaultOptions()
	keep, gone := spec("keep", 1), spec("gone", 2)
	objs := []runtime.Object{
		balloonDeployment(o, keep),
		balloonDeployment(o, gone),
		// Not managed: someone's own Deployment with the balloon label.
		deployment("hand-made-balloon", withLabels(DefaultLabel, "gone")),
		// Managed, but not a balloon.
		deployment("other-managed", withLabels(DefaultManagedByLabel, DefaultManagedByValue)),
		// Managed balloon in another namespace.
		balloonDeployment(o, gone, inNamespace("default")),
		// Managed balloon already on its way out.
		balloonDeployment(o, spec("leaving", 1), beingDeleted()),
		// Someone else's Deployment.
		deployment("coredns"),
		priorityClass(-100, apiv1.PreemptNever),
	}
	e := newEnv(t, o, objs...)

	res, err := e.sync(keep)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted) != 1 || res.Deleted[0].Group != "gone" || res.Deleted[0].Name != DeploymentName("gone") {
		t.Fatalf("deleted %+v, want the gone group's", res.Deleted)
	}
	if got, want := e.writes(), []string{"delete deployments " + DeploymentName("gone")}; !reflect.DeepEqual(got, want) {
		t.Fatalf("writes %v, want %v", got, want)
	}
	if e.exists(ns, DeploymentName("gone")) {
		t.Errorf("%s still exists", DeploymentName("gone"))
	}
	for _, n := range []string{"hand-made-balloon", "other-managed", "coredns", DeploymentName("keep"), DeploymentName("leaving")} {
		if !e.exists(ns, n) {
			t.Errorf("%s/%s was deleted", ns, n)
		}
	}
	if !e.exists("default", DeploymentName("gone")) {
		t.Errorf("the balloon in namespace default was deleted")
	}
	if res.Unchanged != 1 || len(res.Created)+len(res.Updated) > 0 {
		t.Errorf("result %+v", res)
	}
}

// TestSyncNoPolicies: with no warm pool at all, a Sync deletes leftovers
// and does not create the PriorityClass.
func TestSyncNoPolicies(t *testing.T) {
	o := DefaultOptions()
	e := newEnv(t, o, balloonDeployment(o, spec("old", 1)))
	res, err := e.sync()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := e.writes(), []string{"delete deployments " + DeploymentName("old")}; !reflect.DeepEqual(got, want) {
		t.Fatalf("writes %v, want %v", got, want)
	}
	if res.PriorityClassCreated || len(e.reads()) > 0 {
		t.Errorf("PriorityClass looked at (%v) or created (%v) with no warm pool", e.reads(), res.PriorityClassCreated)
	}
}

func TestSyncLeavesUnmanagedNameClash(t *testing.T) {
	o := DefaultOptions()
	clash := deployment(DeploymentName("g1"), withLabels(DefaultLabel, "g1"))
	e := newEnv(t, o, clash)

	res, err := e.sync(spec("g1", 1), spec("g2", 1))
	if err == nil || !strings.Contains(err.Error(), "Deployment vmss-autoscaler-balloons/vmss-autoscaler-balloon-g1 exists without the label app.kubernetes.io/managed-by=vmss-autoscaler") {
		t.Fatalf("error %v, want one about the unmanaged Deployment", err)
	}
	if got, want := names(res.Created), []string{DeploymentName("g2")}; !reflect.DeepEqual(got, want) {
		t.Errorf("created %v, want %v (the other group goes on)", got, want)
	}
	for _, w := range e.writes() {
		if strings.HasSuffix(w, DeploymentName("g1")) {
			t.Errorf("wrote to the unmanaged Deployment: %s", w)
		}
	}
	if d := e.get(ns, DeploymentName("g1")); d.Spec.Template.Spec.Containers[0].Image != "example.com/app:1" {
		t.Errorf("unmanaged Deployment changed: %+v", d.Spec.Template.Spec.Containers)
	}
}

func TestSyncPriorityClass(t *testing.T) {
	o := DefaultOptions()
	for _, tc := range []struct {
		name        string
		existing    runtime.Object // nil: none
		wantCreated bool
		wantProblem string // in Result.PriorityClassProblem
		wantErr     string // "" for none
		wantDeploy  bool   // balloon Deployment created
	}{
		{"missing: created", nil, true, "", "", true},
		{"as wanted", priorityClass(-100, apiv1.PreemptNever), false, "", "", true},
		{"other negative value: reported, used", priorityClass(-5, apiv1.PreemptNever), false, "value is -5, want -100", "", true},
		{"preempting: reported, used", priorityClass(-100, apiv1.PreemptLowerPriority), false, "preemptionPolicy is not Never", "", true},
		{"non-negative: refused", priorityClass(0, apiv1.PreemptNever), false, "value is 0, want -100",
			"PriorityClass vmss-autoscaler-balloon has value 0: balloons need a negative priority", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.existing != nil {
				objs = append(objs, tc.existing)
			}
			e := newEnv(t, o, objs...)
			res, err := e.sync(spec("g", 1))
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if res.PriorityClassCreated != tc.wantCreated || !strings.Contains(res.PriorityClassProblem, tc.wantProblem) || (tc.wantProblem == "") != (res.PriorityClassProblem == "") {
				t.Fatalf("created %v problem %q, want %v %q", res.PriorityClassCreated, res.PriorityClassProblem, tc.wantCreated, tc.wantProblem)
			}
			if got := e.exists(ns, DeploymentName("g")); got != tc.wantDeploy {
				t.Fatalf("balloon Deployment exists: %v, want %v", got, tc.wantDeploy)
			}
			for _, w := range e.writes() {
				if strings.Contains(w, "priorityclasses") && !tc.wantCreated {
					t.Errorf("wrote the existing PriorityClass: %s", w)
				}
			}
			// Once usable, the PriorityClass is not read again while
			// nothing needs creating; the problem is still reported.
			if tc.wantDeploy {
				res, err := e.sync(spec("g", 1))
				if err != nil || len(e.reads())+len(e.writes()) > 0 {
					t.Fatalf("second sync: %v, reads %v, writes %v", err, e.reads(), e.writes())
				}
				if !strings.Contains(res.PriorityClassProblem, tc.wantProblem) {
					t.Fatalf("second sync lost the problem: %q", res.PriorityClassProblem)
				}
			}
		})
	}
}

func TestSyncKeepsGoingOnErrors(t *testing.T) {
	o := DefaultOptions()
	boom := errors.New("boom")
	e := newEnv(t, o, balloonDeployment(o, spec("upd", 1)), balloonDeployment(o, spec("del", 1)), priorityClass(-100, apiv1.PreemptNever))
	fail := func(verb, name string) {
		e.client.PrependReactor(verb, "deployments", func(a k8stesting.Action) (bool, runtime.Object, error) {
			switch a := a.(type) {
			case k8stesting.CreateActionImpl:
				if m, _ := metaOf(a.Object); m.GetName() == name {
					return true, nil, boom
				}
			case k8stesting.UpdateActionImpl:
				if m, _ := metaOf(a.Object); m.GetName() == name {
					return true, nil, boom
				}
			case k8stesting.DeleteActionImpl:
				if a.Name == name {
					return true, nil, boom
				}
			}
			return false, nil, nil
		})
	}
	fail("create", DeploymentName("new-bad"))
	fail("update", DeploymentName("upd"))
	fail("delete", DeploymentName("del"))

	res, err := e.sync(spec("new-bad", 1), spec("new-good", 1), spec("upd", 5))
	if !errors.Is(err, boom) {
		t.Fatalf("error %v does not wrap the API errors", err)
	}
	for _, want := range []string{
		"creating balloon Deployment vmss-autoscaler-balloons/vmss-autoscaler-balloon-new-bad: boom",
		"updating balloon Deployment vmss-autoscaler-balloons/vmss-autoscaler-balloon-upd: boom",
		`deleting balloon Deployment vmss-autoscaler-balloons/vmss-autoscaler-balloon-del of node group "del": boom`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if got := names(res.Created); !reflect.DeepEqual(got, []string{DeploymentName("new-good")}) {
		t.Errorf("created %v, want only new-good", got)
	}
	if len(res.Updated)+len(res.Deleted) > 0 {
		t.Errorf("result reports failed writes: %+v", res)
	}
}

func TestSyncInvalidSpecs(t *testing.T) {
	o := DefaultOptions()
	negative := spec("neg-request", 1)
	negative.Requests[apiv1.ResourceCPU] = resource.MustParse("-1")
	for _, tc := range []struct {
		name    string
		specs   []GroupSpec
		wantErr string
	}{
		{"negative replicas", []GroupSpec{spec("g", -1)}, `balloons of node group "g": negative replicas -1`},
		{"empty group", []GroupSpec{spec("", 1)}, `balloons of node group "": empty node group name`},
		{"group not a label value", []GroupSpec{spec("a b", 1)}, `balloons of node group "a b": node group name is not a valid label value`},
		{"negative request", []GroupSpec{negative}, `balloons of node group "neg-request": negative request cpu=-1`},
		{"group twice", []GroupSpec{spec("g", 1), spec("g", 2)}, `balloons of node group "g": given twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// An existing balloon of the group: an invalid spec must not
			// delete or change it.
			e := newEnv(t, o, balloonDeployment(o, spec(tc.specs[0].Group, 1)), priorityClass(-100, apiv1.PreemptNever))
			_, err := e.sync(tc.specs...)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if w := e.writes(); len(w) > 0 {
				t.Fatalf("writes %v, want none", w)
			}
		})
	}
}

// TestSyncRecreatesOnSelectorChange: the selector is immutable, so a new
// --balloon-label means delete and create.
func TestSyncRecreatesOnSelectorChange(t *testing.T) {
	old := DefaultOptions()
	o := DefaultOptions()
	o.Label = "example.com/balloon"
	s := spec("g", 1)
	e := newEnv(t, o, balloonDeployment(old, s), priorityClass(-100, apiv1.PreemptNever))

	res, err := e.sync(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Updated) != 1 || !strings.Contains(res.Updated[0].Reason, "selector") {
		t.Fatalf("updated %+v, want a recreate", res.Updated)
	}
	name := DeploymentName("g")
	if got, want := e.writes(), []string{"delete deployments " + name, "create deployments " + name}; !reflect.DeepEqual(got, want) {
		t.Fatalf("writes %v, want %v", got, want)
	}
	e.assertInSync(o, s)
}

// TestSyncAddsManagedByToOldBalloonPods: a Deployment made before balloon
// pods carried the managed-by label (which IsBalloon requires) is updated
// in place, selector kept: its new pods are balloons again.
func TestSyncAddsManagedByToOldBalloonPods(t *testing.T) {
	o := DefaultOptions()
	s := spec("g", 1)
	before := balloonDeployment(o, s, func(d *appsv1.Deployment) {
		delete(d.Spec.Template.Labels, o.ManagedByLabel)
		d.Annotations[SpecHashAnnotation] = specHash(d)
	})
	e := newEnv(t, o, before, priorityClass(-100, apiv1.PreemptNever))
	res, err := e.sync(s)
	if err != nil {
		t.Fatal(err)
	}
	name := DeploymentName("g")
	if len(res.Updated) != 1 || !strings.Contains(res.Updated[0].Reason, "template labels") {
		t.Fatalf("updated %+v, want the template labels changed", res.Updated)
	}
	if got, want := e.writes(), []string{"update deployments " + name}; !reflect.DeepEqual(got, want) {
		t.Fatalf("writes %v, want %v (in place: the selector is unchanged)", got, want)
	}
	if got := e.get(ns, name).Spec.Template.Labels[o.ManagedByLabel]; got != o.ManagedByValue {
		t.Fatalf("template label %s = %q, want %q", o.ManagedByLabel, got, o.ManagedByValue)
	}
	e.assertInSync(o, s)
}

// TestSyncWaitsForDeletion: a balloon Deployment being deleted is left
// alone until it is gone.
func TestSyncWaitsForDeletion(t *testing.T) {
	o := DefaultOptions()
	s := spec("g", 3)
	e := newEnv(t, o, balloonDeployment(o, spec("g", 1), beingDeleted()), priorityClass(-100, apiv1.PreemptNever))
	res, err := e.sync(s)
	if err != nil || res.Changed() || len(e.writes()) > 0 {
		t.Fatalf("%+v, %v, writes %v; want nothing done", res, err, e.writes())
	}
}

// TestSyncFilteredCache: the controller works as well on an informer that
// only lists managed Deployments; an unmanaged one it cannot see is still
// left alone (the API server refuses the create).
func TestSyncFilteredCache(t *testing.T) {
	o := DefaultOptions()
	managedOnly := func(opts *metav1.ListOptions) { opts.LabelSelector = o.ManagedByLabel + "=" + o.ManagedByValue }
	clash := deployment(DeploymentName("g1"), withLabels(DefaultLabel, "g1"))
	e := newEnvWith(t, o, managedOnly, clash, balloonDeployment(o, spec("gone", 1)))

	res, err := e.sync(spec("g1", 1), spec("g2", 1))
	if err == nil || !strings.Contains(err.Error(), "creating balloon Deployment vmss-autoscaler-balloons/vmss-autoscaler-balloon-g1") {
		t.Fatalf("error %v, want the refused create of g1", err)
	}
	if got := names(res.Created); !reflect.DeepEqual(got, []string{DeploymentName("g2")}) {
		t.Errorf("created %v", got)
	}
	if got := names(res.Deleted); !reflect.DeepEqual(got, []string{DeploymentName("gone")}) {
		t.Errorf("deleted %v", got)
	}
	if d := e.get(ns, DeploymentName("g1")); d.Spec.Template.Spec.Containers[0].Image != "example.com/app:1" {
		t.Errorf("unmanaged Deployment changed")
	}
	if res, err := e.sync(spec("g2", 1)); err != nil || res.Changed() || len(e.writes())+len(e.reads()) > 0 {
		t.Fatalf("second sync: %+v, %v, writes %v", res, err, e.writes())
	}
}

func TestSyncStopsWhenCancelled(t *testing.T) {
	o := DefaultOptions()
	e := newEnv(t, o, priorityClass(-100, apiv1.PreemptNever), balloonDeployment(o, spec("gone", 1)))
	e.waitForCache()
	e.client.ClearActions()
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	_, err := e.ctrl.Sync(ctx, []GroupSpec{spec("a", 1), spec("b", 1)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if w := e.writes(); len(w) > 0 {
		t.Fatalf("writes %v after cancellation", w)
	}
}
