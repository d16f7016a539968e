package trim

import (
	"bytes"
	appsv1 "k8s.io/api/apps/v1"
	"runtime"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	runtimeschema "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/heaptest"
)

// TestObjectKeepsWhatTheLoopReads: trimming drops exactly the fields the
// package comment lists; everything else is as it was.
func TestObjectKeepsWhatTheLoopReads(t *testing.T) {
	orig := realPod(1)
	orig.Spec.InitContainers = []apiv1.Container{orig.Spec.Containers[1]}
	orig.Spec.InitContainers[0].RestartPolicy = new(apiv1.ContainerRestartPolicyAlways) // a sidecar: counts in requests
	got, err := Object(orig.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	pod := got.(*apiv1.Pod)
	want := orig.DeepCopy()
	want.ManagedFields = nil
	delete(want.Annotations, LastAppliedAnnotation)
	for _, cs := range [][]apiv1.Container{want.Spec.InitContainers, want.Spec.Containers} {
		for i := range cs {
			c := &cs[i]
			c.Env, c.Command, c.Args, c.LivenessProbe, c.ReadinessProbe, c.VolumeMounts = nil, nil, nil, nil, nil, nil
			c.TerminationMessagePath, c.TerminationMessagePolicy = "", ""
		}
	}
	if !equality.Semantic.DeepEqual(pod, want) {
		t.Fatalf("trimmed pod differs from the original less the dropped fields")
	}
	// What the simulation and scale-down read is untouched.
	checks := []struct {
		name string
		ok   bool
	}{
		{"requests", equality.Semantic.DeepEqual(resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}), resourcehelper.PodRequests(orig, resourcehelper.PodResourcesOptions{}))},
		{"ports", equality.Semantic.DeepEqual(pod.Spec.Containers[0].Ports, orig.Spec.Containers[0].Ports)},
		{"volumes", equality.Semantic.DeepEqual(pod.Spec.Volumes, orig.Spec.Volumes)},
		{"owner", equality.Semantic.DeepEqual(pod.OwnerReferences, orig.OwnerReferences)},
		{"other annotations", pod.Annotations["prometheus.io/scrape"] == "true"},
		{"status", equality.Semantic.DeepEqual(pod.Status, orig.Status)},
		{"tolerations", equality.Semantic.DeepEqual(pod.Spec.Tolerations, orig.Spec.Tolerations)},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s changed", c.name)
		}
	}
	again, _ := Object(pod.DeepCopy())
	if !equality.Semantic.DeepEqual(again, pod) {
		t.Error("Object is not idempotent")
	}
}

func TestObjectByKind(t *testing.T) {
	node := realNode(3)
	ds := realDaemonSet()
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: realPod(2)}
	pod := realPod(4)
	podTemplate := &apiv1.PodTemplate{ObjectMeta: pod.ObjectMeta, Template: apiv1.PodTemplateSpec{Spec: pod.Spec}}
	three := int32(3)
	replicaSet := &appsv1.ReplicaSet{ObjectMeta: pod.ObjectMeta, Spec: appsv1.ReplicaSetSpec{Replicas: &three, Template: apiv1.PodTemplateSpec{Spec: pod.Spec}}}
	tests := []struct {
		name  string
		in    any
		check func(t *testing.T, out any)
	}{
		{"node: images and managed fields dropped, the rest kept", node.DeepCopy(), func(t *testing.T, out any) {
			n := out.(*apiv1.Node)
			if n.Status.Images != nil || n.ManagedFields != nil {
				t.Errorf("images %d, managed fields %d", len(n.Status.Images), len(n.ManagedFields))
			}
			want := node.DeepCopy()
			want.Status.Images, want.ManagedFields = nil, nil
			if !equality.Semantic.DeepEqual(n, want) {
				t.Error("other node fields changed")
			}
		}},
		{"DaemonSet: metadata only; the pod template is whole", ds.DeepCopy(), func(t *testing.T, out any) {
			d := out.(interface{ GetAnnotations() map[string]string })
			if _, ok := d.GetAnnotations()[LastAppliedAnnotation]; ok || d.GetAnnotations()["keep"] != "me" {
				t.Errorf("annotations %v", d.GetAnnotations())
			}
			got := realDaemonSetTemplate(out)
			if !equality.Semantic.DeepEqual(got, ds.Spec.Template) {
				t.Error("the DaemonSet's pod template changed")
			}
		}},
		{"PodTemplate (a buffer's shape): its containers' environment dropped, its requests kept", podTemplate.DeepCopy(), func(t *testing.T, out any) {
			pt := out.(*apiv1.PodTemplate)
			c := pt.Template.Spec.Containers[0]
			if c.Env != nil || c.Command != nil || pt.ManagedFields != nil {
				t.Errorf("env %v, command %v, managed fields %d kept", c.Env, c.Command, len(pt.ManagedFields))
			}
			if !equality.Semantic.DeepEqual(c.Resources, podTemplate.Template.Spec.Containers[0].Resources) {
				t.Error("the template's requests changed")
			}
		}},
		{"ReplicaSet (the pods to come): its template's environment dropped, its requests kept", replicaSet.DeepCopy(), func(t *testing.T, out any) {
			rs := out.(*appsv1.ReplicaSet)
			c := rs.Spec.Template.Spec.Containers[0]
			if c.Env != nil || rs.ManagedFields != nil {
				t.Errorf("env %v, managed fields %d kept", c.Env, len(rs.ManagedFields))
			}
			if !equality.Semantic.DeepEqual(c.Resources, replicaSet.Spec.Template.Spec.Containers[0].Resources) || *rs.Spec.Replicas != 3 {
				t.Error("the template's requests or the replicas changed")
			}
		}},
		{"tombstone passes through", tomb, func(t *testing.T, out any) {
			if !equality.Semantic.DeepEqual(out, tomb) {
				t.Error("tombstone changed")
			}
		}},
		{"nil", nil, func(t *testing.T, out any) {
			if out != nil {
				t.Errorf("got %v", out)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := Object(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, out)
		})
	}
}

