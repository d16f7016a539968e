package charts

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/simulator"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/clientmetrics"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/promrec"
)

const (
	chartDir  = "vmss-autoscaler"
	release   = "vmss-autoscaler"
	namespace = "kube-system"
)

// fullValues turns every switch on: workload identity, a warm pool,
// explicit nodes and discovery, the periodic preflight agent, monitoring
// objects and dashboards, and renamed objects the RBAC must follow.
const fullValues = `
replicaCount: 3
image:
  repository: example.azurecr.io/vmss-autoscaler
  tag: v9.9.9
azure:
  subscriptionID: 00000000-0000-0000-0000-000000000001
  tenantID: 00000000-0000-0000-0000-000000000002
  clientID: 00000000-0000-0000-0000-000000000003
workloadIdentity:
  enabled: true
  tenantID: 00000000-0000-0000-0000-000000000002
rbac:
  podGroups: true
config:
  azure-auth: workload-identity
  azure-resource-groups: [rg-gpu, rg-cpu]
  nodes: ["0:100:gpu-h100", "1:50:cpu"]
  node-group-auto-discovery: ["label:k8s.io_cluster-autoscaler_enabled,k8s.io_cluster-autoscaler_prod"]
  warm-pool: ["gpu-h100:2", "cpu:10%:1:5"]
  expander: priority,least-waste
  node-addition-rate: 120
  node-addition-burst: 5
  max-nodes-in-flight: 500
  scale-down-enabled: false
  scale-down-delay-after-delete: 0
  scale-down-brake-cluster-share: 0.25
  balloon-namespace: balloons
  balloon-priority-class: warm-balloons
  balloon-priority-value: -1000
  status-config-map-name: my-status
  leader-elect-resource-name: my-lease
  enable-provisioning-requests: true
  enable-capacity-buffers: true
  preflight-taint: example.com/burn-in=pending:NoSchedule
  preflight-label: example.com/burn-in
  v: 2
priorityExpander:
  priorities:
    "50": [".*h100.*"]
    "10": [".*"]
preflight:
  runtimeClassName: nvidia
  periodic:
    enabled: true
    interval: 3h
serviceMonitor:
  enabled: true
  labels: {release: prometheus}
  prometheusServiceAccount: {name: prometheus, namespace: monitoring}
prometheusRule:
  enabled: true
  additionalLabels: {team: infra}
dashboards:
  enabled: true
  annotations: {grafana_folder: Autoscaling}
`

// ---------------------------------------------------------------- rendering

var loadOnce = sync.OnceValues(func() (*chart.Chart, error) { return loader.Load(chartDir) })

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loadOnce()
	if err != nil {
		t.Fatalf("loading chart %s: %v", chartDir, err)
	}
	return ch
}

func parseValues(t *testing.T, s string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(s))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	return v.AsMap()
}

// render renders the chart as `helm install -n kube-system` would, values
// checked against values.schema.json first.
func render(t *testing.T, values map[string]any) (map[string]string, error) {
	t.Helper()
	return renderIn(t, values, namespace)
}

// renderIn is render as `helm install -n ns`.
func renderIn(t *testing.T, values map[string]any, ns string) (map[string]string, error) {
	t.Helper()
	ch := loadChart(t)
	opts := chartutil.ReleaseOptions{Name: release, Namespace: ns, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(ch, values, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, vals)
}

// object is one rendered Kubernetes document.
type object struct {
	file string
	raw  string
	m    map[string]any
}

func (o object) kind() string { s, _ := o.m["kind"].(string); return s }
func (o object) name() string {
	md, _ := o.m["metadata"].(map[string]any)
	s, _ := md["name"].(string)
	return s
}
func (o object) namespace() string {
	md, _ := o.m["metadata"].(map[string]any)
	s, _ := md["namespace"].(string)
	return s
}

type rendered struct {
	objects []object
	notes   string
}

// mustRender renders values and checks that every document parses as YAML
// and has apiVersion, kind and metadata.name.
func mustRender(t *testing.T, values map[string]any) rendered {
	t.Helper()
	out, err := render(t, values)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	var r rendered
	files := make([]string, 0, len(out))
	for f := range out {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		content := out[f]
		switch {
		case strings.HasSuffix(f, "NOTES.txt"):
			r.notes = content
			continue
		case strings.HasPrefix(filepath.Base(f), "_"):
			continue
		}
		docs := releaseutil.SplitManifests(content)
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			doc := docs[k]
			var m map[string]any
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				t.Fatalf("%s: not YAML: %v\n%s", f, err, doc)
			}
			if len(m) == 0 {
				continue
			}
			o := object{file: f, raw: doc, m: m}
			if av, _ := m["apiVersion"].(string); av == "" || o.kind() == "" || o.name() == "" {
				t.Fatalf("%s: document without apiVersion, kind or metadata.name:\n%s", f, doc)
			}
			r.objects = append(r.objects, o)
		}
	}
	if len(r.objects) == 0 {
		t.Fatal("nothing rendered")
	}
	return r
}

func (r rendered) find(kind, name string) (object, bool) {
	for _, o := range r.objects {
		if o.kind() == kind && o.name() == name {
			return o, true
		}
	}
	return object{}, false
}

func (r rendered) get(t *testing.T, kind, name string) object {
	t.Helper()
	o, ok := r.find(kind, name)
	if !ok {
		t.Fatalf("no %s %s rendered; have %s", kind, name, r.names())
	}
	return o
}

func (r rendered) ofKind(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.kind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func (r rendered) names() string {
	var s []string
	for _, o := range r.objects {
		s = append(s, o.kind()+"/"+o.name())
	}
	return strings.Join(s, ", ")
}

// strictCodec decodes built-in kinds and fails on unknown or duplicate
// fields, so a misspelt field (readOnlyRootFileSystem) breaks the test.
var strictCodec = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

func decode[T runtime.Object](t *testing.T, o object) T {
	t.Helper()
	obj, _, err := strictCodec.Decode([]byte(o.raw), nil, nil)
	if err != nil {
		t.Fatalf("%s %s (%s): %v", o.kind(), o.name(), o.file, err)
	}
	typed, ok := obj.(T)
	if !ok {
		t.Fatalf("%s %s decoded as %T", o.kind(), o.name(), obj)
	}
	return typed
}

// checkTyped decodes every built-in document strictly; the
// monitoring.coreos.com ones are checked by their own tests.
func checkTyped(t *testing.T, r rendered) {
	t.Helper()
	for _, o := range r.objects {
		av, _ := o.m["apiVersion"].(string)
		if strings.HasPrefix(av, "monitoring.coreos.com/") {
			continue
		}
		if _, _, err := strictCodec.Decode([]byte(o.raw), nil, nil); err != nil {
			t.Errorf("%s %s (%s): %v", o.kind(), o.name(), o.file, err)
		}
	}
}

func kinds(r rendered) map[string]int {
	m := map[string]int{}
	for _, o := range r.objects {
		m[o.kind()]++
	}
	return m
}

// ---------------------------------------------------------------- the binary

// binDir holds the binary built for the tests; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var binOnce = sync.OnceValues(func() (string, error) {
	if p := os.Getenv("VMSS_AUTOSCALER_BIN"); p != "" {
		return p, nil
	}
	dir, err := os.MkdirTemp("", "vmss-autoscaler-chart-test")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "vmss-autoscaler")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/vmss-autoscaler")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// binary is the autoscaler binary: $VMSS_AUTOSCALER_BIN, or built once.
func binary(t *testing.T) string {
	t.Helper()
	bin, err := binOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

var flagRE = regexp.MustCompile(`(?m)^\s+(?:-([a-zA-Z]), )?--([a-zA-Z0-9][a-zA-Z0-9_-]*)`)

// flags returns the flag names (and shorthands) of `bin args... --help`.
func flags(t *testing.T, args ...string) map[string]bool {
	t.Helper()
	cmd := exec.Command(binary(t), append(args, "--help")...)
	out, _ := cmd.CombinedOutput() // --help exits 1 (pflag.ErrHelp)
	set := map[string]bool{}
	for _, m := range flagRE.FindAllStringSubmatch(string(out), -1) {
		set[m[2]] = true
		if m[1] != "" {
			set[m[1]] = true
		}
	}
	if len(set) < 10 {
		t.Fatalf("%v --help listed %d flags:\n%s", args, len(set), out)
	}
	return set
}

var (
	autoscalerFlagsOnce sync.Once
	autoscalerFlagSet   map[string]bool
	agentFlagsOnce      sync.Once
	agentFlagSet        map[string]bool
)

func autoscalerFlags(t *testing.T) map[string]bool {
	autoscalerFlagsOnce.Do(func() { autoscalerFlagSet = flags(t) })
	if autoscalerFlagSet == nil {
		t.Fatal("no autoscaler flags")
	}
	return autoscalerFlagSet
}

func agentFlags(t *testing.T) map[string]bool {
	agentFlagsOnce.Do(func() { agentFlagSet = flags(t, "preflight") })
	if agentFlagSet == nil {
		t.Fatal("no preflight agent flags")
	}
	return agentFlagSet
}

// checkArgs checks that every --flag of args is one the command accepts.
func checkArgs(t *testing.T, what string, args []string, known map[string]bool) {
	t.Helper()
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !known[name] {
			t.Errorf("%s: argument %q is not a flag of the binary", what, a)
		}
	}
}

// ---------------------------------------------------------------- tests

