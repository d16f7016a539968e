package core

import (
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
)

// priorityCache holds the priority expander's last good configuration,
// re-parsed only when the ConfigMap's resourceVersion changes. A bad
// ConfigMap keeps the last good configuration and is logged once.
type priorityCache struct {
	version string
	cfg     *scaleup.Priorities
}

// priorities returns the current priority configuration, or nil.
func (a *Autoscaler) priorities() *scaleup.Priorities {
	if a.listers.ConfigMaps == nil {
		return nil
	}
	cm, err := a.listers.ConfigMaps.Get(a.opts.PriorityConfigMapName)
	if err != nil {
		return a.priority.cfg
	}
	if cm.ResourceVersion == a.priority.version && a.priority.version != "" {
		return a.priority.cfg
	}
	a.priority.version = cm.ResourceVersion
	cfg, err := scaleup.ParsePriorities(cm.Data["priorities"])
	if err != nil {
		klog.ErrorS(err, "Ignoring priority expander ConfigMap; keeping the last good configuration",
			"configmap", klog.KObj(cm), "resourceVersion", cm.ResourceVersion)
		if a.rec != nil {
			a.rec.Event(cm, "Warning", "InvalidPriorities", err.Error())
		}
		return a.priority.cfg
	}
	a.priority.cfg = cfg
	return cfg
}
