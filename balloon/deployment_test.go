package balloon

import (
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/apps"
	appsvalidation "k8s.io/kubernetes/pkg/apis/apps/validation"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/scheduling"
	schedulingvalidation "k8s.io/kubernetes/pkg/apis/scheduling/validation"
)

func TestDeploymentName(t *testing.T) {
	long := strings.Repeat("gpu-h100-", 8) // 72 characters
	for _, tc := range []struct {
		name, group string
		want        string // exact, or a prefix when hashed
		hashed      bool
	}{
		{"plain", "gpu-h100", "vmss-autoscaler-balloon-gpu-h100", false},
		{"digits", "pool2", "vmss-autoscaler-balloon-pool2", false},
		{"longest that fits", strings.Repeat("a", 39), "vmss-autoscaler-balloon-" + strings.Repeat("a", 39), false},
		{"one too long", strings.Repeat("a", 40), "vmss-autoscaler-balloon-" + strings.Repeat("a", 28) + "-", true},
		{"long", long, "vmss-autoscaler-balloon-gpu-h100-gpu-h100-gpu-h100-g-", true},
		{"upper case", "H100Pool", "vmss-autoscaler-balloon-h100pool-", true},
		{"underscore and dot", "pool_a.b", "vmss-autoscaler-balloon-pool-a-b-", true},
		{"trailing dash trimmed", "gpu-", "vmss-autoscaler-balloon-gpu-", true},
		{"nothing usable", "___", "vmss-autoscaler-balloon-", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DeploymentName(tc.group)
			if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
				t.Fatalf("DeploymentName(%q) = %q, not a DNS label: %v", tc.group, got, errs)
			}
			if !tc.hashed && got != tc.want {
				t.Fatalf("DeploymentName(%q) = %q, want %q", tc.group, got, tc.want)
			}
			if tc.hashed {
				hash := strings.TrimPrefix(got, tc.want)
				if !strings.HasPrefix(got, tc.want) || len(hash) != 10 || strings.Contains(hash, "-") {
					t.Fatalf("DeploymentName(%q) = %q, want %q and a 10-character hash", tc.group, got, tc.want)
				}
			}
			if again := DeploymentName(tc.group); again != got {
				t.Fatalf("DeploymentName(%q) is not deterministic: %q then %q", tc.group, got, again)
			}
		})
	}
}

func TestDeploymentNameUnique(t *testing.T) {
	groups := []string{"gpu", "GPU", "Gpu", "gpu_", "gpu.", "gpu-",
		strings.Repeat("x", 50) + "1", strings.Repeat("x", 50) + "2"}
	seen := map[string]string{}
	for _, g := range groups {
		n := DeploymentName(g)
		if prev, dup := seen[n]; dup {
			t.Fatalf("groups %q and %q share the Deployment name %q", prev, g, n)
		}
		seen[n] = g
	}
}

