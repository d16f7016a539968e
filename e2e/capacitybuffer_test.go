package e2e

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/capacitybuffer"
	"github.com/vmss-autoscaler/vmss-autoscaler/e2e/harness"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/app/statuscmd"
)

func bufferGVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: capacitybuffer.Group, Version: capacitybuffer.Version, Resource: capacitybuffer.Resource}
}

// TestCapacityBufferKeepsWarmGPUNodesAndTestTenantBufferText (-run
// TestTenant selects it too): a CapacityBuffer of two whole-node
// GPU chunks, applied with the chart's CRD, buys two H100 nodes on an
// empty scale set and says so on its status; a GPU pod created then runs
// at once on one of them (no node bought for it), and the buffer buys
// one more to be whole again; scale-down, active all along, removes the
// node the pod leaves behind but never a node holding the buffer's room;
// the buffer gone, its nodes go too. The Capacity requests dashboard's
// buffer panels show data from a real Prometheus.
//
// The only scenario that enables CapacityBuffers: its autoscaler handles
// every buffer in the cluster (as it would in its own), and scenarios
// share one API server.
func TestCapacityBufferKeepsWarmGPUNodesAndTestTenantBufferText(t *testing.T) {
	t.Parallel()
	root, err := harness.RepoRoot()
	must(t, err)
	sc := newScenario(t)
	start := time.Now()
	must(t, installCRDs(sc.ctx, sc.s.cp.RESTConfig, []string{filepath.Join(root, "charts", "vmss-autoscaler", "crds", "autoscaling.x-k8s.io_capacitybuffers.yaml")}, nil))
	gpu := sc.scaleSet("gpu", h100, 0, nil)
	as := sc.autoscaler("autoscaler", fastScaleDown("--nodes=0:4:"+gpu, "--enable-capacity-buffers",
		"--scale-down-brake-cluster-share=1", "--scale-down-brake-group-share=1")...)
	prom := sc.prometheus(sc.addr(as))
	sc.eventually("CapacityBuffers served", 30*time.Second, func() (bool, string) {
		return sc.logContains(as, "CapacityBuffers: serving"), "not yet"
	})
	sc.podTemplate("chunk", gpu)
	sc.createBuffer("warm", "chunk", 2)

	sc.eventually("the buffer Ready and Provisioning with 2 chunks", time.Minute, func() (bool, string) {
		b := sc.buffer("warm")
		r, p := apimeta.FindStatusCondition(b.Status.Conditions, capacitybuffer.ReadyForProvisioning), apimeta.FindStatusCondition(b.Status.Conditions, capacitybuffer.Provisioning)
		ok := r != nil && r.Status == metav1.ConditionTrue && p != nil && p.Status == metav1.ConditionTrue && b.Status.Replicas != nil && *b.Status.Replicas == 2
		return ok, fmt.Sprintf("status %+v", b.Status)
	})
	sc.tenantBufferText(as)
	sc.warmChunks(as, 2, 2*time.Minute)
	sc.eventually("two ready GPU nodes", time.Minute, func() (bool, string) {
		return len(sc.readyNodeNames(gpu)) == 2, fmt.Sprint(sc.readyNodeNames(gpu))
	})
	warmNodes := sc.readyNodeNames(gpu)

	// A pod of the chunk's shape runs at once on a warm node.
	sc.workload("job", 1, "90", 8, gpu)
	var jobNode string
	sc.eventually("the job's pod Running on a warm node", time.Minute, func() (bool, string) {
		pods := sc.appPods("job")
		if len(pods) != 1 || pods[0].Status.Phase != "Running" {
			return false, fmt.Sprintf("%d pods", len(pods))
		}
		jobNode = pods[0].Spec.NodeName
		return slices.Contains(warmNodes, jobNode), "on " + jobNode
	})
	sc.eventually("the buffer whole again on a third node", 2*time.Minute, func() (bool, string) {
		n := len(sc.readyNodeNames(gpu))
		return n == 3 && sc.warmChunksNow(as) == 2, fmt.Sprintf("%d nodes, warm %v", n, sc.warmChunksNow(as))
	})
	// The job goes: its node is empty and removed; the two that hold the
	// buffer's chunks stay, all along.
	var held []string
	for _, n := range sc.readyNodeNames(gpu) {
		if n != jobNode {
			held = append(held, n)
		}
	}
	must(t, sc.s.cp.Client.AppsV1().Deployments(sc.ns).Delete(sc.ctx, "job", metav1.DeleteOptions{}))
	sc.eventually("the job's node removed, the buffer's kept", 2*time.Minute, func() (bool, string) {
		nodes := sc.readyNodeNames(gpu)
		for _, n := range held {
			if !slices.Contains(nodes, n) {
				t.Fatalf("node %s removed while it held the buffer's room (nodes %v, the job's was %s)", n, nodes, jobNode)
			}
		}
		return !slices.Contains(nodes, jobNode) && sc.capacity(gpu) == 2 && sc.warmChunksNow(as) == 2,
			fmt.Sprintf("nodes %v (the job's %s), capacity %d", nodes, jobNode, sc.capacity(gpu))
	})
	sc.panelsShowData(prom, "capacity-requests.json", "capacity_buffer", start)
	// The buffer gone, its nodes go.
	must(t, sc.dynamic().Resource(bufferGVR()).Namespace(sc.ns).Delete(sc.ctx, "warm", metav1.DeleteOptions{}))
	sc.eventually("the buffer's nodes removed", 2*time.Minute, sc.capacityIs(gpu, 0))
}

