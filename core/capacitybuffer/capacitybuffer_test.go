package capacitybuffer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// fakeAPI serves templates and scalable objects from maps.
type fakeAPI struct {
	templates map[string]*apiv1.PodTemplate
	scalables map[string]scalable
	readErr   error
}

type scalable struct {
	t *apiv1.PodTemplateSpec
	r int32
}

func (f *fakeAPI) List() ([]*CapacityBuffer, error) { return nil, nil }
func (f *fakeAPI) PodTemplate(ns, name string) (*apiv1.PodTemplate, error) {
	if pt, ok := f.templates[ns+"/"+name]; ok {
		return pt, nil
	}
	return nil, errors.New("not found")
}
func (f *fakeAPI) Scalable(_ context.Context, ns string, ref ScalableRef) (*apiv1.PodTemplateSpec, int32, error) {
	if f.readErr != nil {
		return nil, 0, f.readErr
	}
	if ref.APIGroup+"/"+ref.Kind == "example.com/Thing" {
		return nil, 0, &UnsupportedScalableError{Ref: ref}
	}
	s, ok := f.scalables[ns+"/"+ref.Kind+"/"+ref.Name]
	if !ok {
		return nil, 0, &ScalableNotFoundError{Namespace: ns, Ref: ref}
	}
	return s.t, s.r, nil
}
func (f *fakeAPI) UpdateStatus(context.Context, *CapacityBuffer) error { return nil }
func (f *fakeAPI) Quotas(string) ([]*apiv1.ResourceQuota, error)       { return nil, nil }

func gpuTemplate(gpus, cpu string) apiv1.PodTemplateSpec {
	return apiv1.PodTemplateSpec{Spec: apiv1.PodSpec{Containers: []apiv1.Container{{Name: "c", Resources: apiv1.ResourceRequirements{
		Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse(cpu)},
		Limits:   apiv1.ResourceList{"nvidia.com/gpu": resource.MustParse(gpus)},
	}}}}}
}

func i32(v int32) *int32 { return &v }

func limits(kv ...string) *ResourceList {
	l := ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[kv[i]] = resource.MustParse(kv[i+1])
	}
	return &l
}