func TestRenderDefaults(t *testing.T) {
	r := mustRender(t, nil)
	checkTyped(t, r)

	want := map[string]int{
		"Deployment": 1, "DaemonSet": 1, "ServiceAccount": 2, "ConfigMap": 4, "Service": 1,
		"PodDisruptionBudget": 1, "PriorityClass": 1, "ClusterRole": 3, "ClusterRoleBinding": 2, // + the metrics reader
		"Role": 2, "RoleBinding": 2, "Namespace": 1,
		"ValidatingAdmissionPolicy": 5, "ValidatingAdmissionPolicyBinding": 5,
		"NetworkPolicy": 1,
	}
	if got := kinds(r); !maps.Equal(got, want) {
		t.Errorf("kinds rendered = %v, want %v", got, want)
	}
	for _, o := range r.objects {
		switch o.kind() {
		case "ClusterRole", "ClusterRoleBinding", "PriorityClass", "Namespace", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			continue
		}
		want := namespace
		if o.name() == "vmss-autoscaler-balloons" {
			want = "vmss-autoscaler-balloons" // the balloon Role and RoleBinding
		}
		if o.namespace() != want {
			t.Errorf("%s %s in namespace %q, want %s", o.kind(), o.name(), o.namespace(), want)
		}
	}

	d := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler"))
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2 (leader election)", d.Spec.Replicas)
	}
	ps := d.Spec.Template.Spec
	if ps.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName = %q", ps.PriorityClassName)
	}
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot ||
		ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want runAsNonRoot and seccomp RuntimeDefault", ps.SecurityContext)
	}
	if len(ps.TopologySpreadConstraints) == 0 || ps.TopologySpreadConstraints[0].TopologyKey != "kubernetes.io/hostname" ||
		ps.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.DoNotSchedule {
		t.Errorf("topologySpreadConstraints = %+v, want the replicas on different nodes", ps.TopologySpreadConstraints)
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("containers = %d", len(ps.Containers))
	}
	c := ps.Containers[0]
	if c.Image != "ghcr.io/vmss-autoscaler/vmss-autoscaler:0.1.0" {
		t.Errorf("image = %q, want the appVersion tag", c.Image)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext = %+v", sc)
	}
	for _, a := range []string{"--config=/etc/vmss-autoscaler/config.yaml", "--namespace=" + namespace, "--address=127.0.0.1:8085", "--secure-address=:8443"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("args %q lack %q", c.Args, a)
		}
	}
	checkArgs(t, "Deployment", c.Args, autoscalerFlags(t))
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "metrics" ||
		p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("livenessProbe = %+v, want GET https /healthz on the metrics port", p)
	}
	// The network sees only the TLS listener; the plain one is on loopback.
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8443 {
		t.Errorf("ports = %+v, want the TLS listener's 8443", c.Ports)
	}
	if got := c.Resources.Requests.Memory().String(); got != "6Gi" {
		t.Errorf("memory request = %s, want 6Gi", got)
	}
	if got := c.Resources.Limits.Memory().String(); got != "12Gi" {
		t.Errorf("memory limit = %s, want 12Gi", got)
	}
	if got := c.Resources.Requests.Cpu().String(); got != "2" {
		t.Errorf("cpu request = %s, want 2", got)
	}
	if !c.Resources.Limits.Cpu().IsZero() {
		t.Errorf("cpu limit %s: none wanted (throttling stretches the loop and lease renewals)", c.Resources.Limits.Cpu())
	}
	if _, ok := d.Spec.Template.Annotations["checksum/config"]; ok {
		t.Error("checksum/config annotation with liveConfig: every config edit would restart the pods")
	}
	if !slices.Contains(c.Args, "--config-map=vmss-autoscaler-config") {
		t.Errorf("args %q: the flags ConfigMap is not watched (--config-map)", c.Args)
	}
	if _, ok := d.Spec.Template.Labels["azure.workload.identity/use"]; ok {
		t.Error("workload identity label without workloadIdentity.enabled")
	}

	pdb := r.get(t, "PodDisruptionBudget", "vmss-autoscaler")
	if !strings.Contains(pdb.raw, "maxUnavailable: 1") {
		t.Errorf("PDB:\n%s", pdb.raw)
	}
	pc := decode[*schedulingv1.PriorityClass](t, r.get(t, "PriorityClass", "vmss-autoscaler-balloon"))
	if pc.Value != -100 || pc.PreemptionPolicy == nil || *pc.PreemptionPolicy != corev1.PreemptNever || pc.GlobalDefault {
		t.Errorf("balloon PriorityClass = value %d, preemptionPolicy %v, globalDefault %v", pc.Value, pc.PreemptionPolicy, pc.GlobalDefault)
	}

	// The preflight agent (README "The preflight agent", preflight/agent/RBAC.md).
	ds := decode[*appsv1.DaemonSet](t, r.get(t, "DaemonSet", "vmss-autoscaler-preflight"))
	checkAgent(t, ds, "vmss-autoscaler.io/preflight", "pending")
	ac := ds.Spec.Template.Spec.Containers[0]
	if !slices.Equal(ac.Args, []string{"preflight", "--checks=/etc/vmss-autoscaler/preflight/checks.yaml"}) {
		t.Errorf("agent args = %q", ac.Args)
	}
	for _, k := range []string{"vmss-autoscaler.io/preflight", "nvidia.com/gpu"} {
		if !tolerates(ds.Spec.Template.Spec.Tolerations, k) {
			t.Errorf("agent does not tolerate %s: %+v", k, ds.Spec.Template.Spec.Tolerations)
		}
	}
	if _, ok := r.find("DaemonSet", "vmss-autoscaler-preflight-periodic"); ok {
		t.Error("periodic agent rendered while preflight.periodic.enabled is false")
	}

	if !strings.Contains(r.notes, "vmss-autoscaler-status") || !strings.Contains(r.notes, "get lease vmss-autoscaler") ||
		!strings.Contains(r.notes, "/metrics") || !strings.Contains(r.notes, "events") {
		t.Errorf("NOTES.txt does not say what to check:\n%s", r.notes)
	}
	if !strings.Contains(r.notes, "WARNING") {
		t.Error("NOTES.txt does not warn that no node group is configured")
	}
}

// TestLiveConfigOff: without --config-map the flags are read at start only,
// so a config change must roll the pods.
func TestLiveConfigOff(t *testing.T) {
	r := mustRender(t, parseValues(t, "liveConfig: {enabled: false}"))
	d := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler"))
	if d.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a config change would not reach the pods")
	}
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--config-map") {
			t.Errorf("arg %q with liveConfig.enabled false", a)
		}
	}
	other := mustRender(t, parseValues(t, "liveConfig: {enabled: false}\nconfig: {scan-interval: 20s}"))
	d2 := decode[*appsv1.Deployment](t, other.get(t, "Deployment", "vmss-autoscaler"))
	if d.Spec.Template.Annotations["checksum/config"] == d2.Spec.Template.Annotations["checksum/config"] {
		t.Error("checksum/config does not follow the config")
	}
}

func checkAgent(t *testing.T, ds *appsv1.DaemonSet, label, value string) {
	t.Helper()
	ps := ds.Spec.Template.Spec
	if ps.NodeSelector[label] != value {
		t.Errorf("%s nodeSelector = %v, want %s=%s", ds.Name, ps.NodeSelector, label, value)
	}
	if ps.ServiceAccountName != "vmss-autoscaler-preflight" {
		t.Errorf("%s serviceAccountName = %q", ds.Name, ps.ServiceAccountName)
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("%s containers = %d", ds.Name, len(ps.Containers))
	}
	c := ps.Containers[0]
	var nodeName bool
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeName = true
		}
	}
	if !nodeName {
		t.Errorf("%s: no NODE_NAME from spec.nodeName: %+v", ds.Name, c.Env)
	}
	// As narrow as the checks allow (values.yaml, SECURITY.md): not
	// privileged, every capability dropped but SYSLOG (dmesg, the XID
	// check), a read-only root filesystem with /tmp an emptyDir.
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || *sc.Privileged ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SYSLOG"}) ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: securityContext %+v, want unprivileged, ALL dropped but SYSLOG, read-only root, RuntimeDefault seccomp", ds.Name, sc)
	}
	var tmp bool
	for _, m := range c.VolumeMounts {
		tmp = tmp || m.MountPath == "/tmp"
	}
	if !tmp {
		t.Errorf("%s: no writable /tmp under a read-only root filesystem: %+v", ds.Name, c.VolumeMounts)
	}
	if len(c.Args) == 0 || c.Args[0] != "preflight" {
		t.Fatalf("%s args = %q, want the preflight subcommand", ds.Name, c.Args)
	}
	checkArgs(t, ds.Name, c.Args[1:], agentFlags(t))
}

func tolerates(ts []corev1.Toleration, key string) bool {
	for _, tol := range ts {
		if tol.Key == key || (tol.Key == "" && tol.Operator == corev1.TolerationOpExists) {
			return true
		}
	}
	return false
}

