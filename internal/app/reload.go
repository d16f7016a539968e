package app

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
	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

// Events on the flags ConfigMap.
const (
	eventConfigApplied         = "ConfigApplied"
	eventConfigRejected        = "ConfigRejected"
	eventConfigRestartRequired = "ConfigRestartRequired"
	eventConfigFallback        = "ConfigFallback"
)

// reloader applies edits of the flags ConfigMap: the whole new set is
// parsed and validated as at start; a bad value, or a key only the command
// line may set (commandLineOnly: identity, endpoints, credentials' files,
// images), refuses it all (the last good configuration stays) with an event
// and a log line naming the key (and the value); live keys go to the
// autoscaler for its next loop; other changed keys are reported as needing
// a restart. Which keys are live is
// declared where each flag is defined (isLive).
type reloader struct {
	args   []string
	extra  func(*pflag.FlagSet)
	source string
	key    string
	apply  func(core.Options) error
	klog   func(name, value string) error // applies a live klog flag; nil: none
	// persist stores accepted content where a restart finds it (the last
	// good configuration); accepted is told of every acceptance. nil: none.
	persist  func(ctx context.Context, data string) error
	accepted func()
	rec      record.EventRecorder
	metrics  *core.Metrics
	isLeader func() bool // nil: always (no leader election)
	mu       sync.Mutex
	lastData string
	values   map[string]string   // flag values of the configuration in force
	settings map[string][]string // the same, as values to set again
	restart  map[string]bool     // keys changed that wait for a restart
	// good is the content last accepted; unsaved says this process has not
	// stored it yet (a standby accepts without storing; a store may fail,
	// and storeFailing then says so, to log it once).
	good         string
	unsaved      bool
	storeFailing bool
}

func newReloader(args []string, extra func(*pflag.FlagSet), fs *pflag.FlagSet, c *config, apply func(core.Options) error,
	rec record.EventRecorder, m *core.Metrics, isLeader func() bool) *reloader {
	values, settings := flagValues(fs)
	return &reloader{args: args, extra: extra, source: fmt.Sprintf("ConfigMap %s/%s key %s", c.core.Namespace, c.configMap, c.configMapKey),
		key: c.configMapKey, apply: apply, rec: rec, metrics: m, isLeader: isLeader, values: values, settings: settings, restart: map[string]bool{}}
}

// flagValues are the flags' values as strings, to compare, and as what
// sets them again (a list for repeatable flags).
func flagValues(fs *pflag.FlagSet) (map[string]string, map[string][]string) {
	values, settings := map[string]string{}, map[string][]string{}
	fs.VisitAll(func(f *pflag.Flag) {
		values[f.Name] = f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			settings[f.Name] = sv.GetSlice()
		} else {
			settings[f.Name] = []string{f.Value.String()}
		}
	})
	return values, settings
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
	var ch changes
	if err == nil {
		ch = r.changesOf(fs)
		if len(ch.live) > len(ch.klogLive) {
			if len(ch.pinned) > 0 {
				// Restart-only keys keep the values in force.
				c, err = r.parsePinned([]byte(data), ch.pinned)
			}
			if err == nil {
				err = r.apply(c.core)
			}
		}
	}
	if err != nil {
		r.metrics.ConfigReloads.WithLabelValues("rejected").Inc()
		logger.Error(err, "Flags ConfigMap refused; the last good configuration stays", "configMap", klog.KObj(cm))
		r.event(cm, apiv1.EventTypeWarning, eventConfigRejected, "refused, the last good configuration stays: "+err.Error())
		return
	}
	r.commit(ctx, cm, data, ch)
}

// changes are what a flags ConfigMap sets against the values in force:
// live keys (name=value; klogLive the klog ones among them), restart-only
// keys (pinned by name), and every value it sets.
type changes struct {
	live, restart, klogLive, pinned []string
	values                          map[string]string
	settings                        map[string][]string
}

func (r *reloader) changesOf(fs *pflag.FlagSet) changes {
	var ch changes
	ch.values, ch.settings = flagValues(fs)
	for name, v := range ch.values {
		f := fs.Lookup(name)
		switch {
		case r.values[name] == v:
		case isLive(f):
			ch.live = append(ch.live, name+"="+v)
			if isKlog(f) {
				ch.klogLive = append(ch.klogLive, name)
			}
		default:
			ch.restart = append(ch.restart, name+"="+v)
			ch.pinned = append(ch.pinned, name)
		}
	}
	sort.Strings(ch.live)
	sort.Strings(ch.restart)
	return ch
}