func TestResolve(t *testing.T) {
	api := &fakeAPI{
		templates: map[string]*apiv1.PodTemplate{"ml/gpu": {ObjectMeta: metav1.ObjectMeta{Name: "gpu", Generation: 3}, Template: gpuTemplate("8", "64")},
			"ml/tiny":  {ObjectMeta: metav1.ObjectMeta{Name: "tiny"}, Template: gpuTemplate("1", "1m")},
			"ml/milli": {ObjectMeta: metav1.ObjectMeta{Name: "milli"}, Template: gpuTemplate("1", "100m")}},
		scalables: map[string]scalable{"ml/Deployment/trainer": {t: ptr(gpuTemplate("1", "8")), r: 10}, "ml/Deployment/zero": {t: ptr(gpuTemplate("1", "8")), r: 0}},
	}
	tmpl := &LocalObjectRef{Name: "gpu"}
	dep := func(name string) *ScalableRef { return &ScalableRef{APIGroup: "apps", Kind: "Deployment", Name: name} }
	for _, tc := range []struct {
		name     string
		spec     Spec
		replicas int32
		ref      string
		reason   string // ReadyForProvisioning=False reason
		errHas   string
	}{
		{name: "template and replicas", spec: Spec{PodTemplateRef: tmpl, Replicas: i32(3)}, replicas: 3, ref: "gpu"},
		{name: "zero replicas", spec: Spec{PodTemplateRef: tmpl, Replicas: i32(0)}, replicas: 0, ref: "gpu"},
		{name: "limits alone: as many as fit", spec: Spec{PodTemplateRef: tmpl, Limits: limits("nvidia.com/gpu", "20")}, replicas: 2, ref: "gpu"},
		{name: "limits cap replicas", spec: Spec{PodTemplateRef: tmpl, Replicas: i32(5), Limits: limits("cpu", "200")}, replicas: 3, ref: "gpu"},
		{name: "limits above replicas", spec: Spec{PodTemplateRef: tmpl, Replicas: i32(2), Limits: limits("cpu", "2000")}, replicas: 2, ref: "gpu"},
		{name: "tightest limit binds", spec: Spec{PodTemplateRef: tmpl, Limits: limits("cpu", "1000", "nvidia.com/gpu", "24")}, replicas: 3, ref: "gpu"},
		{name: "percentage rounds up", spec: Spec{ScalableRef: dep("trainer"), Percentage: i32(25)}, replicas: 3},
		{name: "percentage at least 1", spec: Spec{ScalableRef: dep("trainer"), Percentage: i32(1)}, replicas: 1},
		{name: "percentage of zero replicas is still 1", spec: Spec{ScalableRef: dep("zero"), Percentage: i32(50)}, replicas: 1},
		{name: "zero percentage", spec: Spec{ScalableRef: dep("trainer"), Percentage: i32(0)}, replicas: 0},
		{name: "larger of replicas and percentage", spec: Spec{ScalableRef: dep("trainer"), Percentage: i32(20), Replicas: i32(5)}, replicas: 5},
		{name: "larger of percentage and replicas", spec: Spec{ScalableRef: dep("trainer"), Percentage: i32(50), Replicas: i32(1)}, replicas: 5},
		{name: "scalable with replicas", spec: Spec{ScalableRef: dep("trainer"), Replicas: i32(4)}, replicas: 4},
		{name: "both refs", spec: Spec{PodTemplateRef: tmpl, ScalableRef: dep("trainer"), Replicas: i32(1)}, reason: ReasonInvalidSpec, errHas: "both set"},
		{name: "no ref", spec: Spec{Replicas: i32(1)}, reason: ReasonInvalidSpec, errHas: "neither spec.podTemplateRef nor spec.scalableRef"},
		{name: "percentage without scalable", spec: Spec{PodTemplateRef: tmpl, Percentage: i32(10)}, reason: ReasonInvalidSpec, errHas: "spec.percentage (10)"},
		{name: "no count", spec: Spec{ScalableRef: dep("trainer")}, reason: ReasonInvalidSpec, errHas: "number of chunks is unknown"},
		{name: "template missing", spec: Spec{PodTemplateRef: &LocalObjectRef{Name: "nope"}, Replicas: i32(1)}, reason: ReasonPodTemplateNotFound, errHas: "PodTemplate ml/nope"},
		{name: "scalable missing", spec: Spec{ScalableRef: dep("nope"), Replicas: i32(1)}, reason: ReasonScalableRefNotFound, errHas: "Deployment ml/nope not found"},
		{name: "scalable kind unsupported", spec: Spec{ScalableRef: &ScalableRef{APIGroup: "example.com", Kind: "Thing", Name: "x"}, Replicas: i32(1)}, reason: ReasonScalableRefUnsupported, errHas: `kind "Thing"`},
		{name: "too many chunks", spec: Spec{PodTemplateRef: tmpl, Replicas: i32(MaxChunks + 1)}, reason: ReasonInvalidSpec, errHas: "5001 chunks"},
		{name: "negative replicas", spec: Spec{PodTemplateRef: tmpl, Replicas: i32(-1)}, reason: ReasonInvalidSpec, errHas: "spec.replicas: -1"},
		{name: "limits bound nothing", spec: Spec{PodTemplateRef: tmpl, Limits: limits("memory", "1Ti")}, reason: ReasonInvalidSpec, errHas: "spec.limits (memory) bounds nothing"},
		{name: "limits in thousandths are exact", spec: Spec{PodTemplateRef: &LocalObjectRef{Name: "milli"}, Limits: limits("cpu", "300m")}, replicas: 3, ref: "milli"},
		{name: "limits past int64 chunks", spec: Spec{PodTemplateRef: &LocalObjectRef{Name: "tiny"}, Limits: limits("cpu", "1E")}, reason: ReasonInvalidSpec, errHas: "more than the 5000"},
		{name: "huge limits", spec: Spec{PodTemplateRef: tmpl, Limits: limits("nvidia.com/gpu", "1E")}, reason: ReasonInvalidSpec, errHas: "more than the 5000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &CapacityBuffer{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "b"}, Spec: tc.spec}
			c, err := Resolve(context.Background(), api, b)
			if tc.reason != "" {
				var nr *NotReadyError
				if !errors.As(err, &nr) || nr.Reason != tc.reason || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("got %v (%T), want a NotReadyError %s containing %q", err, err, tc.reason, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Replicas != tc.replicas || c.TemplateRef != tc.ref {
				t.Fatalf("got %d chunks of %q, want %d of %q", c.Replicas, c.TemplateRef, tc.replicas, tc.ref)
			}
		})
	}
	t.Run("a failed read is no verdict", func(t *testing.T) {
		failing := &fakeAPI{readErr: errors.New("throttled")}
		b := &CapacityBuffer{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "b"}, Spec: Spec{ScalableRef: dep("trainer"), Replicas: i32(1)}}
		_, err := Resolve(context.Background(), failing, b)
		var nr *NotReadyError
		if err == nil || errors.As(err, &nr) {
			t.Fatalf("got %v, want a plain error (the status is kept)", err)
		}
	})
}

