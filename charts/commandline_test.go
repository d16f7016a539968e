package charts

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

var commandLineOnlyRE = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-zA-Z0-9][a-zA-Z0-9_-]*)[^\n]*\(command line only: `)

// commandLineOnlyFlags are the flags the binary's --help marks command
// line only: it refuses them in the flags ConfigMap and --config file.
func commandLineOnlyFlags(t *testing.T) []string {
	t.Helper()
	out, _ := exec.Command(binary(t), "--help").CombinedOutput() // --help exits 1
	var names []string
	for _, m := range commandLineOnlyRE.FindAllStringSubmatch(string(out), -1) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		t.Fatalf("--help marks no flag command line only:\n%s", out)
	}
	sort.Strings(names)
	return slices.Compact(names) // the usage may be printed twice
}

// commandLineOnlyExamples are values the schema accepts for each.
var commandLineOnlyExamples = map[string]any{
	"azure-arm-endpoint":           "https://management.example",
	"azure-authority-host":         "https://login.example/",
	"azure-token-audience":         "https://management.example",
	"azure-ca-file":                "/etc/vmss-autoscaler-ca/ca.pem",
	"azure-token-file":             "/var/run/secrets/arm/token",
	"azure-client-secret-file":     "/var/run/secrets/sp/secret",
	"azure-auth":                   "client-secret",
	"azure-tenant-id":              "00000000-0000-0000-0000-000000000002",
	"azure-client-id":              "00000000-0000-0000-0000-000000000003",
	"azure-subscription-id":        "00000000-0000-0000-0000-000000000001",
	"kubeconfig":                   "/etc/kubernetes/autoscaler.kubeconfig",
	"balloon-image":                "registry.example/pause:3.10",
	"balloon-max-replicas":         32,
	"leader-elect":                 true,
	"leader-elect-lease-duration":  "15s",
	"leader-elect-renew-deadline":  "10s",
	"leader-elect-retry-period":    "2s",
	"leader-elect-resource-name":   "vmss-autoscaler",
	"enable-provisioning-requests": true,
	"enable-capacity-buffers":      true,
	"log_dir":                      "/tmp/logs",
	"log_file":                     "/tmp/logs/vmss-autoscaler.log",
	"log_file_max_size":            "1800",
	"logtostderr":                  false,
	"alsologtostderr":              true,
	"one_output":                   true,
	"stderrthreshold":              "2",
}

// TestCommandLineOnlyKeysAreArguments: the chart's list of command-line-only
// keys is the binary's; those keys of values `config` become the
// Deployment's arguments and never reach the flags ConfigMap, which the
// binary would refuse whole (and whose editors would choose where the Azure
// credential goes).
func TestCommandLineOnlyKeysAreArguments(t *testing.T) {
	marked := commandLineOnlyFlags(t)
	helpers, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`define "vmss-autoscaler.commandLineOnlyKeys" -}}\n([^\n{]*)\n`).FindSubmatch(helpers)
	if m == nil {
		t.Fatal("_helpers.tpl defines no vmss-autoscaler.commandLineOnlyKeys")
	}
	chartKeys := strings.Fields(string(m[1]))
	sort.Strings(chartKeys)
	if !slices.Equal(chartKeys, marked) {
		t.Fatalf("the chart's command-line-only keys %q, the binary's %q", chartKeys, marked)
	}

	config := map[string]any{"scan-interval": "20s", "azure-resource-groups": []any{"rg-gpu"}}
	for _, k := range marked {
		v, ok := commandLineOnlyExamples[k]
		if !ok {
			t.Fatalf("--%s: add an example value to commandLineOnlyExamples", k)
		}
		config[k] = v
	}
	for name, values := range map[string]map[string]any{
		"every key":   {"config": config},
		"live off":    {"config": config, "liveConfig": map[string]any{"enabled": false}},
		"the default": nil,
	} {
		t.Run(name, func(t *testing.T) {
			r := mustRender(t, values)
			raw, cfg := configOf(t, r)
			for _, k := range marked {
				if _, ok := cfg[k]; ok {
					t.Errorf("config.yaml has %s: the binary refuses it there\n%s", k, raw)
				}
			}
			c := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler")).Spec.Template.Spec.Containers[0]
			checkArgs(t, "Deployment", c.Args, autoscalerFlags(t))
			// values.yaml's
			want := map[string]any{"azure-auth": "default", "enable-provisioning-requests": false, "enable-capacity-buffers": false}
			if values != nil {
				want = commandLineOnlyExamples
				for _, k := range []string{"scan-interval", "azure-resource-groups"} {
					if _, ok := cfg[k]; !ok {
						t.Errorf("config.yaml lacks %s, which is no command-line-only key\n%s", k, raw)
					}
				}
			}
			for k, v := range want {
				if n := countArgs(c.Args, "--"+k+"="); n != 1 || !slices.Contains(c.Args, fmt.Sprintf("--%s=%v", k, v)) {
					t.Errorf("args %q: want --%s=%s once", c.Args, k, v)
				}
			}
			for _, k := range marked {
				if _, ok := want[k]; !ok && countArgs(c.Args, "--"+k+"=") > 0 {
					t.Errorf("args %q: --%s not set in values", c.Args, k)
				}
			}
		})
	}
	// An empty value is left out, as in config.yaml: the binary's default
	// ($AZURE_SUBSCRIPTION_ID) applies.
	r := mustRender(t, map[string]any{"config": map[string]any{"azure-subscription-id": "", "balloon-image": nil}})
	c := decode[*appsv1.Deployment](t, r.get(t, "Deployment", "vmss-autoscaler")).Spec.Template.Spec.Containers[0]
	if countArgs(c.Args, "--azure-subscription-id") > 0 || countArgs(c.Args, "--balloon-image") > 0 {
		t.Errorf("args %q: an empty value is passed", c.Args)
	}
}

func countArgs(args []string, prefix string) int {
	n := 0
	for _, a := range args {
		if strings.HasPrefix(a, prefix) {
			n++
		}
	}
	return n
}