func TestRenderAllSwitches(t *testing.T) {
	r := mustRender(t, parseValues(t, fullValues))
	checkTyped(t, r)

	k := kinds(r)
	for kind, n := range map[string]int{"ServiceMonitor": 1, "PrometheusRule": 1, "DaemonSet": 2, "PriorityClass": 1} {
		if k[kind] != n {
			t.Errorf("%d %s rendered, want %d", k[kind], kind, n)
		}
	}

	// Workload identity: ServiceAccount annotation and pod label.
	sa := decode[*corev1.ServiceAccount](t, r.get(t, "ServiceAccount", "vmss-autoscaler"))
	if sa.Annotations["azure.workload.identity/client-id"] != "00000000-0000-0000-0000-000000000003" ||
		sa.Annotations["azure.workload.identity/tenant-id"] != "00000000-0000-0000-0000-000000000002" {
		t.Errorf("ServiceAccount annotations = %v", sa.Annotations)
	}
	d := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler"))
	if d.Spec.Template.Labels["azure.workload.identity/use"] != "true" {
		t.Errorf("pod labels = %v, want azure.workload.identity/use", d.Spec.Template.Labels)
	}
	if *d.Spec.Replicas != 3 || d.Spec.Template.Spec.Containers[0].Image != "example.azurecr.io/vmss-autoscaler:v9.9.9" {
		t.Errorf("replicas %d, image %s", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Image)
	}
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["AZURE_SUBSCRIPTION_ID"] != "00000000-0000-0000-0000-000000000001" || env["AZURE_TENANT_ID"] == "" || env["AZURE_CLIENT_ID"] == "" {
		t.Errorf("env = %v", env)
	}

	// The names the binary was told follow into the chart's objects.
	pc := decode[*schedulingv1.PriorityClass](t, r.get(t, "PriorityClass", "warm-balloons"))
	if pc.Value != -1000 {
		t.Errorf("PriorityClass value %d, want config.balloon-priority-value", pc.Value)
	}
	r.get(t, "ConfigMap", "vmss-autoscaler-preflight-periodic-checks")
	if o := r.get(t, "Role", "vmss-autoscaler-balloons"); o.namespace() != "balloons" {
		t.Errorf("balloon Role in %q, want config.balloon-namespace", o.namespace())
	}

	// The periodic agent: a second DaemonSet on nodes that passed.
	label := "example.com/burn-in"
	checkAgent(t, decode[*appsv1.DaemonSet](t, r.get(t, "DaemonSet", "vmss-autoscaler-preflight")), label, "pending")
	pds := decode[*appsv1.DaemonSet](t, r.get(t, "DaemonSet", "vmss-autoscaler-preflight-periodic"))
	checkAgent(t, pds, label, "passed")
	args := pds.Spec.Template.Spec.Containers[0].Args
	for _, a := range []string{"--periodic", "--interval=3h", "--label=" + label, "--taint=example.com/burn-in=pending:NoSchedule"} {
		if !slices.Contains(args, a) {
			t.Errorf("periodic agent args %q lack %q", args, a)
		}
	}
	if pds.Spec.Template.Spec.RuntimeClassName == nil || *pds.Spec.Template.Spec.RuntimeClassName != "nvidia" {
		t.Error("preflight.runtimeClassName not applied")
	}
	pending := decode[*appsv1.DaemonSet](t, r.get(t, "DaemonSet", "vmss-autoscaler-preflight"))
	if !tolerates(pending.Spec.Template.Spec.Tolerations, "example.com/burn-in") {
		t.Error("agent does not tolerate the configured preflight taint")
	}

	// Dashboards: one ConfigMap per file, labelled for the sidecar.
	var dashboards int
	for _, o := range r.ofKind("ConfigMap") {
		if !strings.Contains(o.name(), "-dashboard-") {
			continue
		}
		dashboards++
		cm := decode[*corev1.ConfigMap](t, o)
		if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "Autoscaling" {
			t.Errorf("%s labels %v annotations %v", cm.Name, cm.Labels, cm.Annotations)
		}
	}
	files, _ := filepath.Glob(filepath.Join(chartDir, "dashboards", "*.json"))
	if dashboards != len(files) || dashboards < 5 {
		t.Errorf("%d dashboard ConfigMaps for %d files (want overview, smoothing, preflight, balloons, arm)", dashboards, len(files))
	}

	sm := r.get(t, "ServiceMonitor", "vmss-autoscaler")
	svc := decode[*corev1.Service](t, r.get(t, "Service", "vmss-autoscaler"))
	sel, _ := yamlPath(sm.m, "spec", "selector", "matchLabels").(map[string]any)
	for k, v := range sel {
		if svc.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%v; the Service has %q", k, v, svc.Labels[k])
		}
	}
	if len(sel) == 0 {
		t.Error("ServiceMonitor has no selector")
	}
	// The scrape goes to the TLS listener with Prometheus' token, and the
	// reader ClusterRole is bound to Prometheus' ServiceAccount.
	ep, _ := yamlPath(sm.m, "spec", "endpoints").([]any)
	if len(ep) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v", ep)
	}
	e, _ := ep[0].(map[string]any)
	if e["scheme"] != "https" || e["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || e["port"] != "metrics" {
		t.Errorf("ServiceMonitor endpoint %v, want https with the bearer token file on the metrics port", e)
	}
	reader := decode[*rbacv1.ClusterRole](t, r.get(t, "ClusterRole", "vmss-autoscaler-metrics-reader"))
	if want := []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}; fmt.Sprint(reader.Rules) != fmt.Sprint(want) {
		t.Errorf("metrics reader rules %+v, want %+v", reader.Rules, want)
	}
	crb := decode[*rbacv1.ClusterRoleBinding](t, r.get(t, "ClusterRoleBinding", "vmss-autoscaler-metrics-reader"))
	if len(crb.Subjects) != 1 || crb.Subjects[0].Name != "prometheus" || crb.Subjects[0].Namespace != "monitoring" {
		t.Errorf("metrics reader bound to %+v, want monitoring/prometheus", crb.Subjects)
	}
}

// TestMetricsPlain: metrics.secure.enabled false serves plain on all
// interfaces (the old behaviour) and grants no token or access reviews.
func TestMetricsPlain(t *testing.T) {
	r := mustRender(t, parseValues(t, "metrics: {port: 8085, secure: {enabled: false}}\nserviceMonitor: {enabled: true}"))
	c := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler")).Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--address=:8085") || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--secure-address") }) {
		t.Errorf("args %q, want the plain listener only", c.Args)
	}
	if c.LivenessProbe.HTTPGet.Scheme == corev1.URISchemeHTTPS {
		t.Error("liveness probe over HTTPS without the TLS listener")
	}
	cr := decode[*rbacv1.ClusterRole](t, r.get(t, "ClusterRole", "vmss-autoscaler"))
	if allows(cr.Rules, grant{"authentication.k8s.io", "tokenreviews", "create", ""}) {
		t.Error("tokenreviews granted without the TLS listener")
	}
	if strings.Contains(r.get(t, "ServiceMonitor", "vmss-autoscaler").raw, "https") {
		t.Error("ServiceMonitor scrapes https without the TLS listener")
	}
}

func yamlPath(m map[string]any, path ...string) any {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

// TestSchemaRejectsBadValues: values.schema.json fails `helm install` with a
// message naming the field.
func TestSchemaRejectsBadValues(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct {
		name, values, field string
	}{
		{"replicas not a number", `replicaCount: two`, "replicaCount"},
		{"replicas zero", `replicaCount: 0`, "replicaCount"},
		{"unknown azure auth", `config: {azure-auth: magic}`, "azure-auth"},
		{"no image repository", `image: {repository: ""}`, "repository"},
		{"bad node group", `config: {nodes: ["gpu-h100"]}`, "nodes"},
		{"bad duration", `config: {scan-interval: 10 seconds}`, "scan-interval"},
		{"bad expander", `config: {expander: cheapest}`, "expander"},
		{"bad content type", `config: {kube-api-content-type: application/yaml}`, "kube-api-content-type"},
		{"bad standby informers", `config: {standby-informers: cold}`, "standby-informers"},
		{"bad warm pool", `config: {warm-pool: ["gpu:lots"]}`, "warm-pool"},
		{"share above 1", `config: {scale-down-brake-cluster-share: 2}`, "scale-down-brake-cluster-share"},
		{"positive balloon priority", `config: {balloon-priority-value: 10}`, "balloon-priority-value"},
		{"map as a flag value", `config: {expander-options: {a: b}}`, "expander-options"},
		{"namespace set by the chart", `config: {namespace: other}`, "namespace"},
		{"config-map set by the chart", `config: {config-map: other}`, "config-map"},
		{"typo at the top", `replicas: 2`, "replicas"},
		{"metrics port", `metrics: {port: 0}`, "port"},
		{"check without timeout", `preflight: {checks: {checks: [{name: gpus, command: [nvidia-smi]}]}}`, "timeout"},
		{"check with a bad name", `preflight: {checks: {checks: [{name: "no spaces", command: [x], timeout: 1s}]}}`, "name"},
		{"check rule misspelt", `preflight: {checks: {checks: [{name: x, command: [x], timeout: 1s, mustNotMatches: y}]}}`, "mustNotMatches"},
		{"check retries above 10", `preflight: {checks: {checks: [{name: x, command: [x], timeout: 1s, retries: 11}]}}`, "retries"},
		{"library: unknown check", `preflight: {library: {nvlink: {enabled: true}}}`, "nvlink"},
		{"library: dcgm level 5", `preflight: {library: {dcgm: {level: 5}}}`, "level"},
		{"library: gpu count zero", `preflight: {library: {gpus: {count: 0}}}`, "count"},
		{"library: bandwidth not a number", `preflight: {library: {allReduce: {minBusBandwidth: fast}}}`, "minBusBandwidth"},
		{"library: xid not a number", `preflight: {library: {xid: {xids: [79, fallen]}}}`, "xids"},
		{"priorities key", `priorityExpander: {priorities: {high: [".*"]}}`, "priorities"},
		{"service monitor interval", `serviceMonitor: {interval: often}`, "interval"},
		{"balloon ceiling not a quantity", `admissionPolicies: {balloonMaxResources: {nvidia.com/gpu: lots}}`, "balloonMaxResources"},
		{"balloon ceiling negative", `admissionPolicies: {balloonMaxResources: {cpu: -1}}`, "balloonMaxResources"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := parseValues(t, tc.values)
			coalesced, err := chartutil.CoalesceValues(ch, vals)
			if err != nil {
				t.Fatal(err)
			}
			err = chartutil.ValidateAgainstSchema(ch, coalesced)
			if err == nil {
				t.Fatalf("schema accepted %s", tc.values)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error does not name %q:\n%v", tc.field, err)
			}
			if _, err := render(t, vals); err == nil {
				t.Errorf("render accepted %s", tc.values)
			}
		})
	}
	// And the defaults and the full values pass.
	for _, v := range []string{"", fullValues} {
		coalesced, err := chartutil.CoalesceValues(ch, parseValues(t, v))
		if err != nil {
			t.Fatal(err)
		}
		if err := chartutil.ValidateAgainstSchema(ch, coalesced); err != nil {
			t.Errorf("schema rejects good values: %v", err)
		}
	}
}

