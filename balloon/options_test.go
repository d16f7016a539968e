package balloon

import (
	"strings"
	"testing"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDefaultOptions(t *testing.T) {
	o := DefaultOptions()
	want := Options{
		Label:             "vmss-autoscaler.io/balloon",
		PriorityClassName: "vmss-autoscaler-balloon",
		PriorityValue:     -100,
		Image:             "registry.k8s.io/pause:3.10",
		Namespace:         "vmss-autoscaler-balloons",
		NodeGroupLabel:    "vmss-autoscaler.io/node-group",
		ManagedByLabel:    "app.kubernetes.io/managed-by",
		ManagedByValue:    "vmss-autoscaler",
		PreflightTaintKey: "vmss-autoscaler.io/preflight",
		MaxReplicas:       100,
	}
	if o != want {
		t.Fatalf("DefaultOptions() = %+v, want %+v", o, want)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("DefaultOptions().Validate() = %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*Options)
		wantErr string // "" for valid
	}{
		{"defaults", func(*Options) {}, ""},
		{"configured names", func(o *Options) {
			o.Label, o.PriorityClassName, o.Namespace, o.Image = "example.com/warm", "warm", "autoscaler", "example.com/pause:1"
		}, ""},
		{"zero priority", func(o *Options) { o.PriorityValue = 0 }, "--balloon-priority-value: must be negative"},
		{"positive priority", func(o *Options) { o.PriorityValue = 1000 }, "--balloon-priority-value: must be negative"},
		{"empty image", func(o *Options) { o.Image = " " }, "--balloon-image: must not be empty"},
		{"empty namespace", func(o *Options) { o.Namespace = "" }, "--balloon-namespace: \"\" is not a namespace name"},
		{"bad namespace", func(o *Options) { o.Namespace = "Kube_System" }, "--balloon-namespace: \"Kube_System\""},
		{"empty label", func(o *Options) { o.Label = "" }, "--balloon-label: \"\" is not a label key"},
		{"bad label", func(o *Options) { o.Label = "a/b/c" }, "--balloon-label: \"a/b/c\""},
		{"label is the node-group label", func(o *Options) { o.Label = DefaultNodeGroupLabel }, "--balloon-label: \"vmss-autoscaler.io/node-group\" is also the node-group label"},
		{"label is the managed-by label", func(o *Options) { o.Label = DefaultManagedByLabel }, "--balloon-label: \"app.kubernetes.io/managed-by\" is also the managed-by label"},
		{"empty priority class", func(o *Options) { o.PriorityClassName = "" }, "--balloon-priority-class: \"\""},
		{"bad priority class", func(o *Options) { o.PriorityClassName = "Warm Pool" }, "--balloon-priority-class: \"Warm Pool\""},
		{"reserved priority class", func(o *Options) { o.PriorityClassName = "system-balloon" }, "--balloon-priority-class: \"system-balloon\": the prefix system- is reserved"},
		{"bad node-group label", func(o *Options) { o.NodeGroupLabel = "" }, "--balloon-node-group-label: \"\""},
		{"bad managed-by label", func(o *Options) { o.ManagedByLabel = "" }, "balloon managed-by label: \"\""},
		{"empty managed-by value", func(o *Options) { o.ManagedByValue = "" }, "balloon managed-by label: value \"\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tc.edit(&o)
			err := o.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestIsBalloonAndGroupOf(t *testing.T) {
	type podOption func(*apiv1.Pod)
	// pod is a balloon as the controller makes it, changed by opts.
	pod := func(opts ...podOption) *apiv1.Pod {
		p := &apiv1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: DefaultNamespace,
				Labels: map[string]string{DefaultLabel: "gpu-h100", DefaultManagedByLabel: DefaultManagedByValue}},
			Spec: apiv1.PodSpec{PriorityClassName: DefaultPriorityClassName, Priority: new(DefaultPriorityValue)},
		}
		for _, o := range opts {
			o(p)
		}
		return p
	}
	labels := func(kv ...string) podOption {
		return func(p *apiv1.Pod) {
			for i := 0; i+1 < len(kv); i += 2 {
				p.Labels[kv[i]] = kv[i+1]
			}
		}
	}
	without := func(key string) podOption { return func(p *apiv1.Pod) { delete(p.Labels, key) } }
	inNamespace := func(ns string) podOption { return func(p *apiv1.Pod) { p.Namespace = ns } }
	// tenant: a pod of another namespace dressed as a balloon, at the
	// default priority (0) that no pending pod of priority 0 preempts.
	tenant := func(p *apiv1.Pod) {
		p.Namespace, p.Spec.PriorityClassName, p.Spec.Priority = "team-a", "", new(int32(0))
	}
	custom := DefaultOptions()
	custom.Label, custom.Namespace, custom.PriorityClassName = "example.com/warm", "warm", "warm-balloons"
	customPod := func(opts ...podOption) *apiv1.Pod {
		p := pod(without(DefaultLabel), labels("example.com/warm", "g"), inNamespace("warm"),
			func(p *apiv1.Pod) { p.Spec.PriorityClassName = "warm-balloons" })
		for _, o := range opts {
			o(p)
		}
		return p
	}
	for _, tc := range []struct {
		name      string
		o         Options
		pod       *apiv1.Pod
		isBalloon bool
		group     string
	}{
		{"balloon", DefaultOptions(), pod(), true, "gpu-h100"},
		{"empty value is not a balloon", DefaultOptions(), pod(labels(DefaultLabel, "")), false, ""},
		{"no labels", DefaultOptions(), pod(func(p *apiv1.Pod) { p.Labels = nil }), false, ""},
		{"other labels", DefaultOptions(), pod(without(DefaultLabel), labels("app", "x", DefaultNodeGroupLabel, "gpu")), false, ""},
		{"nil pod", DefaultOptions(), nil, false, ""},
		{"tenant pod labelled as a balloon, priority 0, in its namespace", DefaultOptions(), pod(tenant), false, ""},
		{"tenant pod with the balloon PriorityClass, in its namespace", DefaultOptions(), pod(inNamespace("team-a")), false, ""},
		{"in kube-system", DefaultOptions(), pod(inNamespace("kube-system")), false, ""},
		{"without the PriorityClass, in the balloon namespace", DefaultOptions(),
			pod(func(p *apiv1.Pod) { p.Spec.PriorityClassName, p.Spec.Priority = "", new(int32(0)) }), false, ""},
		{"another PriorityClass", DefaultOptions(), pod(func(p *apiv1.Pod) { p.Spec.PriorityClassName = "low" }), false, ""},
		{"without the managed-by label", DefaultOptions(), pod(without(DefaultManagedByLabel)), false, ""},
		{"managed by someone else", DefaultOptions(), pod(labels(DefaultManagedByLabel, "helm")), false, ""},
		{"configured names", custom, customPod(), true, "g"},
		{"default label under a configured one", custom, customPod(without("example.com/warm"), labels(DefaultLabel, "g")), false, ""},
		{"default namespace under a configured one", custom, customPod(inNamespace(DefaultNamespace)), false, ""},
		{"default PriorityClass under a configured one", custom, customPod(func(p *apiv1.Pod) { p.Spec.PriorityClassName = DefaultPriorityClassName }), false, ""},
		{"what Deployment makes", DefaultOptions(), func() *apiv1.Pod {
			d := DefaultOptions().Deployment(spec("gpu-h100", 1))
			return &apiv1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: d.Namespace, Labels: d.Spec.Template.Labels}, Spec: d.Spec.Template.Spec}
		}(), true, "gpu-h100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.o.IsBalloon(tc.pod); got != tc.isBalloon {
				t.Errorf("IsBalloon = %v, want %v", got, tc.isBalloon)
			}
			if got := tc.o.GroupOf(tc.pod); got != tc.group {
				t.Errorf("GroupOf = %q, want %q", got, tc.group)
			}
		})
	}
}
