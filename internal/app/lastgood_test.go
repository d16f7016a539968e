package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/core"
)

func TestStartConfigFallsBackToTheLastGood(t *testing.T) {
	dir := t.TempDir()
	file := func(content string) string {
		p := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".yaml")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stored := func(data string, err error) func(context.Context, *config) (string, error) {
		return func(context.Context, *config) (string, error) { return data, err }
	}
	for _, tc := range []struct {
		name         string
		cmdline      string // extra command-line flag
		content      string // the --config file
		lastGood     func(context.Context, *config) (string, error)
		wantErr      string
		wantRate     float64
		wantFallback string
	}{
		{"a good file", "", "node-addition-rate: 50\n", stored("node-addition-rate: 70\n", nil), "", 50, ""},
		{"a refused file: the last good", "", "node-addition-burst: -3\n", stored("node-addition-rate: 70\n", nil), "", 70,
			"--node-addition-burst: must be at least 1, got -3: running on the last good configuration"},
		{"a refused file, nothing stored: the command line", "", "node-addition-burst: -3\n", stored("", nil), "", 100,
			"no last good configuration stored"},
		{"a refused file, the store unreadable: the command line", "", "node-addition-burst: -3\n", stored("", errors.New("forbidden")), "", 100,
			"could not be read (forbidden)"},
		{"a refused file and a refused last good: the command line", "", "node-addition-burst: -3\n", stored("node-addition-rate: -1\n", nil), "", 100,
			"refused too"},
		{"a bad command line stops the binary", "--scan-interval=-1s", "node-addition-rate: 50\n", stored("", nil), "--scan-interval", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--nodes=0:10:gpu", "--config=" + file(tc.content)}
			if tc.cmdline != "" {
				args = append(args, tc.cmdline)
			}
			c, fs, fallback, err := startConfig(context.Background(), args, nil, tc.lastGood)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.core.NodeAdditionRate != tc.wantRate || fs.Lookup("node-addition-rate").Value.String() != strconv.FormatFloat(tc.wantRate, 'g', -1, 64) {
				t.Fatalf("rate %v (flag %s), want %v; fallback %q", c.core.NodeAdditionRate, fs.Lookup("node-addition-rate").Value.String(), tc.wantRate, fallback)
			}
			if (fallback == "") != (tc.wantFallback == "") || !strings.Contains(fallback, tc.wantFallback) {
				t.Fatalf("fallback %q, want one containing %q", fallback, tc.wantFallback)
			}
		})
	}
}

func TestReloadStoresTheLastGood(t *testing.T) {
	args := []string{"--config-map=flags", "--namespace=kube-system", "--nodes=0:10:gpu"}
	c, fs, err := parseConfigFrom(args, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	m := core.NewMetrics(prometheus.NewRegistry())
	m.ConfigFallback.Set(1)
	var stored []string
	r := newReloader(args, nil, fs, c, func(core.Options) error { return nil }, nil, m, nil)
	r.persist = func(_ context.Context, data string) error { stored = append(stored, data); return nil }
	r.accepted = func() { m.ConfigFallback.Set(0) }
	cm := func(data string) *apiv1.ConfigMap {
		return &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flags", Namespace: "kube-system"}, Data: map[string]string{"config.yaml": data}}
	}
	r.reload(context.Background(), cm("node-addition-burst: -3\n"))
	if len(stored) != 0 || testutil.ToFloat64(m.ConfigFallback) != 1 {
		t.Fatalf("stored %q (fallback %v) for a refused edit", stored, testutil.ToFloat64(m.ConfigFallback))
	}
	r.reload(context.Background(), cm("node-addition-rate: 50\n"))
	if len(stored) != 1 || stored[0] != "node-addition-rate: 50\n" || testutil.ToFloat64(m.ConfigFallback) != 0 {
		t.Fatalf("stored %q (fallback %v), want the accepted content and the fallback cleared", stored, testutil.ToFloat64(m.ConfigFallback))
	}
}

const testNamespace, testStatusName = "kube-system", "vmss-autoscaler-status"

var configMapsResource = apiv1.SchemeGroupVersion.WithResource("configmaps")

// statusAPI is a fake API server holding the status ConfigMap: an Update
// of a stale copy is a conflict, as on a real one, and race, when set, runs
// before each write of the ConfigMap (the n-th, from 1) as another writer
// would: the loop writing its status.
type statusAPI struct {
	client *fake.Clientset
	writes int // Creates and Updates
}

func newStatusAPI(t *testing.T, data map[string]string, race func(n int, tr k8stesting.ObjectTracker) error) *statusAPI {
	t.Helper()
	var objs []runtime.Object
	if data != nil {
		objs = append(objs, &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: testStatusName, Namespace: testNamespace, ResourceVersion: "1"},
			Data: data})
	}
	a := &statusAPI{client: fake.NewClientset(objs...)}
	react := func(action k8stesting.Action) (bool, runtime.Object, error) {
		a.writes++
		if race != nil {
			if err := race(a.writes, a.client.Tracker()); err != nil {
				t.Errorf("racing write %d: %v", a.writes, err)
			}
		}
		if u, ok := action.(k8stesting.UpdateAction); ok {
			cur, err := a.client.Tracker().Get(configMapsResource, testNamespace, testStatusName)
			if err == nil && cur.(metav1.Object).GetResourceVersion() != u.GetObject().(metav1.Object).GetResourceVersion() {
				return true, nil, apierrors.NewConflict(configMapsResource.GroupResource(), testStatusName, errors.New("the object has been modified"))
			}
		}
		return false, nil, nil // the tracker writes
	}
	a.client.PrependReactor("create", "configmaps", react)
	a.client.PrependReactor("update", "configmaps", react)
	return a
}