// TestTemplateRejectsBadValues: what the schema cannot say, the templates do.
func TestTemplateRejectsBadValues(t *testing.T) {
	for _, tc := range []struct{ name, values, want string }{
		{"warm pool without balloons", "balloons: {enabled: false}\nconfig: {warm-pool: [\"gpu:2\"]}", "balloons.enabled"},
		{"workload identity without client", "workloadIdentity: {enabled: true}", "workloadIdentity.clientID"},
		{"preflight agent without its admission policy", "admissionPolicies: {enabled: false}",
			"preflight.enabled needs admissionPolicies.enabled: without the admission policy <fullname>-preflight-own-node the preflight agent's token"},
		{"no preflight check at all", "preflight: {checks: {checks: []}, library: {gpus: {enabled: false}, ecc: {enabled: false}, xid: {enabled: false}, dcgm: {enabled: false}}}",
			"preflight: no check at all"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, parseValues(t, tc.values))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render error = %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// configOf returns the flags ConfigMap's config.yaml, raw and parsed.
func configOf(t *testing.T, r rendered) (string, map[string]any) {
	t.Helper()
	cm := decode[*corev1.ConfigMap](t, r.get(t, "ConfigMap", "vmss-autoscaler-config"))
	raw, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatal("flags ConfigMap has no config.yaml")
	}
	m := map[string]any{}
	if err := yaml.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatalf("config.yaml: %v\n%s", err, raw)
	}
	return raw, m
}

// effectiveConfigOf is what the binary runs with: config.yaml's keys and
// the command-line-only ones the Deployment passes as arguments
// (--key=value: booleans as bool, the rest as strings).
func effectiveConfigOf(t *testing.T, r rendered) map[string]any {
	t.Helper()
	_, cfg := configOf(t, r)
	d := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler"))
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, a := range c.Args {
			k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if !ok || !strings.HasPrefix(a, "--") {
				continue
			}
			switch v {
			case "true":
				cfg[k] = true
			case "false":
				cfg[k] = false
			default:
				cfg[k] = v
			}
		}
	}
	return cfg
}

// TestConfigKeysAreFlags: every key of the flags ConfigMap is a flag of the
// binary (from its --help), as its --config loader demands.
func TestConfigKeysAreFlags(t *testing.T) {
	known := autoscalerFlags(t)
	for _, f := range []string{"scan-interval", "nodes", "warm-pool", "azure-auth", "leader-elect-resource-name"} {
		if !known[f] {
			t.Fatalf("--help parsing lost flag %s", f)
		}
	}
	for name, values := range map[string]string{"defaults": "", "full": fullValues} {
		t.Run(name, func(t *testing.T) {
			_, cfg := configOf(t, mustRender(t, parseValues(t, values)))
			if len(cfg) == 0 {
				t.Fatal("empty config.yaml")
			}
			for k, v := range cfg {
				if !known[k] || k == "config" {
					t.Errorf("config key %q is not a flag of vmss-autoscaler", k)
				}
				if _, isMap := v.(map[string]any); isMap {
					t.Errorf("config key %q has a map value; the binary takes a value or a list", k)
				}
				if v == nil || v == "" {
					t.Errorf("config key %q rendered empty: it would override the binary's default", k)
				}
			}
		})
	}
	_, cfg := configOf(t, mustRender(t, parseValues(t, fullValues)))
	if got := fmt.Sprint(cfg["nodes"]); got != "[0:100:gpu-h100 1:50:cpu]" {
		t.Errorf("nodes = %s", got)
	}
	if cfg["scale-down-enabled"] != false || cfg["scale-down-delay-after-delete"] != float64(0) {
		t.Errorf("false and 0 must be kept: scale-down-enabled=%v scale-down-delay-after-delete=%v", cfg["scale-down-enabled"], cfg["scale-down-delay-after-delete"])
	}
	_, defaults := configOf(t, mustRender(t, nil))
	if _, ok := defaults["azure-subscription-id"]; ok {
		t.Error("an empty azure-subscription-id is rendered: it would hide $AZURE_SUBSCRIPTION_ID")
	}
}

// TestConfigAcceptedByBinary runs the binary on the rendered config.yaml,
// with the Deployment's args and env: it must get past parsing and
// validating every flag and building the Azure provider, and stop only at
// the Kubernetes client (no cluster here).
func TestConfigAcceptedByBinary(t *testing.T) {
	for name, values := range map[string]string{"defaults": "", "full": fullValues} {
		t.Run(name, func(t *testing.T) {
			r := mustRender(t, parseValues(t, values))
			raw, _ := configOf(t, r)
			dir := t.TempDir()
			file := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(file, []byte(raw), 0o600); err != nil {
				t.Fatal(err)
			}
			d := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler"))
			c := d.Spec.Template.Spec.Containers[0]
			var args []string
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--config=") {
					a = "--config=" + file
				}
				args = append(args, a)
			}
			args = append(args, "--kubeconfig="+filepath.Join(dir, "no-kubeconfig"), "--address=127.0.0.1:0")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary(t), args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
				}
			}
			if d.Spec.Template.Labels["azure.workload.identity/use"] == "true" {
				// What the workload identity webhook injects.
				tok := filepath.Join(dir, "token")
				_ = os.WriteFile(tok, []byte("x"), 0o600)
				cmd.Env = append(cmd.Env, "AZURE_FEDERATED_TOKEN_FILE="+tok, "AZURE_AUTHORITY_HOST=https://login.microsoftonline.com/")
			}
			out, err := cmd.CombinedOutput()
			t.Logf("vmss-autoscaler %s:\n%s", strings.Join(args, " "), out)
			if err == nil {
				t.Fatalf("binary ran without a cluster?\n%s", out)
			}
			if bytes.Contains(out, []byte("--config=")) {
				t.Fatalf("the binary refused the chart's config.yaml:\n%s\nconfig.yaml:\n%s", out, raw)
			}
			switch name {
			case "full":
				if !bytes.Contains(out, []byte("--kubeconfig=")) {
					t.Errorf("want the run to stop at the Kubernetes client, got:\n%s", out)
				}
			case "defaults":
				// No subscription and no node group: the provider says so.
				if !bytes.Contains(out, []byte("--azure-subscription-id")) && !bytes.Contains(out, []byte("--nodes")) {
					t.Errorf("want the provider's validation error, got:\n%s", out)
				}
			}
		})
	}
}

// TestPreflightChecksAcceptedByAgent runs `preflight --dry-run` on each
// rendered checks.yaml (commands replaced by `true` so nothing runs on this
// machine): the agent's own validation must accept the file.
func TestPreflightChecksAcceptedByAgent(t *testing.T) {
	r := mustRender(t, parseValues(t, fullValues))
	for _, name := range []string{"vmss-autoscaler-preflight-checks", "vmss-autoscaler-preflight-periodic-checks"} {
		t.Run(name, func(t *testing.T) {
			cm := decode[*corev1.ConfigMap](t, r.get(t, "ConfigMap", name))
			var cfg map[string]any
			if err := yaml.Unmarshal([]byte(cm.Data["checks.yaml"]), &cfg); err != nil {
				t.Fatal(err)
			}
			checks, _ := cfg["checks"].([]any)
			if len(checks) == 0 {
				t.Fatalf("no checks in %s", cm.Data["checks.yaml"])
			}
			var names []string
			for _, c := range checks {
				m := c.(map[string]any)
				names = append(names, m["name"].(string))
				m["command"] = []string{"true"}
			}
			if name == "vmss-autoscaler-preflight-checks" {
				for _, want := range []string{"gpus", "ecc", "xid", "dcgm", "disk", "dns"} {
					if !slices.Contains(names, want) {
						t.Errorf("default checks %v lack %s", names, want)
					}
				}
			}
			data, _ := yaml.Marshal(cfg)
			file := filepath.Join(t.TempDir(), "checks.yaml")
			if err := os.WriteFile(file, data, 0o600); err != nil {
				t.Fatal(err)
			}
			out, _ := exec.Command(binary(t), "preflight", "--dry-run", "--checks="+file).CombinedOutput()
			if bytes.Contains(out, []byte("checks file")) || !bytes.Contains(out, []byte("preflight ")) {
				t.Errorf("the agent refused %s:\n%s\n%s", name, out, data)
			}
		})
	}
}

