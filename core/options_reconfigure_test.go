package core

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestReconfigureTakesEffectAtTheNextLoop(t *testing.T) {
	e := newEnv(t, smoothing(6, 1, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(60, "train", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("increases %v, want [1] at 6 nodes/min with a burst of 1", got)
	}
	// A bad value is refused as a whole and changes nothing.
	bad := e.a.Options()
	bad.NodeAdditionRate, bad.NodeAdditionBurst = 600, 0
	if err := e.a.Reconfigure(bad); err == nil || !strings.Contains(err.Error(), "--node-addition-burst") {
		t.Fatalf("Reconfigure(burst 0) = %v, want an error naming --node-addition-burst", err)
	}
	if got := e.a.Options().NodeAdditionRate; got != 6 {
		t.Fatalf("rate %v after a refused reload, want 6", got)
	}
	good := e.a.Options()
	// With 1 s loops the bucket holds at most 2 s of the rate (20), so the
	// burst of 50 is what bounds the next loop's release.
	good.NodeAdditionRate, good.NodeAdditionBurst, good.ScanInterval = 600, 50, time.Second
	good.Expanders = []string{"most-pods"}
	if err := e.a.Reconfigure(good); err != nil {
		t.Fatal(err)
	}
	e.clock.Step(10 * time.Second)
	e.run()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 50 {
		t.Fatalf("increases %v, want [1 50] under the new rate and burst", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.AdditionRate); got != 600 {
		t.Fatalf("rate gauge %v, want 600", got)
	}
	if got := strings.Join(e.a.planner.Expander.Names(), ","); !strings.Contains(got, "most-pods") {
		t.Fatalf("expander %q, want most-pods", got)
	}
}
