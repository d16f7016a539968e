package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/spf13/pflag"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

// Events on the flags ConfigMap.
const (
	eventConfigApplied         = "ConfigApplied"
	eventConfigRejected        = "ConfigRejected"
	eventConfigRestartRequired = "ConfigRestartRequired"
)

// liveFlag says whether a flag's new value takes effect on the next loop.
// The rest (cloud, identity, namespaces, leader election, the address,
// informer-bound names) need a restart.
func liveFlag(name string) bool {
	for _, p := range []string{"scale-down-", "node-addition-", "preflight-", "max-preflight-", "node-group-backoff-"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	switch name {
	case "scan-interval", "max-nodes-total", "expander", "new-pod-scale-up-delay", "max-node-provision-time",
		"max-node-startup-time", "initial-node-group-backoff-duration", "max-node-group-backoff-duration",
		"gpu-groups-for-gpu-pods-only", "max-pod-events-per-loop", "pod-event-interval", "max-scale-down-parallelism",
		"max-empty-bulk-delete", "max-graceful-termination-sec", "skip-nodes-with-system-pods",
		"skip-nodes-with-local-storage", "max-soft-taints-per-loop", "max-nodes-in-flight", "warm-pool", "balloon-aware",
		"gang-allow-split", "borrowers-scale-team-groups", "status-taint", "v":
		return true
	}
	return false
}

// reloader applies edits of the flags ConfigMap: the whole new set is
// parsed and validated as at start; a bad value refuses it all (the last
// good configuration stays) with an event and a log line naming the key
// and the value; live keys go to the autoscaler for its next loop; other
// changed keys are reported as needing a restart.
type reloader struct {
	args      []string
	extra     func(*pflag.FlagSet)
	source    string
	key       string
	apply     func(core.Options) error
	rec       record.EventRecorder
	metrics   *core.Metrics
	isLeader  func() bool
	mu        sync.Mutex
	lastData  string
	values    map[string]string // flag values of the configuration in force
	restart   map[string]bool   // keys changed that wait for a restart
	startCore core.Options
}

func newReloader(args []string, extra func(*pflag.FlagSet), fs *pflag.FlagSet, c *config, apply func(core.Options) error,
	rec record.EventRecorder, m *core.Metrics, isLeader func() bool) *reloader {
	return &reloader{args: args, extra: extra, source: fmt.Sprintf("ConfigMap %s/%s key %s", c.core.Namespace, c.configMap, c.configMapKey),
		key: c.configMapKey, apply: apply, rec: rec, metrics: m, isLeader: isLeader, values: flagValues(fs), restart: map[string]bool{},
		startCore: c.core}
}

func flagValues(fs *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

// reload handles one version of the ConfigMap.
func (r *reloader) reload(ctx context.Context, cm *apiv1.ConfigMap) {
	r.mu.Lock()
	defer r.mu.Unlock()
	logger := klog.FromContext(ctx)
	data, ok := cm.Data[r.key]
	if !ok || data == r.lastData {
		return
	}
	r.lastData = data
	c, fs, err := parseConfigFrom(r.args, r.extra, []byte(data), r.source)
	var live, restart []string
	var values map[string]string
	if err == nil {
		values = flagValues(fs)
		for name, v := range values {
			switch {
			case r.values[name] == v:
			case liveFlag(name):
				live = append(live, name+"="+v)
			default:
				restart = append(restart, name+"="+v)
			}
		}
		if len(live) > 0 {
			err = r.apply(r.keepRestartOnly(c.core))
		}
	}
	if err != nil {
		r.metrics.ConfigReloads.WithLabelValues("rejected").Inc()
		logger.Error(err, "Flags ConfigMap refused; the last good configuration stays", "configMap", klog.KObj(cm))
		r.event(cm, apiv1.EventTypeWarning, eventConfigRejected, "refused, the last good configuration stays: "+err.Error())
		return
	}
	for _, kv := range restart {
		name, _, _ := strings.Cut(kv, "=")
		r.restart[name] = true
	}
	sort.Strings(live)
	sort.Strings(restart)
	// Restart-only keys keep their old value in force, and are reported.
	for name := range r.restart {
		values[name] = r.values[name]
	}
	r.values = values
	r.metrics.ConfigReloads.WithLabelValues("applied").Inc()
	if len(r.restart) > 0 {
		r.metrics.ConfigRestartRequired.Set(1)
	}
	if len(live) > 0 {
		logger.Info("Flags ConfigMap applied; in force from the next loop", "configMap", klog.KObj(cm), "changed", live)
		r.event(cm, apiv1.EventTypeNormal, eventConfigApplied, "in force from the next loop: "+strings.Join(live, ", "))
	}
	if len(restart) > 0 {
		logger.Info("Flags ConfigMap keys need a restart to take effect", "configMap", klog.KObj(cm), "keys", restart)
		r.event(cm, apiv1.EventTypeWarning, eventConfigRestartRequired, "these keys take effect only after a restart: "+strings.Join(restart, ", "))
	}
}

// keepRestartOnly puts back the options that only a restart may change:
// they are bound to informers and objects created at start.
func (r *reloader) keepRestartOnly(o core.Options) core.Options {
	s := r.startCore
	o.Namespace, o.StatusConfigMapName, o.WriteStatusConfigMap, o.PriorityConfigMapName = s.Namespace, s.StatusConfigMapName, s.WriteStatusConfigMap, s.PriorityConfigMapName
	o.GPUResourceName = s.GPUResourceName
	aware := o.BalloonAware
	o.Balloons = s.Balloons
	o.BalloonAware = aware
	o.Balloons.PreflightTaintKey = o.Preflight.Taint.Key
	return o
}

func (r *reloader) event(cm *apiv1.ConfigMap, typ, reason, msg string) {
	if r.rec != nil && (r.isLeader == nil || r.isLeader()) {
		r.rec.Event(cm, typ, reason, msg)
	}
}