// TestPreflightLibraryRendering: the library's entries land in checks.yaml
// in cost order (quick library checks, the chart's own, then the slow
// ones), follow their parameters, and never run periodically when slow.
// (What each rule catches is tested against the tools' output in
// preflight/agent, library_test.go.)
func TestPreflightLibraryRendering(t *testing.T) {
	type check struct {
		Name         string   `json:"name"`
		Command      []string `json:"command"`
		Timeout      string   `json:"timeout"`
		Match        string   `json:"match"`
		MinMatches   int      `json:"minMatches"`
		MustNotMatch string   `json:"mustNotMatch"`
		Min          *float64 `json:"min"`
		Max          *float64 `json:"max"`
		Retries      int      `json:"retries"`
		RetryDelay   string   `json:"retryDelay"`
	}
	checksOf := func(t *testing.T, r rendered, cm string) []check {
		t.Helper()
		var cfg struct {
			Deadline    string  `json:"deadline"`
			OutputLimit int     `json:"outputLimit"`
			Checks      []check `json:"checks"`
		}
		data := decode[*corev1.ConfigMap](t, r.get(t, "ConfigMap", cm)).Data["checks.yaml"]
		if err := yaml.UnmarshalStrict([]byte(data), &cfg); err != nil {
			t.Fatalf("%s: %v\n%s", cm, err, data)
		}
		return cfg.Checks
	}
	names := func(cs []check) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}
	byName := func(cs []check, name string) check {
		for _, c := range cs {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no check %s in %v", name, names(cs))
		return check{}
	}

	// Defaults: GPU count, ECC and XID (quick), the chart's disk and dns,
	// DCGM level 1 (seconds); InfiniBand and the all-reduce are off.
	def := checksOf(t, mustRender(t, nil), "vmss-autoscaler-preflight-checks")
	if got, want := names(def), []string{"gpus", "ecc", "xid", "disk", "dns", "dcgm"}; !slices.Equal(got, want) {
		t.Errorf("default checks %v, want %v", got, want)
	}
	if d := byName(def, "dcgm"); strings.Join(d.Command, " ") != "dcgmi diag -r 1" || d.Timeout != "2m" {
		t.Errorf("dcgm = %+v, want level 1 with a 2m timeout", d)
	}

	r := mustRender(t, parseValues(t, `
preflight:
  periodic: {enabled: true}
  library:
    gpus: {count: 4, model: "NVIDIA A100-SXM4-80GB"}
    infiniband: {enabled: true, ports: 4, rate: 200}
    dcgm: {level: 3}
    allReduce: {enabled: true, minBusBandwidth: 150.5}
`))
	all := checksOf(t, r, "vmss-autoscaler-preflight-checks")
	if got, want := names(all), []string{"gpus", "ecc", "xid", "infiniband", "disk", "dns", "dcgm", "all-reduce"}; !slices.Equal(got, want) {
		t.Errorf("checks %v, want %v", got, want)
	}
	if g := byName(all, "gpus"); g.MinMatches != 4 || g.Match != `^\s*\d+, NVIDIA A100-SXM4-80GB, ` {
		t.Errorf("gpus = %+v, want 4 matches of the A100's name, quoted", g)
	}
	if e := byName(all, "ecc"); e.MinMatches != 4 {
		t.Errorf("ecc wants %d GPUs, want gpus.count 4", e.MinMatches)
	}
	if ib := byName(all, "infiniband"); ib.MinMatches != 4 || ib.Match != `^\s*Rate: 200\s*$` {
		t.Errorf("infiniband = %+v", ib)
	}
	if d := byName(all, "dcgm"); strings.Join(d.Command, " ") != "dcgmi diag -r 3" || d.Timeout != "45m" {
		t.Errorf("dcgm = %+v, want level 3 with a 45m timeout", d)
	}
	if a := byName(all, "all-reduce"); a.Min == nil || *a.Min != 150.5 || a.Command[len(a.Command)-1] != "4" {
		t.Errorf("all-reduce = %+v, want min 150.5 on 4 GPUs", a)
	}
	// Periodically: the quick library checks and dns, never dcgm or the all-reduce.
	if got, want := names(checksOf(t, r, "vmss-autoscaler-preflight-periodic-checks")), []string{"gpus", "ecc", "xid", "infiniband", "dns"}; !slices.Equal(got, want) {
		t.Errorf("periodic checks %v, want %v", got, want)
	}
	off := mustRender(t, parseValues(t, "preflight: {periodic: {enabled: true, library: false}}"))
	if got := names(checksOf(t, off, "vmss-autoscaler-preflight-periodic-checks")); !slices.Equal(got, []string{"dns"}) {
		t.Errorf("periodic checks with library off: %v, want [dns]", got)
	}
}

// TestPriorityExpanderConfigMap: the priorities parse with the expander's
// own parser, in the ConfigMap the binary reads.
func TestPriorityExpanderConfigMap(t *testing.T) {
	r := mustRender(t, parseValues(t, fullValues))
	cm := decode[*corev1.ConfigMap](t, r.get(t, "ConfigMap", "vmss-autoscaler-priority-expander"))
	p, err := scaleup.ParsePriorities(cm.Data["priorities"])
	if err != nil {
		t.Fatalf("priorities: %v\n%s", err, cm.Data["priorities"])
	}
	if got, ok := p.PriorityOf("gpu-h100"); !ok || got != 50 {
		t.Errorf("priority of gpu-h100 = %d, %v; want 50", got, ok)
	}
	if got, ok := p.PriorityOf("cpu"); !ok || got != 10 {
		t.Errorf("priority of cpu = %d, %v; want 10", got, ok)
	}
}

// ---------------------------------------------------------------- RBAC

type grant struct {
	group, resource, verb, name string
}

func allows(rules []rbacv1.PolicyRule, g grant) bool {
	for _, r := range rules {
		if !(slices.Contains(r.APIGroups, g.group) || slices.Contains(r.APIGroups, "*")) {
			continue
		}
		if !(slices.Contains(r.Resources, g.resource) || slices.Contains(r.Resources, "*")) {
			continue
		}
		if !(slices.Contains(r.Verbs, g.verb) || slices.Contains(r.Verbs, "*")) {
			continue
		}
		if len(r.ResourceNames) > 0 && !slices.Contains(r.ResourceNames, g.name) {
			continue
		}
		return true
	}
	return false
}

func allowsURL(rules []rbacv1.PolicyRule, url, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.NonResourceURLs, url) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

var (
	// listerRE finds internal/app/informers.go's informers: factory.Core().V1().Nodes() ...
	listerRE = regexp.MustCompile(`\b(factory|nsFactory|balloonFactory)\.(\w+)\(\)\.(\w+)\(\)\.(\w+)\(\)`)
	// gvrRE finds its dynamic informers (the coscheduling PodGroup CRD).
	gvrRE = regexp.MustCompile(`GroupVersionResource\{Group: "([^"]*)", Version: "([^"]*)", Resource: "([^"]*)"\}`)
)

// informerGrants are the list/watch grants the binary's informers need,
// by scope: "cluster" (the shared factory and dynamic informers),
// "namespace" (--namespace) and "balloons" (--balloon-namespace). They are
// read from internal/app/informers.go (every factory.<Group>().<Version>().<Kind>()
// and GroupVersionResource), plus the informers the scheduler framework's
// plugins start on the shared factory (simulator.New on a fake factory).
// The leader waits for every one of them to sync before its first loop.
func informerGrants(t *testing.T) map[string][]grant {
	t.Helper()
	src, err := os.ReadFile("../internal/app/informers.go")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factories := map[string]informers.SharedInformerFactory{}
	for _, name := range []string{"factory", "nsFactory", "balloonFactory"} {
		factories[name] = informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	}
	defer func() {
		cancel()
		for _, f := range factories {
			f.Shutdown() // waits for the informers to stop
		}
	}()
	sim, err := simulator.New(ctx, factories["factory"], "nvidia.com/gpu")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sim.Close() }()
	var found []string
	for _, m := range listerRE.FindAllSubmatch(src, -1) {
		v := reflect.ValueOf(factories[string(m[1])])
		for _, method := range m[2:] {
			mv := v.MethodByName(string(method))
			if !mv.IsValid() || mv.Type().NumIn() != 0 {
				v = reflect.Value{}
				break
			}
			v = mv.Call(nil)[0]
		}
		if !v.IsValid() {
			continue // not an informer chain
		}
		if inf := v.MethodByName("Informer"); inf.IsValid() {
			inf.Call(nil)
			found = append(found, string(m[1])+"."+string(m[4]))
		}
	}
	out := map[string][]grant{}
	scope := map[string]string{"factory": "cluster", "nsFactory": "namespace", "balloonFactory": "balloons"}
	for name, f := range factories {
		f.Start(ctx.Done())
		for typ := range f.WaitForCacheSync(ctx.Done()) {
			gvks, _, err := scheme.Scheme.ObjectKinds(reflectNew(typ))
			if err != nil || len(gvks) == 0 {
				t.Fatalf("informer of %v: %v", typ, err)
			}
			plural, _ := meta.UnsafeGuessKindToResource(gvks[0])
			for _, verb := range []string{"list", "watch"} {
				out[scope[name]] = append(out[scope[name]], grant{group: plural.Group, resource: plural.Resource, verb: verb})
			}
		}
	}
	for _, m := range gvrRE.FindAllSubmatch(src, -1) {
		found = append(found, "dynamic."+string(m[3]))
		for _, verb := range []string{"list", "watch"} {
			out["cluster"] = append(out["cluster"], grant{group: string(m[1]), resource: string(m[3]), verb: verb})
		}
	}
	for _, want := range []string{"factory.Nodes", "factory.Pods", "factory.DaemonSets", "factory.PodDisruptionBudgets",
		"factory.PodGroups", "balloonFactory.Deployments", "dynamic.podgroups"} {
		if !slices.Contains(found, want) {
			t.Fatalf("internal/app/informers.go: no informer %s found (found %v); the way it builds informers changed, update this test", want, found)
		}
	}
	return out
}

// expand lists every (group, resource, verb, name) a rule set grants; name
// "" stands for every name.
func expand(rules []rbacv1.PolicyRule) []grant {
	var out []grant
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					for _, n := range names {
						out = append(out, grant{g, res, v, n})
					}
				}
			}
		}
	}
	return out
}

// covers says whether a needed grant covers a granted one: same group,
// resource and verb, and a granted name the code names (or any name, when
// the code's access is not by name).
func covers(needed, granted grant) bool {
	return needed.group == granted.group && needed.resource == granted.resource && needed.verb == granted.verb &&
		(needed.name == "" || needed.name == granted.name)
}