// createBuffer creates a CapacityBuffer of replicas chunks of a PodTemplate.
func (sc *scenario) createBuffer(name, template string, replicas int64) {
	sc.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": capacitybuffer.GroupVersion.String(), "kind": capacitybuffer.Kind,
		"metadata": map[string]any{"name": name, "namespace": sc.ns},
		"spec":     map[string]any{"podTemplateRef": map[string]any{"name": template}, "replicas": replicas},
	}}
	if _, err := sc.dynamic().Resource(bufferGVR()).Namespace(sc.ns).Create(sc.ctx, u, metav1.CreateOptions{}); err != nil {
		sc.t.Fatalf("creating CapacityBuffer %s: %v", name, err)
	}
}

// tenantBufferText (#40, the TestTenant… part of this scenario: it needs its
// autoscaler, the only one serving buffers): a buffer whose template name
// is 600 KB, or carries an escape sequence, is refused by the API server
// (the chart's CRD: an object name, at most 253 characters); one of 253
// characters naming no template is NotReady, and the loop, the status
// ConfigMap and `vmss-autoscaler status` stay healthy, the message cut.
// Before, the 600 KB name was taken, copied twice into the status, which
// then failed every loop past the API server's 1 MiB.
func (sc *scenario) tenantBufferText(as *harness.Process) {
	sc.t.Helper()
	for name, template := range map[string]string{"huge": strings.Repeat("a", 600<<10), "escape": "t\x1b]52;c;Y3VybHxzaA==\x07"} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": capacitybuffer.GroupVersion.String(), "kind": capacitybuffer.Kind,
			"metadata": map[string]any{"name": name, "namespace": sc.ns},
			"spec":     map[string]any{"podTemplateRef": map[string]any{"name": template}, "replicas": int64(1)},
		}}
		_, err := sc.dynamic().Resource(bufferGVR()).Namespace(sc.ns).Create(sc.ctx, u, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.podTemplateRef.name") {
			sc.t.Fatalf("creating buffer %s with a template name of %d bytes: %v, want refused as invalid (spec.podTemplateRef.name)", name, len(template), err)
		}
	}
	long := strings.Repeat("l", 253)
	sc.createBuffer("long", long, 1)
	sc.eventually("the buffer naming no template NotReady", time.Minute, func() (bool, string) {
		c := apimeta.FindStatusCondition(sc.buffer("long").Status.Conditions, capacitybuffer.ReadyForProvisioning)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == capacitybuffer.ReasonPodTemplateNotFound, fmt.Sprintf("%+v", c)
	})
	sc.eventually("the status ConfigMap listing it, its message cut", time.Minute, func() (bool, string) {
		cm, err := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns).Get(sc.ctx, "vmss-autoscaler-status", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var st core.Status
		if err := yaml.Unmarshal([]byte(cm.Data["status"]), &st); err != nil || st.CapacityBuffers == nil {
			return false, fmt.Sprintf("status %v", err)
		}
		for _, b := range st.CapacityBuffers.Buffers {
			if b.Buffer == sc.ns+"/long" {
				return len(b.Message) <= 512 && strings.Contains(b.Message, "not ready"), fmt.Sprintf("message of %d bytes: %.80s", len(b.Message), b.Message)
			}
		}
		return false, fmt.Sprintf("%d buffers listed", len(st.CapacityBuffers.Buffers))
	})
	_, body := sc.get(as, "/metrics")
	if metricValue(body, `vmss_autoscaler_loop_errors_total{phase="status"}`) != 0 || metricValue(body, "vmss_autoscaler_status_write_failures_total") != 0 {
		sc.t.Fatal("the status phase failed, or a status write")
	}
	var out bytes.Buffer
	if err := statuscmd.Main(sc.ctx, []string{"--kubeconfig=" + sc.s.cp.Kubeconfig, "--namespace=" + sc.ns}, &out); err != nil || !strings.Contains(out.String(), sc.ns+"/long") {
		sc.t.Fatalf("vmss-autoscaler status: %v\n%s", err, out.String())
	}
	must(sc.t, sc.dynamic().Resource(bufferGVR()).Namespace(sc.ns).Delete(sc.ctx, "long", metav1.DeleteOptions{}))
}

