package core

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/yaml"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/scaleup"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
)

// TestNoScaleUpReasonsAreNamed (#43): why a pod got no node is a named
// reason (cluster-autoscaler's skipped and rejected reasons), counted by
// pods_without_scale_up{reason} and in the status, beside the words of its
// NotTriggerScaleUp event: a group at its max, a group backed off after
// the cloud refused it, a pod no group's template fits.
func TestNoScaleUpReasonsAreNamed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*env, *inmemory.Group)
		pod   []to.PodOption
		want  scaleup.ReasonCode
		words string
	}{
		{name: "max size", setup: func(e *env, g *inmemory.Group) {}, want: scaleup.ReasonMaxSize, words: "at max size"},
		{name: "backoff", setup: func(e *env, g *inmemory.Group) {
			g.SetIncreaseError(cloudprovider.NewError(cloudprovider.ClassQuota, "QuotaExceeded", "0 of 8 cores left", nil))
			e.add(pendingPods(1, "first", wholeGPU()...))
			e.run()
			e.clock.Step(time.Second)
		}, want: scaleup.ReasonBackoff, words: "in backoff"},
		{name: "does not fit", setup: func(e *env, g *inmemory.Group) {}, pod: []to.PodOption{to.NodeSelector("pool", "elsewhere")}, want: scaleup.ReasonDoesNotFit, words: "node(s) didn't match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			max := 10
			if tc.want == scaleup.ReasonMaxSize {
				max = 0
			}
			g := e.provider.AddGroup("gpu", 0, max, gpuTemplate("gpu"))
			e.start()
			e.register(g)
			tc.setup(e, g)
			e.add(pendingPods(1, "web", append(wholeGPU(), tc.pod...)...))
			e.run()
			if got := testutil.ToFloat64(e.a.metrics.PodsWithoutScaleUp.WithLabelValues(string(tc.want))); got < 1 {
				t.Fatalf("pods_without_scale_up{reason=%q} = %v, want the pod counted", tc.want, got)
			}
			var st Status
			if err := yaml.Unmarshal([]byte(e.status.writes[len(e.status.writes)-1]), &st); err != nil {
				t.Fatal(err)
			}
			if st.PodsWithoutScaleUp[string(tc.want)] < 1 {
				t.Fatalf("status podsWithoutScaleUp %v, want %s", st.PodsWithoutScaleUp, tc.want)
			}
			evs := e.events(EventNotTriggerScaleUp)
			if len(evs) == 0 || !strings.Contains(evs[len(evs)-1], tc.words) {
				t.Fatalf("NotTriggerScaleUp events %v, want the words %q", evs, tc.words)
			}
		})
	}
}