// data is the status ConfigMap's content; nil when there is none.
func (a *statusAPI) data(t *testing.T) map[string]string {
	t.Helper()
	o, err := a.client.Tracker().Get(configMapsResource, testNamespace, testStatusName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return o.(*apiv1.ConfigMap).Data
}

// loopWritesStatus is the loop's status write racing the last good's: it
// sets the status key, creating the ConfigMap if there is none, and moves
// its resourceVersion on (the fake tracker does not).
func loopWritesStatus(status string) func(int, k8stesting.ObjectTracker) error {
	return func(_ int, tr k8stesting.ObjectTracker) error {
		o, err := tr.Get(configMapsResource, testNamespace, testStatusName)
		if apierrors.IsNotFound(err) {
			return tr.Create(configMapsResource, &apiv1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: testStatusName, Namespace: testNamespace, ResourceVersion: "1"},
				Data:       map[string]string{"status": status}}, testNamespace)
		}
		if err != nil {
			return err
		}
		cm := o.(*apiv1.ConfigMap).DeepCopy()
		rv, err := strconv.Atoi(cm.ResourceVersion)
		if err != nil {
			return fmt.Errorf("resourceVersion %q: %w", cm.ResourceVersion, err)
		}
		cm.ResourceVersion = strconv.Itoa(rv + 1)
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data["status"] = status
		return tr.Update(configMapsResource, cm, testNamespace)
	}
}

// onWrite races only the given writes.
func onWrite(race func(int, k8stesting.ObjectTracker) error, writes ...int) func(int, k8stesting.ObjectTracker) error {
	return func(n int, tr k8stesting.ObjectTracker) error {
		if slices.Contains(writes, n) {
			return race(n, tr)
		}
		return nil
	}
}

// TestLastGoodStoreRetriesOnConflict: the loop writes its status to the
// same ConfigMap; a last good write that loses the race reads it again and
// is retried, and the status stays.
func TestLastGoodStoreRetriesOnConflict(t *testing.T) {
	const good = "node-addition-rate: 50\n"
	for _, tc := range []struct {
		name       string
		initial    map[string]string // nil: no status ConfigMap
		race       func(int, k8stesting.ObjectTracker) error
		want       map[string]string
		wantWrites int
		wantErr    string
	}{
		{"no status ConfigMap: created", nil, nil, map[string]string{lastGoodKey: good}, 1, ""},
		{"the status beside it stays", map[string]string{"status": "s1"}, nil,
			map[string]string{"status": "s1", lastGoodKey: good}, 1, ""},
		{"a status write between the read and the update: read again, retried", map[string]string{"status": "s1"},
			onWrite(loopWritesStatus("s2"), 1), map[string]string{"status": "s2", lastGoodKey: good}, 2, ""},
		{"the status ConfigMap created between the read and the create: retried as an update", nil,
			onWrite(loopWritesStatus("s2"), 1), map[string]string{"status": "s2", lastGoodKey: good}, 2, ""},
		{"the value stored already: no write", map[string]string{"status": "s1", lastGoodKey: good}, nil,
			map[string]string{"status": "s1", lastGoodKey: good}, 0, ""},
		{"a conflict at every try: the error, wrapped", map[string]string{"status": "s1"}, loopWritesStatus("s2"),
			map[string]string{"status": "s2"}, 5,
			"storing the last good configuration in ConfigMap kube-system/vmss-autoscaler-status key lastGoodConfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newStatusAPI(t, tc.initial, tc.race)
			s := lastGoodStore{client: api.client.CoreV1(), namespace: testNamespace, name: testStatusName}
			err := s.save(context.Background(), good)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !apierrors.IsConflict(err)):
				t.Fatalf("err %v, want a conflict wrapped with %q", err, tc.wantErr)
			}
			if got := api.data(t); !maps.Equal(got, tc.want) {
				t.Fatalf("status ConfigMap %v, want %v", got, tc.want)
			}
			if api.writes != tc.wantWrites {
				t.Fatalf("%d writes, want %d", api.writes, tc.wantWrites)
			}
		})
	}
}