func TestDeployment(t *testing.T) {
	o := DefaultOptions()
	s := spec("gpu-h100", 3, tolerates(toleration("openai.com/team", "rl")))
	d := o.Deployment(s)

	if d.Name != "vmss-autoscaler-balloon-gpu-h100" || d.Namespace != "vmss-autoscaler-balloons" {
		t.Errorf("name = %s/%s", d.Namespace, d.Name)
	}
	wantLabels := map[string]string{"vmss-autoscaler.io/balloon": "gpu-h100", "app.kubernetes.io/managed-by": "vmss-autoscaler"}
	if !reflect.DeepEqual(d.Labels, wantLabels) {
		t.Errorf("labels = %v, want %v", d.Labels, wantLabels)
	}
	if d.Annotations[SpecHashAnnotation] == "" {
		t.Errorf("no %s annotation", SpecHashAnnotation)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas = %v, want 3", d.Spec.Replicas)
	}
	// The selector is the balloon label alone (immutable: as made before
	// the pods carried the managed-by label, which IsBalloon requires).
	selector := map[string]string{"vmss-autoscaler.io/balloon": "gpu-h100"}
	if !reflect.DeepEqual(d.Spec.Selector.MatchLabels, selector) || len(d.Spec.Selector.MatchExpressions) > 0 {
		t.Errorf("selector = %v, want %v", d.Spec.Selector, selector)
	}
	podLabels := map[string]string{"vmss-autoscaler.io/balloon": "gpu-h100", "app.kubernetes.io/managed-by": "vmss-autoscaler"}
	if !reflect.DeepEqual(d.Spec.Template.Labels, podLabels) {
		t.Errorf("template labels = %v, want %v", d.Spec.Template.Labels, podLabels)
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy = %v, want Recreate", d.Spec.Strategy)
	}

	ps := d.Spec.Template.Spec
	if ps.PriorityClassName != "vmss-autoscaler-balloon" {
		t.Errorf("priorityClassName = %q", ps.PriorityClassName)
	}
	if ps.TerminationGracePeriodSeconds == nil || *ps.TerminationGracePeriodSeconds != 0 {
		t.Errorf("terminationGracePeriodSeconds = %v, want 0", ps.TerminationGracePeriodSeconds)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken = %v, want false", ps.AutomountServiceAccountToken)
	}
	if ps.EnableServiceLinks == nil || *ps.EnableServiceLinks {
		t.Errorf("enableServiceLinks = %v, want false", ps.EnableServiceLinks)
	}
	if sc := ps.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65535 {
		t.Errorf("pod securityContext = %+v, want non-root 65535", sc)
	}
	wantAffinity := &apiv1.Affinity{NodeAffinity: &apiv1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &apiv1.NodeSelector{
		NodeSelectorTerms: []apiv1.NodeSelectorTerm{{MatchExpressions: []apiv1.NodeSelectorRequirement{{
			Key: "vmss-autoscaler.io/node-group", Operator: apiv1.NodeSelectorOpIn, Values: []string{"gpu-h100"}}}}}}}}
	if !reflect.DeepEqual(ps.Affinity, wantAffinity) {
		t.Errorf("affinity = %+v, want %+v", ps.Affinity, wantAffinity)
	}
	if !reflect.DeepEqual(ps.Tolerations, s.Tolerations) {
		t.Errorf("tolerations = %v, want %v", ps.Tolerations, s.Tolerations)
	}
	if len(ps.InitContainers) > 0 || len(ps.Containers) != 1 {
		t.Fatalf("containers = %v, init %v; want one", ps.Containers, ps.InitContainers)
	}
	c := ps.Containers[0]
	if c.Name != "pause" || c.Image != "registry.k8s.io/pause:3.10" {
		t.Errorf("container %s image %s", c.Name, c.Image)
	}
	for name, want := range s.Requests {
		if q := c.Resources.Requests[name]; q.Cmp(want) != 0 {
			t.Errorf("request %s = %s, want %s", name, q.String(), want.String())
		}
		if q := c.Resources.Limits[name]; q.Cmp(want) != 0 {
			t.Errorf("limit %s = %s, want %s", name, q.String(), want.String())
		}
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("no container securityContext")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot, sc.RunAsUser == nil || *sc.RunAsUser != 65535:
		t.Errorf("container runs as %v (non-root %v), want non-root 65535", sc.RunAsUser, sc.RunAsNonRoot)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("readOnlyRootFilesystem = %v", sc.ReadOnlyRootFilesystem)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("allowPrivilegeEscalation = %v", sc.AllowPrivilegeEscalation)
	case sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []apiv1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities = %+v, want drop ALL", sc.Capabilities)
	}
}

func TestDeploymentConfiguredNames(t *testing.T) {
	o := DefaultOptions()
	o.Label, o.NodeGroupLabel, o.Namespace = "example.com/warm", "example.com/pool", "autoscaler"
	o.PriorityClassName, o.Image, o.ManagedByValue = "warm", "example.com/pause:9", "me"
	d := o.Deployment(spec("g", 1))
	ps := d.Spec.Template.Spec
	switch {
	case d.Namespace != "autoscaler":
		t.Errorf("namespace %q", d.Namespace)
	case d.Labels["example.com/warm"] != "g" || d.Labels[DefaultManagedByLabel] != "me" || d.Labels[DefaultLabel] != "":
		t.Errorf("labels %v", d.Labels)
	case d.Spec.Selector.MatchLabels["example.com/warm"] != "g":
		t.Errorf("selector %v", d.Spec.Selector)
	case ps.PriorityClassName != "warm" || ps.Containers[0].Image != "example.com/pause:9":
		t.Errorf("priorityClassName %q image %q", ps.PriorityClassName, ps.Containers[0].Image)
	case ps.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "example.com/pool":
		t.Errorf("affinity %+v", ps.Affinity)
	}
}