// commit records an accepted flags ConfigMap: klog's live flags applied,
// restart-only keys reported (their old values stay in force), the last
// good configuration stored, metrics and events.
func (r *reloader) commit(ctx context.Context, cm *apiv1.ConfigMap, data string, ch changes) {
	logger := klog.FromContext(ctx)
	for _, kv := range ch.restart {
		name, _, _ := strings.Cut(kv, "=")
		r.restart[name] = true
	}
	// klog's live flags apply only now that the whole set is accepted.
	for _, name := range ch.klogLive {
		if r.klog == nil {
			continue
		}
		if err := r.klog(name, ch.values[name]); err != nil {
			logger.Error(err, "Applying a klog flag from the flags ConfigMap", "flag", name)
		}
	}
	// Restart-only keys keep their old value in force, and are reported.
	for name := range r.restart {
		ch.values[name], ch.settings[name] = r.values[name], r.settings[name]
	}
	r.values, r.settings = ch.values, ch.settings
	r.metrics.ConfigReloads.WithLabelValues("applied").Inc()
	if r.accepted != nil {
		r.accepted()
	}
	r.good, r.unsaved = data, true
	r.storeLastGood(ctx)
	if len(r.restart) > 0 {
		r.metrics.ConfigRestartRequired.Set(1)
	}
	if len(ch.live) > 0 {
		logger.Info("Flags ConfigMap applied; in force from the next loop", "configMap", klog.KObj(cm), "changed", ch.live)
		r.event(cm, apiv1.EventTypeNormal, eventConfigApplied, "in force from the next loop: "+strings.Join(ch.live, ", "))
	}
	if len(ch.restart) > 0 {
		logger.Info("Flags ConfigMap keys need a restart to take effect", "configMap", klog.KObj(cm), "keys", ch.restart)
		r.event(cm, apiv1.EventTypeWarning, eventConfigRestartRequired, "these keys take effect only after a restart: "+strings.Join(ch.restart, ", "))
	}
}

// loopSucceeded is told of every loop that completed. The leader's first
// one stores the content it runs on as the last good configuration, unless
// an accepted edit stored it already: a replica accepts the flags ConfigMap
// as a standby, which does not store, and the same content when it leads
// is no edit. Until a store succeeds, every successful loop tries again.
func (r *reloader) loopSucceeded(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.storeLastGood(ctx)
}

// storeLastGood stores the accepted content when this replica leads and
// has not stored it yet; standbys never store. r.mu is held.
func (r *reloader) storeLastGood(ctx context.Context) {
	if r.persist == nil || !r.unsaved || !r.leading() {
		return
	}
	logger := klog.FromContext(ctx)
	if err := r.persist(ctx, r.good); err != nil {
		if !r.storeFailing {
			logger.Error(err, "Storing the last good configuration failed, tried again after every successful loop; "+
				"until then a restart on a refused flags file falls back to an older one, or to the command line alone")
		} else {
			logger.V(2).Info("Storing the last good configuration failed again", "err", err)
		}
		r.storeFailing = true
		return
	}
	r.unsaved, r.storeFailing = false, false
	logger.Info("Stored the last good configuration", "key", lastGoodKey)
}

func (r *reloader) leading() bool { return r.isLeader == nil || r.isLeader() }

// parsePinned parses data again with the named restart-only keys set to
// the values in force: only a restart may change them.
func (r *reloader) parsePinned(data []byte, names []string) (*config, error) {
	raw := map[string]any{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %w", r.source, err)
	}
	for _, name := range names {
		delete(raw, "--"+name)
		vs := make([]any, 0, len(r.settings[name]))
		for _, v := range r.settings[name] {
			vs = append(vs, v)
		}
		raw[name] = vs
	}
	pinned, err := yaml.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.source, err)
	}
	c, _, err := parseConfigFrom(r.args, r.extra, pinned, r.source)
	return c, err
}

func (r *reloader) event(cm *apiv1.ConfigMap, typ, reason, msg string) {
	if r.rec != nil && r.leading() {
		r.rec.Event(cm, typ, reason, msg)
	}
}
