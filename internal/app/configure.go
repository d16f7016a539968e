package app

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/clientmetrics"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/version"
)

const apiserverMetricsReadableHelp = "1 when the last read of the API server's /metrics (flow-control rejections, for the adaptive node-addition rate) succeeded."

// configure reads the configuration (the command line, --config, or the
// last good configuration when the file is refused) and starts the
// metrics registry.
func (a *app) configure(ctx context.Context) error {
	a.kf = newKlogFlags()
	c, flags, fallback, err := startConfig(ctx, a.args, func(fs *pflag.FlagSet) {
		a.prov.register(fs)
		a.kf.addReal(fs)
	}, readLastGood)
	if err != nil {
		return err
	}
	a.c, a.flags, a.fallback = c, flags, fallback
	logger := klog.FromContext(ctx)
	a.logger = logger
	if fallback != "" {
		logger.Error(nil, "STARTED ON A FALLBACK CONFIGURATION: the flags file was refused", "reason", fallback)
	}
	v := version.Get()
	logger.Info("Starting vmss-autoscaler", "version", v.Version, "commit", v.Commit, "goVersion", v.GoVersion)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.reg, a.metrics = reg, core.NewMetrics(reg)
	a.readable = prometheus.NewGauge(prometheus.GaugeOpts{Name: "vmss_autoscaler_apiserver_metrics_readable", Help: apiserverMetricsReadableHelp})
	reg.MustRegister(a.readable)
	// Every request of the Kubernetes clients: rest_client_* as in
	// Kubernetes components and the cluster-autoscaler.
	if !clientmetrics.New(reg).Register() {
		logger.Info("Kubernetes client metrics were registered elsewhere in this process; rest_client_* are not exported")
	}
	return nil
}