func ptr[T any](v T) *T { return &v }

func TestPods(t *testing.T) {
	b := &CapacityBuffer{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "warm", UID: "u1"}}
	tmpl := gpuTemplate("8", "64")
	tmpl.Spec.NodeName = "somewhere"
	pods := Pods(b, Chunks{Template: &tmpl, Replicas: 3})
	if len(pods) != 3 {
		t.Fatalf("%d pods, want 3", len(pods))
	}
	uids := map[string]bool{}
	for _, p := range pods {
		if !IsBufferPod(p) || BufferOf(p) != "u1" || p.Namespace != "ml" || p.Spec.NodeName != "" {
			t.Fatalf("pod %+v: not a buffer pod of u1 in ml, unbound", p.ObjectMeta)
		}
		if got := p.Spec.Containers[0].Resources.Requests["nvidia.com/gpu"]; got.String() != "8" {
			t.Fatalf("GPU request %s, want the limit 8", got.String())
		}
		if p.Spec.Priority == nil || *p.Spec.Priority != -2147483648 {
			t.Fatalf("priority %v, want the lowest", p.Spec.Priority)
		}
		uids[string(p.UID)] = true
	}
	if len(uids) != 3 {
		t.Fatalf("UIDs not unique: %v", uids)
	}
	if tmpl.Spec.Containers[0].Resources.Requests["nvidia.com/gpu"] != (resource.Quantity{}) {
		t.Fatal("the template was changed")
	}
	if IsBufferPod(&apiv1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "0b9f3c1e-8d1a-4c52-9d7e-1a2b3c4d5e6f"}}) {
		t.Fatal("a real pod taken for a buffer's")
	}
}

// TestCRDMatchesTypes keeps the chart's CRD and the Go types in step: every
// JSON field of Spec and Status is in the CRD's schema and the other way
// round, with the group, version, kind and the status subresource.
func TestCRDMatchesTypes(t *testing.T) {
	raw, err := os.ReadFile("../../charts/vmss-autoscaler/crds/autoscaling.x-k8s.io_capacitybuffers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Group    string
			Names    struct{ Kind, Plural string }
			Scope    string
			Versions []struct {
				Name         string
				Storage      bool
				Subresources map[string]any
				Schema       struct {
					OpenAPIV3Schema struct {
						Properties map[string]struct {
							Properties map[string]any
						}
					}
				}
			}
		}
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	s := crd.Spec
	if s.Group != Group || s.Names.Kind != Kind || s.Names.Plural != Resource || s.Scope != "Namespaced" || len(s.Versions) != 1 {
		t.Fatalf("CRD names %+v", s)
	}
	v := s.Versions[0]
	if v.Name != Version || !v.Storage || v.Subresources["status"] == nil {
		t.Fatalf("CRD version %s storage %v subresources %v", v.Name, v.Storage, v.Subresources)
	}
	for field, typ := range map[string]reflect.Type{"spec": reflect.TypeOf(Spec{}), "status": reflect.TypeOf(Status{})} {
		var want, got []string
		for i := 0; i < typ.NumField(); i++ {
			want = append(want, strings.Split(typ.Field(i).Tag.Get("json"), ",")[0])
		}
		for k := range v.Schema.OpenAPIV3Schema.Properties[field].Properties {
			got = append(got, k)
		}
		sort.Strings(want)
		sort.Strings(got)
		if !reflect.DeepEqual(want, got) {
			t.Errorf("%s: CRD fields %v, Go fields %v", field, got, want)
		}
	}
}

