package provreq

import (
	"errors"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func templates(pts ...*apiv1.PodTemplate) TemplateGetter {
	return func(ns, name string) (*apiv1.PodTemplate, error) {
		for _, pt := range pts {
			if pt.Namespace == ns && pt.Name == name {
				return pt, nil
			}
		}
		return nil, errors.New("not found")
	}
}

func gpuTemplate(name string) *apiv1.PodTemplate {
	q := resource.MustParse("8")
	return &apiv1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", ResourceVersion: "7"},
		Template: apiv1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "train"}},
			Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c",
				Resources: apiv1.ResourceRequirements{Limits: apiv1.ResourceList{"nvidia.com/gpu": q}}}}},
		},
	}
}

func req(class string, sets ...PodSet) *ProvisioningRequest {
	return &ProvisioningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ml", UID: "u1", CreationTimestamp: metav1.NewTime(time.Unix(100, 0))},
		Spec:       ProvisioningRequestSpec{ProvisioningClassName: class, PodSets: sets},
	}
}

func TestPodsStandForTheRequest(t *testing.T) {
	r := req(ClassBestEffortAtomic, PodSet{PodTemplateRef: Reference{Name: "a"}, Count: 2}, PodSet{PodTemplateRef: Reference{Name: "b"}, Count: 1})
	pods, err := Pods(r, templates(gpuTemplate("a"), gpuTemplate("b")))
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 3 || Count(r) != 3 {
		t.Fatalf("%d pods, Count %d, want 3", len(pods), Count(r))
	}
	uids := map[string]bool{}
	for _, p := range pods {
		if !IsBooked(p) {
			t.Fatalf("pod %s (UID %s) not recognised as a request's", p.Name, p.UID)
		}
		uids[string(p.UID)] = true
		if name, ok := Consumes(p); !ok || name != "job" || p.Annotations[ClassAnnotation] != ClassBestEffortAtomic {
			t.Fatalf("pod %s annotations %v", p.Name, p.Annotations)
		}
		if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != "u1" || ref.Kind != Kind {
			t.Fatalf("pod %s controller %v, want the request", p.Name, ref)
		}
		if got := p.Spec.Containers[0].Resources.Requests["nvidia.com/gpu"]; got.Value() != 8 {
			t.Fatalf("pod %s GPU request %v, want its limit 8", p.Name, got)
		}
		if p.Namespace != "ml" || p.Labels["app"] != "train" || !p.CreationTimestamp.Equal(&r.CreationTimestamp) {
			t.Fatalf("pod %s: namespace %s labels %v created %v", p.Name, p.Namespace, p.Labels, p.CreationTimestamp)
		}
	}
	if len(uids) != 3 {
		t.Fatalf("UIDs %v: not one per pod", uids)
	}
	if pods[0].Spec.Containers[0].Resources.Requests == nil || &pods[0].Spec.Containers[0] == &pods[2].Spec.Containers[0] {
		t.Fatal("pods of different sets share their spec")
	}
	_, err = Pods(req(ClassBestEffortAtomic, PodSet{PodTemplateRef: Reference{Name: "gone"}, Count: 1}), templates())
	if err == nil || !strings.Contains(err.Error(), "spec.podSets[0].podTemplateRef.name") || !strings.Contains(err.Error(), "ml/gone") {
		t.Fatalf("error %v, want the field and the template named", err)
	}
}

func TestRealPodsAreNotBooked(t *testing.T) {
	p := &apiv1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "0b0e2c9a-2a8e-4b55-9a57-1f6a1c8e6c10", Annotations: map[string]string{DeprecatedConsumeAnnotation: "job"}}}
	if IsBooked(p) {
		t.Fatal("a real pod taken for a request's")
	}
	if name, ok := Consumes(p); !ok || name != "job" {
		t.Fatalf("the older annotation key not read: %q %v", name, ok)
	}
}

func TestSupported(t *testing.T) {
	for _, tc := range []struct {
		class  string
		params map[string]Parameter
		want   bool
	}{
		{ClassCheckCapacity, nil, true},
		{ClassBestEffortAtomic, nil, true},
		{ClassCheckCapacity, map[string]Parameter{ProcessorInstanceParameter: "ca-2"}, false},
		{"queued-provisioning.gke.io", nil, false},
	} {
		r := req(tc.class)
		r.Spec.Parameters = tc.params
		if got := Supported(r); got != tc.want {
			t.Errorf("Supported(%s, %v) = %v, want %v", tc.class, tc.params, got, tc.want)
		}
	}
}