// TestLastGoodStoredByTheLeader: the leader stores the configuration it
// runs on at its first successful loop, though it accepted that content as
// a standby and the same content when it leads is no edit; then every edit
// it accepts. A standby never stores.
func TestLastGoodStoredByTheLeader(t *testing.T) {
	const chart, edit, bad, later = "node-addition-rate: 30\n", "node-addition-rate: 50\n", "node-addition-burst: -3\n", "node-addition-rate: 70\n"
	args := []string{"--config-map=flags", "--namespace=" + testNamespace, "--nodes=0:10:gpu"}
	c, fs, err := parseConfigFrom(args, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	api := newStatusAPI(t, map[string]string{"status": "s1"}, nil)
	leader := false
	r := newReloader(args, nil, fs, c, func(core.Options) error { return nil }, nil, core.NewMetrics(prometheus.NewRegistry()),
		func() bool { return leader })
	r.persist = lastGoodStore{client: api.client.CoreV1(), namespace: testNamespace, name: testStatusName}.save
	cm := func(data string) *apiv1.ConfigMap {
		return &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flags", Namespace: testNamespace}, Data: map[string]string{"config.yaml": data}}
	}
	ctx := context.Background()
	for _, step := range []struct {
		name       string
		leader     bool
		do         func()
		want       string // the stored last good; "": none
		wantWrites int    // in all, so far
	}{
		{"a standby accepts the flags ConfigMap: not stored", false, func() { r.reload(ctx, cm(chart)) }, "", 0},
		{"a standby's loop: not stored", false, func() { r.loopSucceeded(ctx) }, "", 0},
		{"leading, the same content read again: no edit", true, func() { r.reload(ctx, cm(chart)) }, "", 0},
		{"the leader's first successful loop stores it", true, func() { r.loopSucceeded(ctx) }, chart, 1},
		{"later loops write nothing", true, func() { r.loopSucceeded(ctx); r.loopSucceeded(ctx) }, chart, 1},
		{"an edit the leader accepts: stored at once", true, func() { r.reload(ctx, cm(edit)) }, edit, 2},
		{"a refused edit: the last good stays", true, func() { r.reload(ctx, cm(bad)); r.loopSucceeded(ctx) }, edit, 2},
		{"leadership lost: an edit accepted as a standby is not stored", false,
			func() { r.reload(ctx, cm(later)); r.loopSucceeded(ctx) }, edit, 2},
	} {
		t.Run(step.name, func(t *testing.T) {
			leader = step.leader
			step.do()
			if got := api.data(t); got[lastGoodKey] != step.want || got["status"] != "s1" {
				t.Fatalf("status ConfigMap %v, want %s %q beside the status", got, lastGoodKey, step.want)
			}
			if api.writes != step.wantWrites {
				t.Fatalf("%d writes, want %d", api.writes, step.wantWrites)
			}
		})
	}
}

// TestLastGoodStoreFailureRetriedAtTheNextLoop: a store that failed is
// tried again after the next successful loop.
func TestLastGoodStoreFailureRetriedAtTheNextLoop(t *testing.T) {
	args := []string{"--config-map=flags", "--namespace=" + testNamespace, "--nodes=0:10:gpu"}
	c, fs, err := parseConfigFrom(args, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	r := newReloader(args, nil, fs, c, func(core.Options) error { return nil }, nil, core.NewMetrics(prometheus.NewRegistry()),
		func() bool { return true })
	var stored []string
	fail := true
	r.persist = func(_ context.Context, data string) error {
		if fail {
			return errors.New("the API server is away")
		}
		stored = append(stored, data)
		return nil
	}
	ctx := context.Background()
	r.reload(ctx, &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flags", Namespace: testNamespace},
		Data: map[string]string{"config.yaml": "node-addition-rate: 50\n"}})
	r.loopSucceeded(ctx)
	r.loopSucceeded(ctx)
	fail = false
	r.loopSucceeded(ctx)
	r.loopSucceeded(ctx)
	if !slices.Equal(stored, []string{"node-addition-rate: 50\n"}) {
		t.Fatalf("stored %q, want the accepted content once, after the store came back", stored)
	}
}
