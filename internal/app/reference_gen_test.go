package app

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss"
	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/clientmetrics"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/secureserve"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/promrec"
)

// The references of docs/reference, generated from the code (#43): the
// flags as --help defines them, the metrics as the registry holds them.
// TestReferencesUpToDate fails when the committed pages drift;
// `go test ./internal/app -run TestReferencesUpToDate -update` writes them.

const generatedNote = "<!-- Generated from the code by `go test ./internal/app -run TestReferencesUpToDate -update`; do not edit. -->\n\n"

// FlagsReference is docs/reference/flags.md: every flag of the autoscaler
// (the provider's and klog's included), in --help's order, with its
// default and when a new value takes effect.
func FlagsReference() string {
	c := &config{}
	fs := newFlagSet(c)
	var p providerFlags
	p.register(fs)
	newKlogFlags().addReal(fs)
	var b strings.Builder
	b.WriteString("# Flags\n\n" + generatedNote)
	b.WriteString("Each flag may also be a key of the `--config` file or of the flags ConfigMap (`--config-map`), but those marked command line only. " +
		"**live**: a new value in the flags ConfigMap takes effect at the next loop; **restart**: it needs a restart (it is bound to informers, " +
		"clients or objects made at start); **command line only**: refused in the file and the ConfigMap, with why.\n\n")
	b.WriteString("| flag | default | takes effect | what it does |\n|---|---|---|---|\n")
	fs.VisitAll(func(f *pflag.Flag) {
		when := "restart"
		switch {
		case commandLineOnly[f.Name] != "":
			when = "command line only"
		case isLive(f):
			when = "live"
		}
		def := f.DefValue
		if def == "" || def == "[]" {
			def = "—"
		} else {
			def = "`" + def + "`"
		}
		usage, _, _ := strings.Cut(f.Usage, " (command line only: ")
		if why := commandLineOnly[f.Name]; why != "" {
			usage += " (" + why + ")"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s |\n", f.Name, def, when, mdCell(usage))
	})
	return b.String()
}

// MetricsReference is docs/reference/metrics.md: every series the binary
// exports but Go's and the process's (go_*, process_*): the loop's
// (core.NewMetrics), the Azure provider's, the Kubernetes clients'
// (rest_client_*) and the wiring's own gauge.
func MetricsReference(tempDir string) (string, error) {
	rec := promrec.New()
	core.NewMetrics(rec)
	prov, err := vmss.New(vmss.Config{
		SubscriptionID: "00000000-0000-0000-0000-000000000001", ResourceGroups: []string{"rg"},
		NodeGroups: []cloudprovider.NodeGroupSpec{{Min: 0, Max: 1, Name: "ng"}},
		Auth:       vmss.AuthTokenFile, TokenFile: filepath.Join(tempDir, "token"), Registerer: rec,
	})
	if err != nil {
		return "", fmt.Errorf("building the provider for its metrics: %w", err)
	}
	prov.Close()
	clientmetrics.New(rec)
	if _, _, err := secureserve.Delegating(fake.NewClientset(), secureserve.ReviewOptions{Registerer: rec}); err != nil {
		return "", fmt.Errorf("the secure listener's review metrics: %w", err)
	}
	rec.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "vmss_autoscaler_apiserver_metrics_readable", Help: apiserverMetricsReadableHelp}))
	type row struct{ name, typ, labels, help string }
	var rows []row
	for _, c := range rec.Collectors {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			name, help, labels := parseDesc(d)
			typ, err := metricType(c, labels)
			if err != nil {
				return "", fmt.Errorf("metric %s: %w", name, err)
			}
			rows = append(rows, row{name, typ, labels, help})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	var b strings.Builder
	b.WriteString("# Metrics\n\n" + generatedNote)
	b.WriteString("Every series `/metrics` serves but Go's and the process's own (`go_*`, `process_*`).\n\n")
	b.WriteString("| metric | type | labels | what it counts |\n|---|---|---|---|\n")
	for _, r := range rows {
		labels := "—"
		if r.labels != "" {
			labels = "`" + strings.ReplaceAll(r.labels, ",", "`, `") + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.name, r.typ, labels, mdCell(r.help))
	}
	return b.String(), nil
}

var descRE = regexp.MustCompile(`fqName: "([^"]*)", help: "((?:[^"\\]|\\.)*)",(?: unit: "[^"]*",)? constLabels: \{[^}]*\}, variableLabels: \{([^}]*)\}`)

// parseDesc reads a Desc's name, help and variable labels (its String:
// the client library exports no getters).
func parseDesc(d *prometheus.Desc) (name, help, labels string) {
	m := descRE.FindStringSubmatch(d.String())
	if m == nil {
		return d.String(), "", "?"
	}
	return m[1], strings.ReplaceAll(m[2], `\"`, `"`), m[3]
}

// metricType is a collector's metric type, from what it exports once each
// label has a value.
func metricType(c prometheus.Collector, labels string) (string, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		return "", err
	}
	var lv []string
	if labels != "" {
		for range strings.Split(labels, ",") {
			lv = append(lv, "x")
		}
	}
	switch v := c.(type) {
	case *prometheus.CounterVec:
		v.WithLabelValues(lv...)
	case *prometheus.GaugeVec:
		v.WithLabelValues(lv...)
	case *prometheus.HistogramVec:
		v.WithLabelValues(lv...)
	case *prometheus.SummaryVec:
		v.WithLabelValues(lv...)
	}
	mfs, err := reg.Gather()
	if err != nil {
		return "", err
	}
	if len(mfs) == 0 {
		return "", fmt.Errorf("%T exports nothing", c)
	}
	switch mfs[0].GetType() {
	case dto.MetricType_COUNTER:
		return "counter", nil
	case dto.MetricType_GAUGE:
		return "gauge", nil
	case dto.MetricType_HISTOGRAM:
		return "histogram", nil
	case dto.MetricType_SUMMARY:
		return "summary", nil
	}
	return strings.ToLower(mfs[0].GetType().String()), nil
}

// mdCell escapes text for a markdown table cell.
func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