// TestScalableCache: reads are kept about ttl, a failed read serves the
// last good one and is not retried for ttl/2, answers (not found) are
// kept, reads have a budget, and the last good read is served at most
// maxStale.
func TestScalableCache(t *testing.T) {
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	reads := 0
	var next error
	c := &scalableCache{ttl: 30 * time.Second, now: func() time.Time { return now }, entries: map[string]scalableEntry{},
		read: func(_ context.Context, _ string, ref ScalableRef) (*apiv1.PodTemplateSpec, int32, error) {
			reads++
			if next != nil {
				return nil, 0, next
			}
			return &apiv1.PodTemplateSpec{}, 7, nil
		}}
	ref := ScalableRef{APIGroup: "apps", Kind: "Deployment", Name: "d"}
	get := func() (int32, error) {
		_, r, err := c.get(context.Background(), "ns", ref)
		return r, err
	}
	if r, err := get(); err != nil || r != 7 || reads != 1 {
		t.Fatalf("first read: %d %v (%d reads)", r, err, reads)
	}
	now = now.Add(20 * time.Second)
	if _, _ = get(); reads != 1 {
		t.Fatalf("%d reads within the ttl, want 1", reads)
	}
	now = now.Add(25 * time.Second) // past ttl + the most jitter
	next = errors.New("the server was unable to return a response in the time allotted")
	if r, err := get(); err != nil || r != 7 || reads != 2 {
		t.Fatalf("failed read: %d %v (%d reads), want the last good 7", r, err, reads)
	}
	now = now.Add(5 * time.Second)
	if r, err := get(); err != nil || r != 7 || reads != 2 {
		t.Fatalf("within the backoff: %d %v (%d reads), want no read and 7", r, err, reads)
	}
	now = now.Add(maxStale)
	if _, err := get(); err == nil || !strings.Contains(err.Error(), "unable to return a response") {
		t.Fatalf("after maxStale of failures: %v, want the read's error", err)
	}
	next = apierrors.NewNotFound(schema.GroupResource{Group: "apps", Resource: "deployments"}, "d")
	now = now.Add(time.Minute)
	var missing *ScalableNotFoundError
	if _, err := get(); !errors.As(err, &missing) {
		t.Fatalf("not found: %v", err)
	}
	n := reads
	now = now.Add(time.Second)
	if _, err := get(); !errors.As(err, &missing) || reads != n {
		t.Fatalf("not found again within the ttl: %v, %d reads, want the kept answer", err, reads-n)
	}
	// The budget: a burst of new objects, then refreshPerSecond.
	next = nil
	n = reads
	deferred := 0
	for i := 0; i < 3*refreshBurst; i++ {
		if _, _, err := c.get(context.Background(), "ns", ScalableRef{Kind: "Deployment", APIGroup: "apps", Name: fmt.Sprint("x", i)}); err != nil {
			deferred++
		}
	}
	if reads-n > refreshBurst || deferred < 2*refreshBurst-1 {
		t.Fatalf("%d reads and %d deferred for %d new objects at once, want at most %d reads", reads-n, deferred, 3*refreshBurst, refreshBurst)
	}
}

// TestResolveRefusesNamesTheAPIWouldNot (#40): a template name of 550 KB,
// one carrying an escape sequence, a kind or an API group that is no
// identifier: each is InvalidSpec, naming the field, quoting at most 64
// bytes of the value. Before, the whole name was copied twice into the
// status ConfigMap, which then grew past the API server's 1 MiB.
func TestResolveRefusesNamesTheAPIWouldNot(t *testing.T) {
	api := &fakeAPI{templates: map[string]*apiv1.PodTemplate{}, scalables: map[string]scalable{}}
	one := int32(1)
	for _, tc := range []struct {
		name, field string
		spec        Spec
	}{
		{"a 550 KB template name", "spec.podTemplateRef.name", Spec{PodTemplateRef: &LocalObjectRef{Name: strings.Repeat("a", 550<<10)}, Replicas: &one}},
		{"an escape sequence", "spec.podTemplateRef.name", Spec{PodTemplateRef: &LocalObjectRef{Name: "t\x1b]52;c;eHg=\x07"}, Replicas: &one}},
		{"a kind with a slash", "spec.scalableRef.kind", Spec{ScalableRef: &ScalableRef{APIGroup: "apps", Kind: "Deploy/ment", Name: "d"}, Replicas: &one}},
		{"an API group in capitals", "spec.scalableRef.apiGroup", Spec{ScalableRef: &ScalableRef{APIGroup: "Apps", Kind: "Deployment", Name: "d"}, Replicas: &one}},
		{"a scalable name of 300 bytes", "spec.scalableRef.name", Spec{ScalableRef: &ScalableRef{APIGroup: "apps", Kind: "Deployment", Name: strings.Repeat("d", 300)}, Replicas: &one}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(context.Background(), api, &CapacityBuffer{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}, Spec: tc.spec})
			var nr *NotReadyError
			if !errors.As(err, &nr) || nr.Reason != ReasonInvalidSpec || !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Fatalf("Resolve: %v, want InvalidSpec naming %s", err, tc.field)
			}
			if len(err.Error()) > 400 || strings.ContainsRune(err.Error(), '\x1b') {
				t.Fatalf("error of %d bytes (escape %v): the value must be quoted cut", len(err.Error()), strings.ContainsRune(err.Error(), '\x1b'))
			}
		})
	}
}
