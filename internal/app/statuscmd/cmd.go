package statuscmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

// statusKey is the status ConfigMap's key (core.ConfigMapStatusWriter).
const statusKey = "status"

// options are the command's flags.
type options struct {
	kubeconfig, context string
	namespace, name     string
	metricsURL          string
	output              string
	timeout             time.Duration
}

// Main runs `vmss-autoscaler status` with args (after the subcommand) and
// prints to out. It returns pflag.ErrHelp (wrapped) for --help.
func Main(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var v *View
	if o.metricsURL != "" {
		v, err = fromMetricsURL(ctx, o.metricsURL)
	} else {
		v, err = fromConfigMap(ctx, o)
	}
	if err != nil {
		return err
	}
	return Render(out, v, o.output, time.Now())
}

func parseOptions(args []string) (*options, error) {
	d := core.DefaultOptions()
	o := &options{}
	fs := pflag.NewFlagSet("status", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; default $KUBECONFIG or ~/.kube/config, then in-cluster")
	fs.StringVar(&o.context, "context", "", "kubeconfig context; default the current one")
	fs.StringVarP(&o.namespace, "namespace", "n", d.Namespace, "namespace of the status ConfigMap (the autoscaler's --namespace)")
	fs.StringVar(&o.name, "name", d.StatusConfigMapName, "name of the status ConfigMap (the autoscaler's --status-config-map-name)")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "read a running replica's /metrics instead, e.g. http://localhost:8085/metrics after kubectl port-forward (no backoff reasons there, nor what holds the queue)")
	fs.StringVarP(&o.output, "output", "o", OutputTable, "table, json or yaml")
	fs.DurationVar(&o.timeout, "request-timeout", 30*time.Second, "give up reading after this long")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	if err := o.validate(fs); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return o, nil
}

// validate checks the options parsed by fs: no arguments, a known
// output, a positive timeout, a usable --metrics-url.
func (o *options) validate(fs *pflag.FlagSet) error {
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	switch o.output {
	case OutputTable, OutputJSON, OutputYAML:
	default:
		errs = append(errs, fmt.Errorf("-o=%q: want table, json or yaml", o.output))
	}
	if o.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--request-timeout=%s: must be positive", o.timeout))
	}
	if o.metricsURL != "" {
		errs = append(errs, o.metricsURLErrors(fs)...)
	}
	return errors.Join(errs...)
}

// metricsURLErrors are what is wrong with --metrics-url: not an http(s)
// URL, or given with the flags of the ConfigMap it does not read.
func (o *options) metricsURLErrors(fs *pflag.FlagSet) []error {
	var errs []error
	if u, err := url.Parse(o.metricsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("--metrics-url=%q: want an http(s) URL such as http://localhost:8085/metrics", o.metricsURL))
	}
	for _, f := range []string{"kubeconfig", "context", "namespace", "name"} {
		if fs.Changed(f) {
			errs = append(errs, fmt.Errorf("--%s: not with --metrics-url, which reads no ConfigMap", f))
		}
	}
	return errs
}

// fromConfigMap reads the status ConfigMap through the API server.
func fromConfigMap(ctx context.Context, o *options) (*View, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("status: kubeconfig: %w", err)
	}
	cfg.UserAgent = "vmss-autoscaler-status"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("status: Kubernetes client: %w", err)
	}
	cm, err := client.CoreV1().ConfigMaps(o.namespace).Get(ctx, o.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("status: ConfigMap %s/%s not found: is the autoscaler running there with --write-status-configmap (on by default), and are --namespace and --name its own? %w",
			o.namespace, o.name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("status: reading ConfigMap %s/%s: %w", o.namespace, o.name, err)
	}
	raw, ok := cm.Data[statusKey]
	if !ok {
		return nil, fmt.Errorf("status: ConfigMap %s/%s has no key %q", o.namespace, o.name, statusKey)
	}
	st, err := ParseStatus(raw)
	if err != nil {
		return nil, fmt.Errorf("status: ConfigMap %s/%s key %q: %w", o.namespace, o.name, statusKey, err)
	}
	return FromStatus(fmt.Sprintf("configmap %s/%s", o.namespace, o.name), st), nil
}

// ParseStatus parses the status ConfigMap's YAML. Unknown fields are
// allowed: a newer autoscaler may write more than this command knows.
func ParseStatus(raw string) (*core.Status, error) {
	var st core.Status
	if err := yaml.Unmarshal([]byte(raw), &st); err != nil {
		return nil, fmt.Errorf("not the autoscaler's status: %w", err)
	}
	return &st, nil
}

// fromMetricsURL reads and parses a replica's /metrics.
func fromMetricsURL(ctx context.Context, u string) (*View, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("status: --metrics-url=%s: %w", u, err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("status: --metrics-url=%s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("status: --metrics-url=%s: HTTP %s: %s", u, resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("status: --metrics-url=%s: not Prometheus text: %w", u, err)
	}
	if _, ok := families[metricPrefix+"loop_duration_seconds"]; !ok {
		return nil, fmt.Errorf("status: --metrics-url=%s: no %sloop_duration_seconds: not vmss-autoscaler's /metrics", u, metricPrefix)
	}
	return FromMetrics("metrics "+u, families), nil
}