func TestMetadataDropsOnlyManagedFields(t *testing.T) {
	p := realPod(4)
	out, _ := Metadata(p.DeepCopy())
	got := out.(*apiv1.Pod)
	want := p.DeepCopy()
	want.ManagedFields = nil
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatal("Metadata changed more than managed fields")
	}
}

// BenchmarkInformerCache measures what the informer caches hold for pods
// and nodes decoded as a LIST delivers them (each object its own
// allocation), untrimmed and trimmed, at a tenth of 7,500 nodes / 200,000
// pods, and reports per object and scaled to the full cluster. It also
// reports the bytes per pod on the wire and the decode time, protobuf
// against JSON.
func BenchmarkInformerCache(b *testing.B) {
	const pods, nodes = 20000, 750
	proto := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	js := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{})
	encode := func(s runtimeschema.Encoder, objs func(i int) runtimeschema.Object, n int) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			var buf bytes.Buffer
			if err := s.Encode(objs(i), &buf); err != nil {
				b.Fatal(err)
			}
			out[i] = buf.Bytes()
		}
		return out
	}
	podPB := encode(proto, func(i int) runtimeschema.Object { return realPod(i) }, pods)
	nodePB := encode(proto, func(i int) runtimeschema.Object { return realNode(i) }, nodes)
	podJSON := encode(js, func(i int) runtimeschema.Object { return realPod(i) }, 2000)
	size := func(bs [][]byte) float64 {
		n := 0
		for _, x := range bs {
			n += len(x)
		}
		return float64(n) / float64(len(bs))
	}
	decode := func(s runtimeschema.Decoder, bs [][]byte, transform cache.TransformFunc) []any {
		out := make([]any, len(bs))
		for i, x := range bs {
			obj, _, err := s.Decode(x, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			if transform != nil {
				if out[i], err = transform(obj); err != nil {
					b.Fatal(err)
				}
			} else {
				out[i] = obj
			}
		}
		return out
	}
	// held measures the heap an object set keeps alive.
	held := func(bs [][]byte, transform cache.TransformFunc) float64 {
		before := heaptest.Live()
		objs := decode(proto, bs, transform)
		after := heaptest.Live()
		runtime.KeepAlive(objs)
		return float64(after-before) / float64(len(bs))
	}
	var podRaw, podTrim, nodeRaw, nodeTrim, protoNs, jsonNs float64
	for range b.N {
		podRaw, podTrim = held(podPB, nil), held(podPB, Object)
		nodeRaw, nodeTrim = held(nodePB, nil), held(nodePB, Object)
		start := time.Now()
		decode(proto, podPB[:2000], nil)
		protoNs = float64(time.Since(start).Nanoseconds()) / 2000
		start = time.Now()
		decode(js, podJSON, nil)
		jsonNs = float64(time.Since(start).Nanoseconds()) / 2000
	}
	const mib = 1 << 20
	b.ReportMetric(podRaw, "B/pod-untrimmed")
	b.ReportMetric(podTrim, "B/pod-trimmed")
	b.ReportMetric(nodeRaw, "B/node-untrimmed")
	b.ReportMetric(nodeTrim, "B/node-trimmed")
	b.ReportMetric((podRaw*200000+nodeRaw*7500)/mib, "MiB-untrimmed-at-200k-pods")
	b.ReportMetric((podTrim*200000+nodeTrim*7500)/mib, "MiB-trimmed-at-200k-pods")
	b.ReportMetric(100*(1-(podTrim*200000+nodeTrim*7500)/(podRaw*200000+nodeRaw*7500)), "%-saved")
	b.ReportMetric(size(podPB), "B/pod-protobuf-wire")
	b.ReportMetric(size(podJSON), "B/pod-json-wire")
	b.ReportMetric(protoNs/1000, "µs/pod-protobuf-decode")
	b.ReportMetric(jsonNs/1000, "µs/pod-json-decode")
}