// buffer reads a CapacityBuffer.
func (sc *scenario) buffer(name string) capacitybuffer.CapacityBuffer {
	sc.t.Helper()
	u, err := sc.dynamic().Resource(bufferGVR()).Namespace(sc.ns).Get(sc.ctx, name, metav1.GetOptions{})
	if err != nil {
		sc.t.Fatal(err)
	}
	var b capacitybuffer.CapacityBuffer
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &b); err != nil {
		sc.t.Fatal(err)
	}
	return b
}

// warmChunksNow is the autoscaler's count of chunks holding room on ready nodes.
func (sc *scenario) warmChunksNow(as *harness.Process) float64 {
	_, body := sc.get(as, "/metrics")
	return metricValue(body, `vmss_autoscaler_capacity_buffer_pods{state="warm"}`)
}

// warmChunks waits for n warm chunks.
func (sc *scenario) warmChunks(as *harness.Process, n float64, timeout time.Duration) {
	sc.t.Helper()
	sc.eventually(fmt.Sprintf("%v warm chunks", n), timeout, func() (bool, string) {
		v := sc.warmChunksNow(as)
		return v == n, fmt.Sprintf("warm %v", v)
	})
}

// readyNodeNames are the names of the set's Ready nodes.
func (sc *scenario) readyNodeNames(set string) []string {
	var out []string
	for _, n := range sc.nodeList(set) {
		for _, c := range n.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" && n.DeletionTimestamp == nil {
				out = append(out, n.Name)
			}
		}
	}
	return out
}

// panelsShowData waits until every panel query of a dashboard that names
// metric returns data from the scenario's Prometheus since start.
func (sc *scenario) panelsShowData(prom *prometheus, dashboard, metric string, start time.Time) {
	sc.t.Helper()
	var queries []panelQuery
	for _, q := range dashboardQueries(sc.t) {
		if q.Dashboard == dashboard && strings.Contains(q.Expr, metric) {
			queries = append(queries, q)
		}
	}
	if len(queries) == 0 {
		sc.t.Fatalf("no panel of %s queries %s", dashboard, metric)
	}
	sc.eventually(fmt.Sprintf("the %d %s panels of %s to show data", len(queries), metric, dashboard), time.Minute, func() (bool, string) {
		var missing []string
		for _, q := range queries {
			if n, err := prom.seriesOver(sc.ctx, q.Expr, start); err != nil || n == 0 {
				missing = append(missing, fmt.Sprintf("%s (%s): %v, %d series", q.Panel, q.Expr, err, n))
			}
		}
		return len(missing) == 0, strings.Join(missing, "; ")
	})
}