// TestRBACCoversTheCode: the chart grants exactly what the code does, by
// scope: every grant the code needs is there (sufficient), and every grant
// there is one the code needs, by name where the code names the object
// (nothing more). The list of what the code needs is the informers read from
// internal/app/informers.go and the scheduler framework, plus the writes listed here, each
// with the call that makes it.
func TestRBACCoversTheCode(t *testing.T) {
	src, err := os.ReadFile("../internal/app/informers.go")
	if err != nil {
		t.Fatal(err)
	}
	// The ConfigMaps cached live, each by name (configmaps.go).
	if !strings.Contains(string(src), "newNamedConfigMaps(client, c.core.Namespace, c.configMap, c.core.PriorityConfigMapName, c.core.HealthPolicyConfigMapName)") {
		t.Fatal("internal/app/informers.go: the named ConfigMap informers changed; update the ConfigMap grants below")
	}
	// ProvisioningRequests, with --enable-provisioning-requests only: their
	// informer and client (core/provreq.Client) and the PodTemplate informer.
	prSrc, err := os.ReadFile("../internal/app/provreq.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(prSrc), "provreq.NewClient(cfg, factory.Core().V1().PodTemplates().Lister(), factory.Core().V1().ResourceQuotas().Lister())") {
		t.Fatal("provreq.go: the ProvisioningRequest informers changed; update the ProvisioningRequest grants below")
	}
	// CapacityBuffers, with --enable-capacity-buffers only: their informer
	// and client (core/capacitybuffer.Client), the PodTemplate informer and
	// the scalable objects' reads.
	cbSrc, err := os.ReadFile("../internal/app/buffers.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cbSrc), "capacitybuffer.NewClient(cfg, factory.Core().V1().PodTemplates().Lister(), factory.Core().V1().ResourceQuotas().Lister(), client)") {
		t.Fatal("buffers.go: the CapacityBuffer informers changed; update the CapacityBuffer grants below")
	}
	for name, values := range map[string]string{"defaults": "", "full": fullValues, "no live config": "liveConfig: {enabled: false}",
		"buffers only": "config: {enable-capacity-buffers: true}"} {
		t.Run(name, func(t *testing.T) {
			r := mustRender(t, parseValues(t, values))
			cfg := effectiveConfigOf(t, r)
			str := func(k, def string) string {
				if v, ok := cfg[k].(string); ok && v != "" {
					return v
				}
				return def
			}
			cr := decode[*rbacv1.ClusterRole](t, r.get(t, "ClusterRole", "vmss-autoscaler"))
			role := decode[*rbacv1.Role](t, r.get(t, "Role", "vmss-autoscaler"))
			balloons := decode[*rbacv1.Role](t, r.get(t, "Role", "vmss-autoscaler-balloons"))
			if balloons.Namespace != str("balloon-namespace", "vmss-autoscaler-balloons") {
				t.Errorf("balloon Role in %s", balloons.Namespace)
			}

			needed := informerGrants(t)
			pc := str("balloon-priority-class", "vmss-autoscaler-balloon")
			needed["cluster"] = append(needed["cluster"],
				grant{"", "nodes", "get", ""}, grant{"", "nodes", "update", ""}, // taints, cordon (actuation.KubeNodeActions)
				grant{"", "pods/eviction", "create", ""},                            // drains
				grant{"", "events", "create", ""}, grant{"", "events", "patch", ""}, // the event recorder
				grant{"scheduling.k8s.io", "priorityclasses", "get", pc},            // balloon.Controller.ensurePriorityClass
				grant{"scheduling.k8s.io", "priorityclasses", "create", ""},         // ... if missing; the name by admission policy
				grant{"authentication.k8s.io", "tokenreviews", "create", ""},        // secureserve: who is calling
				grant{"authorization.k8s.io", "subjectaccessreviews", "create", ""}, // ... and may they get /metrics
			)
			status, lease := str("status-config-map-name", "vmss-autoscaler-status"), str("leader-elect-resource-name", "vmss-autoscaler")
			watched := []string{str("priority-expander-configmap", "vmss-autoscaler-priority-expander"), str("health-policy-configmap", "vmss-autoscaler-health-policy")}
			if name != "no live config" {
				watched = append(watched, "vmss-autoscaler-config") // --config-map
			}
			for _, cm := range watched {
				needed["namespace"] = append(needed["namespace"], grant{"", "configmaps", "list", cm}, grant{"", "configmaps", "watch", cm})
			}
			needed["namespace"] = append(needed["namespace"],
				grant{"", "configmaps", "get", status}, grant{"", "configmaps", "update", status}, // core.ConfigMapStatusWriter, readLastGood
				grant{"", "configmaps", "create", ""},                                                                         // ... the first time; the name by admission policy
				grant{"coordination.k8s.io", "leases", "get", lease}, grant{"coordination.k8s.io", "leases", "update", lease}, // leader election
				grant{"coordination.k8s.io", "leases", "create", ""}, // ... the first time; the name by admission policy
			)
			for _, verb := range []string{"create", "update", "delete"} { // balloon.Controller: create, resize, prune
				needed["balloons"] = append(needed["balloons"], grant{"apps", "deployments", verb, ""})
			}
			if on, _ := cfg["enable-provisioning-requests"].(bool); on {
				needed["cluster"] = append(needed["cluster"],
					grant{"autoscaling.x-k8s.io", "provisioningrequests", "list", ""}, grant{"autoscaling.x-k8s.io", "provisioningrequests", "watch", ""}, // provreq.Client's informer
					grant{"autoscaling.x-k8s.io", "provisioningrequests", "delete", ""},           // provreq.Client.Delete: finished a week ago
					grant{"autoscaling.x-k8s.io", "provisioningrequests/status", "update", ""},    // provreq.Client.UpdateStatus
					grant{"", "podtemplates", "list", ""}, grant{"", "podtemplates", "watch", ""}, // the pod sets' templates
					grant{"", "resourcequotas", "list", ""}, grant{"", "resourcequotas", "watch", ""}, // the quotas requests are held within
				)
			}
			if on, _ := cfg["enable-capacity-buffers"].(bool); on {
				needed["cluster"] = append(needed["cluster"],
					grant{"autoscaling.x-k8s.io", "capacitybuffers", "list", ""}, grant{"autoscaling.x-k8s.io", "capacitybuffers", "watch", ""}, // capacitybuffer.Client's informer
					grant{"autoscaling.x-k8s.io", "capacitybuffers/status", "update", ""},         // capacitybuffer.Client.UpdateStatus
					grant{"", "podtemplates", "list", ""}, grant{"", "podtemplates", "watch", ""}, // podTemplateRef
					grant{"", "resourcequotas", "list", ""}, grant{"", "resourcequotas", "watch", ""}, // the quotas capping chunks
					grant{"apps", "deployments", "get", ""}, grant{"apps", "statefulsets", "get", ""}, grant{"apps", "replicasets", "get", ""}, // scalableRef (clientsetScalable)
					grant{"batch", "jobs", "get", ""},
				)
			}

			for scope, rules := range map[string][]rbacv1.PolicyRule{"cluster": cr.Rules, "namespace": role.Rules, "balloons": balloons.Rules} {
				for _, g := range needed[scope] {
					if !allows(rules, g) {
						t.Errorf("%s RBAC lacks %+v, which the code needs", scope, g)
					}
				}
				for _, g := range expand(rules) {
					if !slices.ContainsFunc(needed[scope], func(n grant) bool { return covers(n, g) }) {
						t.Errorf("%s RBAC grants %+v, which the code never needs", scope, g)
					}
				}
				for _, rule := range rules {
					if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
						t.Errorf("wildcard rule %+v", rule)
					}
					for _, u := range rule.NonResourceURLs {
						if scope != "cluster" || u != "/metrics" || !slices.Equal(rule.Verbs, []string{"get"}) {
							t.Errorf("non-resource rule %+v: only get /metrics (adaptive rate) is needed", rule)
						}
					}
				}
			}
			if !allowsURL(cr.Rules, "/metrics", "get") {
				t.Error("ClusterRole lacks get on /metrics (adaptive rate: flow-control rejections)")
			}
			// The names RBAC cannot limit are limited by the admission policy.
			vap := r.get(t, "ValidatingAdmissionPolicy", "vmss-autoscaler-own-objects")
			for _, n := range []string{status, lease, pc, "system:serviceaccount:kube-system:vmss-autoscaler"} {
				if !strings.Contains(vap.raw, n) {
					t.Errorf("admission policy vmss-autoscaler-own-objects does not name %q:\n%s", n, vap.raw)
				}
			}

			// The agent: exactly preflight/agent/RBAC.md.
			agent := decode[*rbacv1.ClusterRole](t, r.get(t, "ClusterRole", "vmss-autoscaler-preflight"))
			want := []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "update"}},
				{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
			}
			if !slices.EqualFunc(agent.Rules, want, func(a, b rbacv1.PolicyRule) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) {
				t.Errorf("agent ClusterRole rules = %+v, want %+v", agent.Rules, want)
			}
			for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
				for _, o := range r.ofKind(kind) {
					if !strings.Contains(o.raw, "kind: ServiceAccount") {
						t.Errorf("%s %s binds no ServiceAccount", kind, o.name())
					}
				}
			}
		})
	}
}

// The exactness check above fails on a grant the code does not need.
func TestRBACCheckCatchesExtraGrants(t *testing.T) {
	needed := []grant{{"", "configmaps", "list", "mine"}, {"", "nodes", "update", ""}}
	for _, tc := range []struct {
		granted grant
		ok      bool
	}{
		{grant{"", "configmaps", "list", "mine"}, true},
		{grant{"", "configmaps", "list", ""}, false}, // every ConfigMap, where the code lists one
		{grant{"", "configmaps", "list", "other"}, false},
		{grant{"", "nodes", "update", "n1"}, true},
		{grant{"", "nodes", "delete", ""}, false},
	} {
		if got := slices.ContainsFunc(needed, func(n grant) bool { return covers(n, tc.granted) }); got != tc.ok {
			t.Errorf("covered(%+v) = %v, want %v", tc.granted, got, tc.ok)
		}
	}
}