func TestDeploymentTolerations(t *testing.T) {
	team := toleration("openai.com/team", "rl")
	noExecute := apiv1.Toleration{Key: "example.com/maintenance", Operator: apiv1.TolerationOpExists, Effect: apiv1.TaintEffectNoExecute, TolerationSeconds: new(int64(30))}
	preflight := toleration("vmss-autoscaler.io/preflight", "pending")
	preflightAny := apiv1.Toleration{Key: "vmss-autoscaler.io/preflight", Operator: apiv1.TolerationOpExists}
	everything := apiv1.Toleration{Operator: apiv1.TolerationOpExists}
	custom := DefaultOptions()
	custom.PreflightTaintKey = "example.com/burn-in"
	for _, tc := range []struct {
		name string
		o    Options
		in   []apiv1.Toleration
		want []apiv1.Toleration
	}{
		{"none", DefaultOptions(), nil, nil},
		{"the group's own taints", DefaultOptions(), []apiv1.Toleration{team, noExecute}, []apiv1.Toleration{team, noExecute}},
		{"preflight dropped", DefaultOptions(), []apiv1.Toleration{preflight}, nil},
		{"preflight with Exists dropped", DefaultOptions(), []apiv1.Toleration{team, preflightAny, noExecute}, []apiv1.Toleration{team, noExecute}},
		{"match-everything dropped", DefaultOptions(), []apiv1.Toleration{everything, team}, []apiv1.Toleration{team}},
		{"configured preflight key", custom, []apiv1.Toleration{toleration("example.com/burn-in", ""), preflight}, []apiv1.Toleration{preflight}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.o.Deployment(spec("g", 1, tolerates(tc.in...))).Spec.Template.Spec.Tolerations
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("tolerations = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDeploymentCopiesItsInput(t *testing.T) {
	o := DefaultOptions()
	s := spec("g", 1, tolerates(toleration("openai.com/team", "rl")))
	d := o.Deployment(s)
	c := &d.Spec.Template.Spec.Containers[0]

	// Changing the input does not change the Deployment...
	s.Requests[apiv1.ResourceCPU] = resource.MustParse("1")
	s.Requests["example.com/new"] = resource.MustParse("1")
	s.Tolerations[0].Value = "changed"
	if q := c.Resources.Requests[apiv1.ResourceCPU]; q.String() != "94" || len(c.Resources.Requests) != 3 {
		t.Errorf("requests follow the input: %v", c.Resources.Requests)
	}
	if d.Spec.Template.Spec.Tolerations[0].Value != "rl" {
		t.Errorf("tolerations follow the input: %v", d.Spec.Template.Spec.Tolerations)
	}
	// ...and requests and limits are separate maps.
	c.Resources.Requests[apiv1.ResourceMemory] = resource.MustParse("1Gi")
	if q := c.Resources.Limits[apiv1.ResourceMemory]; q.String() != "1800Gi" {
		t.Errorf("limits alias requests: memory limit %s", q.String())
	}
	// The selector and the template do not share a map.
	d.Spec.Selector.MatchLabels["x"] = "y"
	if d.Spec.Template.Labels["x"] != "" {
		t.Errorf("selector aliases template labels")
	}
}

func TestDeploymentResources(t *testing.T) {
	in := spec("g", 1, requests(
		"cpu", "94", "memory", "1800Gi", "ephemeral-storage", "3Ti", "hugepages-2Mi", "1Gi",
		"nvidia.com/gpu", "8", "rdma/hca_shared_devices_a", "1",
		"pods", "110", "attachable-volumes-azure-disk", "64", "kubernetes.io/batch-cpu", "1"))
	got := DefaultOptions().Deployment(in).Spec.Template.Spec.Containers[0].Resources
	want := map[string]bool{"cpu": true, "memory": true, "ephemeral-storage": true, "hugepages-2Mi": true, "nvidia.com/gpu": true, "rdma/hca_shared_devices_a": true}
	if len(got.Requests) != len(want) || len(got.Limits) != len(want) {
		t.Fatalf("requests %v, limits %v; want exactly %v", got.Requests, got.Limits, want)
	}
	for n := range got.Requests {
		if !want[string(n)] {
			t.Errorf("unexpected resource %s", n)
		}
	}
}

func TestSpecHash(t *testing.T) {
	o := DefaultOptions()
	hash := func(o Options, s GroupSpec) string { return o.Deployment(s).Annotations[SpecHashAnnotation] }
	base := hash(o, spec("g", 2))
	if again := hash(o, spec("g", 2)); again != base {
		t.Fatalf("hash not stable: %s then %s", base, again)
	}
	if same := hash(o, spec("g", 2, requests("cpu", "94", "memory", "1843200Mi", "nvidia.com/gpu", "8"))); same != base {
		t.Errorf("1800Gi and 1843200Mi hash differently: %s vs %s", base, same)
	}
	image := o
	image.Image = "registry.k8s.io/pause:3.11"
	for name, h := range map[string]string{
		"replicas":   hash(o, spec("g", 3)),
		"requests":   hash(o, spec("g", 2, requests("cpu", "95", "memory", "1800Gi", "nvidia.com/gpu", "8"))),
		"toleration": hash(o, spec("g", 2, tolerates(toleration("openai.com/team", "rl")))),
		"image":      hash(image, spec("g", 2)),
	} {
		if h == base {
			t.Errorf("changing %s leaves the hash at %s", name, base)
		}
	}
}

// TestDeploymentIsValid runs the API server's defaulting and validation on
// what Deployment makes.
func TestDeploymentIsValid(t *testing.T) {
	o := DefaultOptions()
	for _, s := range []GroupSpec{
		spec("gpu-h100", 3, tolerates(toleration("openai.com/team", "rl"))),
		spec("H100Pool", 0),
		spec(strings.Repeat("a", 63), 1),
		spec("cpu", 1, requests("cpu", "15800m", "memory", "60Gi", "pods", "110")),
		spec("empty", 1, requests()),
	} {
		t.Run(s.Group, func(t *testing.T) {
			d := o.Deployment(s)
			legacyscheme.Scheme.Default(d)
			var internal apps.Deployment
			if err := legacyscheme.Scheme.Convert(d, &internal, nil); err != nil {
				t.Fatal(err)
			}
			if errs := appsvalidation.ValidateDeployment(&internal, corevalidation.PodValidationOptions{}); len(errs) > 0 {
				t.Fatalf("the API server would refuse the Deployment: %v", errs.ToAggregate())
			}
		})
	}
}

func TestPriorityClass(t *testing.T) {
	o := DefaultOptions()
	pc := o.PriorityClass()
	switch {
	case pc.Name != "vmss-autoscaler-balloon" || pc.Value != -100:
		t.Errorf("PriorityClass %s value %d", pc.Name, pc.Value)
	case pc.PreemptionPolicy == nil || *pc.PreemptionPolicy != apiv1.PreemptNever:
		t.Errorf("preemptionPolicy = %v, want Never", pc.PreemptionPolicy)
	case pc.GlobalDefault:
		t.Errorf("globalDefault = true")
	case pc.Description == "":
		t.Errorf("no description")
	case pc.Labels["app.kubernetes.io/managed-by"] != "vmss-autoscaler":
		t.Errorf("labels = %v", pc.Labels)
	}
	var internal scheduling.PriorityClass
	if err := legacyscheme.Scheme.Convert(pc, &internal, nil); err != nil {
		t.Fatal(err)
	}
	if errs := schedulingvalidation.ValidatePriorityClass(&internal); len(errs) > 0 {
		t.Fatalf("the API server would refuse the PriorityClass: %v", errs.ToAggregate())
	}
}

func TestDeploymentPinnedByAnotherLabel(t *testing.T) {
	s := spec("h100-pool-vmss", 1)
	s.NodeLabel, s.NodeLabelValue = "kubernetes.azure.com/agentpool", "h100pool"
	d := DefaultOptions().Deployment(s)
	req := d.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0]
	if req.Key != "kubernetes.azure.com/agentpool" || len(req.Values) != 1 || req.Values[0] != "h100pool" {
		t.Fatalf("affinity %+v, want kubernetes.azure.com/agentpool in [h100pool]", req)
	}
	if d.Labels[DefaultLabel] != "h100-pool-vmss" {
		t.Fatalf("labels %v: the balloon label still names the group", d.Labels)
	}
}