// A request asking for more than MaxPods pods fails at once, its message
// naming the count and the bound, without its templates read or its pods
// made.
func TestTooManyPodsFailWithoutPods(t *testing.T) {
	r := req(ClassBestEffortAtomic, PodSet{PodTemplateRef: Reference{Name: "a"}, Count: 3000}, PodSet{PodTemplateRef: Reference{Name: "a"}, Count: 2001})
	reads := 0
	get := func(ns, name string) (*apiv1.PodTemplate, error) {
		reads++
		return templates(gpuTemplate("a"))(ns, name)
	}
	if _, err := Pods(r, get); err == nil || !strings.Contains(err.Error(), "asks for 5001 pods") || !strings.Contains(err.Error(), "5000 pods per request") {
		t.Fatalf("Pods: err %v, want one naming 5001 pods and the bound 5000", err)
	}
	tr := NewTracker(DefaultOptions())
	p := tr.Plan(r.CreationTimestamp.Time.Add(time.Second), []*ProvisioningRequest{r}, func(*ProvisioningRequest) []*apiv1.Pod { return nil }, nil, get, nil)
	if len(p.ScaleUp) != 0 || len(p.Updates) != 1 {
		t.Fatalf("plan %+v, want the request failed and not scaled up for", p)
	}
	c := Find(p.Updates[0].Req, Failed)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonFailedToCreatePods ||
		!strings.Contains(c.Message, "asks for 5001 pods") || !strings.Contains(c.Message, "more than the 5000 pods") {
		t.Fatalf("conditions %+v, want Failed naming 5001 pods and the bound 5000", p.Updates[0].Req.Status.Conditions)
	}
	if reads != 0 {
		t.Fatalf("%d template reads for a request over the bound", reads)
	}
	r.Spec.PodSets[1].Count = 2000 // at the bound
	if pods, err := Pods(r, get); err != nil || len(pods) != MaxPods {
		t.Fatalf("%d pods, err %v, want %d", len(pods), err, MaxPods)
	}
}

// The pods of a set share their spec: no deep copy per pod.
func TestPodsOfASetShareTheirSpec(t *testing.T) {
	r := req(ClassCheckCapacity, PodSet{PodTemplateRef: Reference{Name: "a"}, Count: 3})
	pods, err := Pods(r, templates(gpuTemplate("a")))
	if err != nil {
		t.Fatal(err)
	}
	if &pods[0].Spec.Containers[0] != &pods[2].Spec.Containers[0] {
		t.Fatal("each pod has its own deep copy of the spec")
	}
	if pods[0].Name == pods[2].Name || pods[0].UID == pods[2].UID {
		t.Fatalf("pods share name or UID: %s %s", pods[0].UID, pods[2].UID)
	}
}

// A consumer takes the room of a pod of its own shape (its pod set's),
// not the last pod of the request.
func TestUnconsumedTakesTheConsumersOwnPodSet(t *testing.T) {
	gpu := podOf("8", "90")
	cpu := podOf("0", "1")
	r := &ProvisioningRequest{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ns", UID: "u"},
		Spec: ProvisioningRequestSpec{ProvisioningClassName: ClassCheckCapacity, PodSets: []PodSet{
			{PodTemplateRef: Reference{Name: "gpu"}, Count: 2}, {PodTemplateRef: Reference{Name: "cpu"}, Count: 3}}}}
	get := func(_, name string) (*apiv1.PodTemplate, error) {
		p := map[string]*apiv1.Pod{"gpu": gpu, "cpu": cpu}[name]
		return &apiv1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}, Template: apiv1.PodTemplateSpec{Spec: p.Spec}}, nil
	}
	pods, err := Pods(r, get)
	if err != nil {
		t.Fatal(err)
	}
	count := func(ps []*apiv1.Pod) (g, c int) {
		for _, p := range ps {
			if _, ok := p.Spec.Containers[0].Resources.Requests["nvidia.com/gpu"]; ok {
				g++
			} else {
				c++
			}
		}
		return g, c
	}
	for _, tc := range []struct {
		name       string
		consumers  []*apiv1.Pod
		gpus, cpus int
	}{
		{"none", nil, 2, 3},
		{"a GPU pod", []*apiv1.Pod{gpu}, 1, 3},
		{"a CPU pod", []*apiv1.Pod{cpu}, 2, 2},
		{"both GPU pods and a CPU pod", []*apiv1.Pod{gpu, cpu, gpu}, 0, 2},
		{"a pod of another shape takes the last", []*apiv1.Pod{podOf("0", "7")}, 2, 2},
		{"more GPU pods than asked", []*apiv1.Pod{gpu, gpu, gpu}, 0, 2},
		{"all", []*apiv1.Pod{gpu, gpu, cpu, cpu, cpu}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, c := count(Unconsumed(pods, tc.consumers))
			if g != tc.gpus || c != tc.cpus {
				t.Fatalf("left %d GPU and %d CPU pods, want %d and %d", g, c, tc.gpus, tc.cpus)
			}
		})
	}
}

// podOf is a pod requesting gpus GPUs and cpu CPUs (a consumer, as the
// API server defaulted it).
func podOf(gpus, cpu string) *apiv1.Pod {
	req := apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse(cpu)}
	if gpus != "0" {
		req["nvidia.com/gpu"] = resource.MustParse(gpus)
	}
	return &apiv1.Pod{Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Resources: apiv1.ResourceRequirements{Requests: req}}}}}
}