// TestBalloonNamespace: the chart creates the balloon namespace with Pod
// Security "restricted", with or without balloons.enabled (the balloon Role
// is there either way); with createNamespace false only when told that the
// namespace made by hand enforces restricted.
func TestBalloonNamespace(t *testing.T) {
	for _, tc := range []struct{ name, values, ns string }{
		{"defaults", "", "vmss-autoscaler-balloons"},
		{"no balloons", "balloons: {enabled: false}", "vmss-autoscaler-balloons"},
		{"configured", "config: {balloon-namespace: warm}", "warm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRender(t, parseValues(t, tc.values))
			ns := decode[*corev1.Namespace](t, r.get(t, "Namespace", tc.ns))
			for _, k := range []string{"enforce", "audit", "warn"} {
				if got := ns.Labels["pod-security.kubernetes.io/"+k]; got != "restricted" {
					t.Errorf("namespace label pod-security.kubernetes.io/%s = %q, want restricted", k, got)
				}
			}
			if role := r.get(t, "Role", "vmss-autoscaler-balloons"); role.namespace() != tc.ns {
				t.Errorf("balloon Role in %s, want %s", role.namespace(), tc.ns)
			}
		})
	}
	t.Run("made by hand, asserted restricted", func(t *testing.T) {
		r := mustRender(t, parseValues(t, "balloons: {createNamespace: false, namespacePodSecurityEnforced: true}"))
		if got := r.ofKind("Namespace"); len(got) != 0 {
			t.Errorf("Namespace %s rendered", got[0].name())
		}
	})
}

// TestBalloonNamespaceRefused: the chart fails, naming the value and why,
// when the balloon namespace would widen what the autoscaler's token may do
// (it may create Deployments there): kube-system, the release namespace,
// or one whose Pod Security would not enforce restricted. The binary
// refuses the same at start (balloon.Options.ValidateNamespace,
// CheckNamespaceAtStart).
func TestBalloonNamespaceRefused(t *testing.T) {
	for _, tc := range []struct{ name, values, want string }{
		{"kube-system, installed elsewhere", "config: {balloon-namespace: kube-system}",
			"config.balloon-namespace: must not be kube-system: the autoscaler may create and update Deployments in the balloon namespace, and a Deployment in kube-system may run as any ServiceAccount there (cluster-admin)"},
		{"kube-system without balloons", "balloons: {enabled: false}\nconfig: {balloon-namespace: kube-system}", "config.balloon-namespace: must not be kube-system"},
		{"kube-system not created", "balloons: {createNamespace: false, namespacePodSecurityEnforced: true}\nconfig: {balloon-namespace: kube-system}",
			"config.balloon-namespace: must not be kube-system"},
		{"the release namespace", "config: {balloon-namespace: autoscaling}",
			"config.balloon-namespace: must not be the release namespace autoscaling: the autoscaler may create and update Deployments in the balloon namespace, and a Deployment there may run as the autoscaler's own ServiceAccount"},
		{"a lower Pod Security level", "balloons: {podSecurity: baseline}",
			"balloons.podSecurity: must be restricted, got baseline: whoever holds the autoscaler's token may create Deployments in config.balloon-namespace (vmss-autoscaler-balloons)"},
		{"privileged", "balloons: {podSecurity: privileged}", "balloons.podSecurity: must be restricted, got privileged"},
		{"not created, not asserted", "balloons: {createNamespace: false}",
			"balloons.createNamespace is false, so the chart cannot label config.balloon-namespace (vmss-autoscaler-balloons) with pod-security.kubernetes.io/enforce=restricted. Label it yourself (kubectl label namespace vmss-autoscaler-balloons pod-security.kubernetes.io/enforce=restricted) and set balloons.namespacePodSecurityEnforced: true"},
		{"not created, asserted false", "balloons: {createNamespace: false, namespacePodSecurityEnforced: false}", "balloons.namespacePodSecurityEnforced: true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Installed in "autoscaling", so that kube-system and the
			// release namespace are told apart.
			_, err := renderIn(t, parseValues(t, tc.values), "autoscaling")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	// Installed in kube-system (the chart tests' namespace, and a common
	// choice), balloons there are refused too.
	if _, err := render(t, parseValues(t, "config: {balloon-namespace: kube-system}")); err == nil || !strings.Contains(err.Error(), "config.balloon-namespace: must not be kube-system") {
		t.Errorf("render in kube-system with balloons there: error = %v, want the refusal", err)
	}
}

// TestAdmissionPolicies: the policies and their bindings, for the chart's
// ServiceAccounts and names; off with admissionPolicies.enabled false (and
// the preflight agent off).
// e2e TestPreflightAgentOwnNodeOnly proves them on the API server.
func TestAdmissionPolicies(t *testing.T) {
	r := mustRender(t, parseValues(t, fullValues))
	own := r.get(t, "ValidatingAdmissionPolicy", "vmss-autoscaler-preflight-own-node")
	for _, s := range []string{"system:serviceaccount:kube-system:vmss-autoscaler-preflight", "authentication.kubernetes.io/node-name",
		`\"example.com/burn-in\"`, "vmss-autoscaler.io/preflight-failure", "vmss-autoscaler.io/preflight-passed-at"} {
		if !strings.Contains(own.raw, s) {
			t.Errorf("preflight policy does not name %s:\n%s", s, own.raw)
		}
	}
	all := []string{"vmss-autoscaler-preflight-own-node", "vmss-autoscaler-own-objects", "vmss-autoscaler-autoscaler-nodes",
		"vmss-autoscaler-balloon-deployments", "vmss-autoscaler-balloon-priority-class"}
	for _, name := range all {
		p := decode[*admissionregistrationv1.ValidatingAdmissionPolicy](t, r.get(t, "ValidatingAdmissionPolicy", name))
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail || len(p.Spec.Validations) == 0 {
			t.Errorf("policy %s: failurePolicy %v, %d validations", name, p.Spec.FailurePolicy, len(p.Spec.Validations))
		}
		b := r.get(t, "ValidatingAdmissionPolicyBinding", name)
		if !strings.Contains(b.raw, "policyName: "+name) || !strings.Contains(b.raw, "[Deny]") {
			t.Errorf("binding %s:\n%s", name, b.raw)
		}
	}
	// The autoscaler's own policies match its ServiceAccount and name what
	// its code writes (e2e TestSecurityAutoscalerNodeWritesHeld,
	// TestSecurityBalloonDeploymentPinned, TestSecurityBalloonPriorityClassPinned
	// prove them on the API server).
	for name, want := range map[string][]string{
		"vmss-autoscaler-autoscaler-nodes": {"ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler",
			"'NoSchedule'", "'PreferNoSchedule'", `\"vmss-autoscaler.io/cordoned\"`},
		"vmss-autoscaler-balloon-deployments": {`== "registry.k8s.io/pause:3.10"`, `== "warm-balloons"`, `.name == "pause"`,
			"automountServiceAccountToken", "volumes", "command", "limits"},
		"vmss-autoscaler-balloon-priority-class": {`object.metadata.name == "warm-balloons"`, "object.value == -1000", "'Never'", "globalDefault"},
	} {
		raw := r.get(t, "ValidatingAdmissionPolicy", name).raw
		for _, s := range append(want, `request.userInfo.username == "system:serviceaccount:kube-system:vmss-autoscaler"`) {
			if !strings.Contains(raw, s) {
				t.Errorf("policy %s does not name %s:\n%s", name, s, raw)
			}
		}
		if strings.Contains(raw, "balloonMaxResources") {
			t.Errorf("policy %s has a balloon ceiling without admissionPolicies.balloonMaxResources", name)
		}
	}
	// The balloon image and the ceilings follow the values.
	cv := parseValues(t, fullValues)
	cv["config"].(map[string]any)["balloon-image"] = "example.azurecr.io/pause:3.10"
	cv["admissionPolicies"] = map[string]any{"balloonMaxResources": map[string]any{"nvidia.com/gpu": 8, "cpu": "96", "memory": "1800Gi"}}
	capped := mustRender(t, cv)
	raw := capped.get(t, "ValidatingAdmissionPolicy", "vmss-autoscaler-balloon-deployments").raw
	for _, s := range []string{`== "example.azurecr.io/pause:3.10"`, "(cpu=96, memory=1800Gi, nvidia.com/gpu=8)",
		`{\"cpu\":\"96\",\"memory\":\"1800Gi\",\"nvidia.com/gpu\":\"8\"}`} {
		if !strings.Contains(raw, s) {
			t.Errorf("balloon Deployment policy with ceilings does not name %s:\n%s", s, raw)
		}
	}
	// Without balloons the autoscaler writes no Deployment and no
	// PriorityClass: only its node policy is added.
	nb := mustRender(t, parseValues(t, "balloons: {enabled: false}"))
	if _, ok := nb.find("ValidatingAdmissionPolicy", "vmss-autoscaler-autoscaler-nodes"); !ok {
		t.Error("no node policy without balloons")
	}
	for _, name := range []string{"vmss-autoscaler-balloon-deployments", "vmss-autoscaler-balloon-priority-class"} {
		if _, ok := nb.find("ValidatingAdmissionPolicy", name); ok {
			t.Errorf("policy %s rendered without balloons", name)
		}
	}
	// Off only with the preflight agent off (TestTemplateRejectsBadValues).
	off := mustRender(t, parseValues(t, "admissionPolicies: {enabled: false}\npreflight: {enabled: false}"))
	if n := len(off.ofKind("ValidatingAdmissionPolicy")) + len(off.ofKind("ValidatingAdmissionPolicyBinding")); n != 0 {
		t.Errorf("%d admission objects with admissionPolicies.enabled false", n)
	}
}

// ---------------------------------------------------------------- metrics

// touch creates one child of a vector, whatever its number of labels.
func touch(get func(...string) error) error {
	var err error
	for n := 0; n <= 8; n++ {
		lv := make([]string, n)
		for i := range lv {
			lv[i] = "x"
		}
		if err = get(lv...); err == nil {
			return nil
		}
	}
	return err
}

var mainMetricRE = regexp.MustCompile(`Name:\s*"(vmss_autoscaler_[a-z0-9_]+)"`)

// exportedMetrics is the allow-list: every series name the binary exports,
// from its real registry: core.NewMetrics, the VMSS provider's ARM metrics
// (through vmss.New, as internal/app builds it), the Kubernetes clients'
// request metrics, the Go and process collectors and the gauges the wiring
// defines, plus Prometheus' own `up`.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec := &promrec.Recorder{Reg: reg}
	core.NewMetrics(rec)
	prov, err := vmss.New(vmss.Config{
		SubscriptionID: "00000000-0000-0000-0000-000000000001",
		ResourceGroups: []string{"rg"},
		NodeGroups:     []cloudprovider.NodeGroupSpec{{Min: 0, Max: 1, Name: "ng"}},
		Auth:           vmss.AuthTokenFile,
		TokenFile:      filepath.Join(t.TempDir(), "token"),
		Registerer:     rec,
	})
	if err != nil {
		t.Fatalf("vmss.New: %v", err)
	}
	prov.Close()

	// The wiring registers the Go and process collectors and its own
	// gauges (internal/app/configure.go); read them from its source so a
	// rename there breaks this test too.
	src, err := os.ReadFile("../internal/app/configure.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"collectors.NewGoCollector()", "collectors.NewProcessCollector(", "clientmetrics.New(reg)"} {
		if !bytes.Contains(src, []byte(c)) {
			t.Fatalf("internal/app/configure.go no longer registers %s; update the allow-list", c)
		}
	}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	clientmetrics.New(rec) // the Kubernetes clients' rest_client_* metrics
	mainGauges := mainMetricRE.FindAllSubmatch(src, -1)
	if len(mainGauges) == 0 {
		t.Fatal("found no vmss_autoscaler_ metric defined in internal/app/configure.go (vmss_autoscaler_apiserver_metrics_readable)")
	}
	for _, m := range mainGauges {
		rec.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: string(m[1]), Help: "internal/app"}))
	}

	for _, c := range rec.Collectors {
		var err error
		switch v := c.(type) {
		case *prometheus.CounterVec:
			err = touch(func(lv ...string) error { _, err := v.GetMetricWithLabelValues(lv...); return err })
		case *prometheus.GaugeVec:
			err = touch(func(lv ...string) error { _, err := v.GetMetricWithLabelValues(lv...); return err })
		case *prometheus.HistogramVec:
			err = touch(func(lv ...string) error { _, err := v.GetMetricWithLabelValues(lv...); return err })
		case *prometheus.SummaryVec:
			err = touch(func(lv ...string) error { _, err := v.GetMetricWithLabelValues(lv...); return err })
		}
		if err != nil {
			t.Fatalf("touching %T: %v", c, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{"up": true}
	var own int
	for _, f := range families {
		n := f.GetName()
		if strings.HasPrefix(n, "vmss_autoscaler_") {
			own++
		}
		names[n] = true
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[n+"_sum"], names[n+"_count"] = true, true
		}
	}
	if own < 40 {
		t.Fatalf("only %d vmss_autoscaler_ families gathered", own)
	}
	for _, n := range []string{"vmss_autoscaler_phase_duration_seconds_bucket", "vmss_autoscaler_arm_throttled_until_seconds",
		"vmss_autoscaler_apiserver_metrics_readable", "process_resident_memory_bytes"} {
		if !names[n] {
			t.Fatalf("allow-list lacks %s", n)
		}
	}
	return names
}

var (
	rangeVarRE   = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)
	grafanaVarRE = regexp.MustCompile(`\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?`)
	labelValsRE  = regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
)

// grafanaToPromQL replaces Grafana's variables: range intervals by 5m,
// other variables (only used inside label matchers) by ".*".
func grafanaToPromQL(expr string) string {
	expr = rangeVarRE.ReplaceAllString(expr, "5m")
	return grafanaVarRE.ReplaceAllString(expr, ".*")
}

// promQLProblems parses expr and returns what is wrong with it: a parse
// error, a selected metric the binary does not export, no metric at all.
func promQLProblems(expr string, allowed map[string]bool) []string {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return []string{fmt.Sprintf("%q does not parse: %v", expr, err)}
	}
	var problems []string
	var selectors int
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		if !allowed[name] {
			problems = append(problems, fmt.Sprintf("metric %q is not exported by vmss-autoscaler (in %q)", name, expr))
		}
		return nil
	})
	if selectors == 0 {
		problems = append(problems, fmt.Sprintf("%q selects no metric", expr))
	}
	return problems
}

func checkPromQL(t *testing.T, where, expr string, allowed map[string]bool) {
	t.Helper()
	for _, p := range promQLProblems(expr, allowed) {
		t.Errorf("%s: %s", where, p)
	}
}

func TestDashboardsPromQL(t *testing.T) {
	allowed := exportedMetrics(t)
	r := mustRender(t, parseValues(t, fullValues))
	var checked int
	for _, o := range r.ofKind("ConfigMap") {
		if !strings.Contains(o.name(), "-dashboard-") {
			continue
		}
		cm := decode[*corev1.ConfigMap](t, o)
		for key, data := range cm.Data {
			var dash struct {
				UID        string `json:"uid"`
				Title      string `json:"title"`
				Templating struct {
					List []struct {
						Name  string `json:"name"`
						Type  string `json:"type"`
						Query any    `json:"query"`
					} `json:"list"`
				} `json:"templating"`
				Panels []struct {
					Type    string `json:"type"`
					Title   string `json:"title"`
					Targets []struct {
						Expr string `json:"expr"`
					} `json:"targets"`
				} `json:"panels"`
			}
			if err := json.Unmarshal([]byte(data), &dash); err != nil {
				t.Errorf("%s/%s: not JSON: %v", cm.Name, key, err)
				continue
			}
			if dash.UID == "" || dash.Title == "" || len(dash.Panels) == 0 {
				t.Errorf("%s: no uid, title or panels", key)
			}
			for _, p := range dash.Panels {
				if p.Type == "row" {
					continue
				}
				if len(p.Targets) == 0 {
					t.Errorf("%s: panel %q has no query", key, p.Title)
				}
				for _, tg := range p.Targets {
					checkPromQL(t, key+": "+p.Title, grafanaToPromQL(tg.Expr), allowed)
					checked++
				}
			}
			for _, v := range dash.Templating.List {
				if v.Type != "query" {
					continue
				}
				q := ""
				switch x := v.Query.(type) {
				case string:
					q = x
				case map[string]any:
					q, _ = x["query"].(string)
				}
				m := labelValsRE.FindStringSubmatch(q)
				if m == nil {
					t.Errorf("%s: variable %s query %q is not label_values(<selector>, <label>)", key, v.Name, q)
					continue
				}
				checkPromQL(t, key+": variable "+v.Name, grafanaToPromQL(m[1]), allowed)
			}
		}
	}
	if checked < 40 {
		t.Errorf("only %d dashboard queries checked", checked)
	}
}

func TestAlertsPromQL(t *testing.T) {
	allowed := exportedMetrics(t)
	r := mustRender(t, parseValues(t, fullValues))
	pr := r.get(t, "PrometheusRule", "vmss-autoscaler")
	groups, _ := yamlPath(pr.m, "spec", "groups").([]any)
	if len(groups) == 0 {
		t.Fatalf("PrometheusRule has no groups:\n%s", pr.raw)
	}
	var alerts []string
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, ru := range rules {
			rule := ru.(map[string]any)
			name, _ := rule["alert"].(string)
			expr, _ := rule["expr"].(string)
			if name == "" || expr == "" {
				t.Errorf("rule without alert or expr: %v", rule)
				continue
			}
			alerts = append(alerts, name)
			checkPromQL(t, name, expr, allowed)
			if !strings.Contains(expr, `job="vmss-autoscaler"`) {
				t.Errorf("%s does not select the Service's job: %s", name, expr)
			}
			labels, _ := rule["labels"].(map[string]any)
			if labels["severity"] == nil || labels["team"] != "infra" {
				t.Errorf("%s labels = %v, want severity and prometheusRule.additionalLabels", name, labels)
			}
			ann, _ := rule["annotations"].(map[string]any)
			if ann["summary"] == nil {
				t.Errorf("%s has no summary", name)
			}
			if f, _ := rule["for"].(string); f != "" {
				if _, err := parser.NewParser(parser.Options{}).ParseExpr("up[" + f + "]"); err != nil {
					t.Errorf("%s: for %q is not a duration", name, f)
				}
			}
		}
	}
	for _, want := range []string{"VMSSAutoscalerDown", "VMSSAutoscalerNoSuccessfulLoop", "VMSSAutoscalerNodeGroupBackoff",
		"VMSSAutoscalerClusterUnhealthy", "VMSSAutoscalerReplacementBrakeEngaged", "VMSSAutoscalerPreflightIncident", "VMSSAutoscalerConfigFallback",
		"VMSSAutoscalerARMThrottled", "VMSSAutoscalerPreflightFailureRate", "VMSSAutoscalerScaleDownBrakeEngaged",
		"VMSSAutoscalerNodeAdditionQueueStuck", "VMSSAutoscalerConfigRejected", "VMSSAutoscalerConfigRestartRequired"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s; have %v", want, alerts)
		}
	}
}

// TestPromQLCheckCatchesRenames: the checker itself refuses a metric the
// binary does not export and an expression that does not parse.
func TestPromQLCheckCatchesRenames(t *testing.T) {
	allowed := exportedMetrics(t)
	for _, bad := range []string{
		`vmss_autoscaler_loop_duration_seconds_bucket_total`,
		`sum(rate(vmss_autoscaler_scaleups_total[5m]))`,
		`{__name__="vmss_autoscaler_no_such_metric"}`,
		`sum(rate(vmss_autoscaler_scale_ups_total[5m])`,
	} {
		if len(promQLProblems(bad, allowed)) == 0 {
			t.Errorf("promQLProblems accepted %q", bad)
		}
	}
	if p := promQLProblems(`sum(rate(vmss_autoscaler_scale_ups_total[5m]))`, allowed); len(p) != 0 {
		t.Errorf("promQLProblems refused a good expression: %v", p)
	}
}

// reflectNew returns a new object of an informer's type (*v1.Node, ...).
func reflectNew(typ reflect.Type) runtime.Object {
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	return reflect.New(typ).Interface().(runtime.Object)
}
