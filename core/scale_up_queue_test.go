package core

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/core/trigger"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
	"github.com/vmss-autoscaler/vmss-autoscaler/ratelimit"
)

// smoothing sets a fixed-rate queue.
func smoothing(rate float64, burst, inFlight int) envOption {
	return withOptions(func(o *Options) {
		o.NodeAdditionSmoothing = true
		o.NodeAdditionRate, o.NodeAdditionBurst, o.MaxNodesInFlight = rate, burst, inFlight
		o.NodeAdditionAdaptive = false
	})
}

func TestQueueReleasesAtTheRateAndNeverAsksTwice(t *testing.T) {
	e := newEnv(t, smoothing(60, 10, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	pods := pendingPods(30, "train", wholeGPU()...)
	e.add(pods)
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 10 {
		t.Fatalf("increases %v, want the burst [10]", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.QueueDepth.WithLabelValues("gpu", "workload")); got != 20 {
		t.Fatalf("queue depth %v, want 20", got)
	}
	if got := len(e.events(EventScaleUpQueued)); got != 30 {
		t.Fatalf("ScaleUpQueued events %d, want one per pod (30)", got)
	}
	last := e.status.writes[len(e.status.writes)-1]
	for _, want := range []string{"heldBy: rate", "nodeGroup: gpu", "nodes: 20", "inFlight: 10"} {
		if !strings.Contains(last, want) {
			t.Fatalf("status lacks %q:\n%s", want, last)
		}
	}
	// 10 s at 60 nodes a minute: 10 more; the 10 requested are upcoming and
	// not asked for again.
	e.clock.Step(10 * time.Second)
	e.run()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 10 {
		t.Fatalf("increases %v, want [10 10]", got)
	}
	if got := len(e.events(EventScaleUpQueued)); got != 0 {
		t.Fatalf("%d ScaleUpQueued events repeated with an unchanged message", got)
	}
	// 20 of the pods go away while their nodes are queued: the remaining 10
	// fit on the 20 requested already, and the 10 queued are cancelled,
	// never requested.
	for _, p := range pods[:20] {
		if err := e.pods.Delete(p); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 6; i++ {
		e.clock.Step(10 * time.Second)
		e.run()
	}
	if got := sum(gpu.Increases()); got != 20 {
		t.Fatalf("nodes requested %d (%v), want 20: the cancelled demand must not be requested", got, gpu.Increases())
	}
	if got := testutil.ToFloat64(e.a.metrics.NodesCancelled.WithLabelValues("gpu", "workload")); got != 10 {
		t.Fatalf("cancelled %v, want the 10 queued nodes", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.NodesReleased.WithLabelValues("gpu", "workload")); got != 20 {
		t.Fatalf("released %v, want 20", got)
	}
}

func TestQueueInFlightCap(t *testing.T) {
	e := newEnv(t, smoothing(600, 100, 8))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(20, "train", wholeGPU()...))
	e.run()
	e.clock.Step(time.Minute)
	e.run() // still creating: nothing more
	if got := gpu.Increases(); len(got) != 1 || got[0] != 8 {
		t.Fatalf("increases %v, want [8] under the in-flight cap", got)
	}
	if !strings.Contains(e.status.writes[len(e.status.writes)-1], "heldBy: in-flight") {
		t.Fatalf("status does not say the cap held demand:\n%s", e.status.writes[len(e.status.writes)-1])
	}
	// Five become ready nodes: five more may fly.
	gpu.MarkRunning()
	e.register(gpu)
	e.clock.Step(10 * time.Second)
	e.run()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 8 {
		t.Fatalf("increases %v, want [8 8] once the first 8 are ready", got)
	}
}

func TestQueueAfterRestartAddsNoSecondBurst(t *testing.T) {
	e := newEnv(t, smoothing(60, 10, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(30, "train", wholeGPU()...))
	e.run()
	// The process restarts: a new autoscaler over the same cloud and cluster.
	e.reg = newEnv(t).reg
	e.start()
	e.run()
	if got := gpu.Increases(); len(got) != 1 {
		t.Fatalf("increases %v: the restarted autoscaler requested again at once", got)
	}
	e.clock.Step(10 * time.Second)
	e.run()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 10 {
		t.Fatalf("increases %v, want [10 10]: the rate, and not the 10 in flight again", got)
	}
}

func TestSmoothingOffRequestsEverythingAtOnce(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.NodeAdditionSmoothing = false; o.NodeAdditionBurst = 1 }))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(30, "train", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 30 {
		t.Fatalf("increases %v, want [30]", got)
	}
}

type fixedHealth struct{ s ratelimit.Signals }

func (f *fixedHealth) Take() ratelimit.Signals { return f.s }

func TestAdaptiveRateFollowsAPIServerHealth(t *testing.T) {
	h := &fixedHealth{s: ratelimit.Signals{Requests: 100, Throttled: 3}}
	e := newEnv(t, smoothing(60, 1, 1000), withOptions(func(o *Options) {
		o.NodeAdditionAdaptive = true
		o.NodeAdditionAdaptiveOptions.Min, o.NodeAdditionAdaptiveOptions.Max = 15, 120
		o.NodeAdditionAdaptiveOptions.Interval = 30 * time.Second
	}))
	e.apiServer = h
	e.provider.AddGroup("gpu", 0, 1000, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(500, "train", wholeGPU()...))
	step := func(n int) {
		for i := 0; i < n; i++ {
			e.clock.Step(10 * time.Second)
			e.run()
		}
	}
	e.run()
	step(1) // 429s cut the rate in the loop that sees them
	if got := testutil.ToFloat64(e.a.metrics.AdditionRate); got != 30 {
		t.Fatalf("rate %v after 429s, want halved to 30", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.AdditionRateReason.WithLabelValues(ratelimit.Reason429)); got != 1 {
		t.Fatalf("rate reason client-429 = %v, want 1", got)
	}
	step(2) // still 429s: halved again (at most once per 10 s), to the bound
	if got := testutil.ToFloat64(e.a.metrics.AdditionRate); got != 15 {
		t.Fatalf("rate %v, want the lower bound 15", got)
	}
	h.s = ratelimit.Signals{Requests: 100}
	step(6) // two healthy intervals while the rate holds demand back
	if got := testutil.ToFloat64(e.a.metrics.AdditionRate); got != 35 {
		t.Fatalf("rate %v, want 15 + 2×10", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.RateChanges.WithLabelValues(ratelimit.ReasonHealthy)); got != 2 {
		t.Fatalf("healthy rate changes %v, want 2", got)
	}
	if !strings.Contains(e.status.writes[len(e.status.writes)-1], "rateReason: healthy") {
		t.Fatalf("status does not say why:\n%s", e.status.writes[len(e.status.writes)-1])
	}
}

// TestInFlightCapCountsGroupsOfUnknownSize: a group whose size cannot be
// read this loop still has its booting machines; the in-flight cap counts
// them as when last known, so another group cannot add a whole cap more.
func TestInFlightCapCountsGroupsOfUnknownSize(t *testing.T) {
	e := newEnv(t, smoothing(6000, 1000, 8))
	a := e.provider.AddGroup("gpu-a", 0, 100, gpuTemplate("gpu-a"))
	b := e.provider.AddGroup("gpu-b", 0, 100, gpuTemplate("gpu-b"))
	e.start()
	e.add(pendingPods(8, "first", append(wholeGPU(), to.NodeSelector("pool", "gpu-a"))...))
	e.run()
	if got := a.Increases(); len(got) != 1 || got[0] != 8 {
		t.Fatalf("gpu-a increases %v, want [8]: the whole cap", got)
	}
	a.SetSizeUnknown(true) // its VM list fails from now on; its 8 still boot
	e.add(pendingPods(8, "second", append(wholeGPU(), to.NodeSelector("pool", "gpu-b"))...))
	for range 3 {
		e.clock.Step(10 * time.Second)
		e.run()
	}
	if got := b.Increases(); len(got) != 0 {
		t.Fatalf("gpu-b increases %v while gpu-a's 8 machines boot: the cap of 8 is full", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.NodesInFlight); got != 8 {
		t.Fatalf("nodes_in_flight %v, want gpu-a's 8", got)
	}
}

// TestReleasesPaced: a group released to in an earlier loop less than
// --node-group-write-interval ago gets no single-node release (its demand waits, queued,
// "paced", with a follow-up loop asked for when the gap ends); a gang's
// nodes are never held for it; past the gap the demand goes.
func TestReleasesPaced(t *testing.T) {
	e := newEnv(t, smoothing(6000, 100, 1000), withGangs(mins{"train": 13}))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(10, "web", wholeGPU()...))
	e.run()
	// A gang of 13 a second later is planned first: on the 10 coming
	// nodes and 3 new ones, released whole at once, pace or not; the 10
	// web pods need 10 new nodes again, which wait for the gap.
	e.clock.Step(time.Second)
	e.add(gangMembers(13, "train"))
	freshDriver(e)
	e.run()
	released := e.clock.Now()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 3 {
		t.Fatalf("increases %v, want [10 3]: the gang goes whole, the rest waits", got)
	}
	if q := testutil.ToFloat64(e.a.metrics.QueueDepth.WithLabelValues("gpu", "workload")); q != 10 {
		t.Fatalf("queued %v, want 10", q)
	}
	if last := e.status.writes[len(e.status.writes)-1]; !strings.Contains(last, "heldBy: paced") {
		t.Fatalf("status does not say paced:\n%s", last)
	}
	if r, at := e.a.driver.Timed(); r != trigger.Queue || !at.Equal(released.Add(e.writeGap())) {
		t.Fatalf("timed wake %v at +%v, want queue at +%v", r, at.Sub(released), e.writeGap())
	}
	e.clock.Step(e.writeGap())
	e.run()
	if got := gpu.Increases(); len(got) != 3 || got[2] != 10 {
		t.Fatalf("increases %v, want [10 3 10]: past the gap the 10 go", got)
	}
}

// TestWriteIntervalLive: --node-group-write-interval is what paces a
// group's releases, read live: a group released to a second ago waits
// under the default 5 s, and once a reload sets 0 its demand goes in the
// next loop, with no follow-up held back.
func TestWriteIntervalLive(t *testing.T) {
	e := newEnv(t, smoothing(6000, 100, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(10, "web", wholeGPU()...))
	e.run()
	e.clock.Step(time.Second)
	e.add(pendingPods(4, "batch", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != 1 {
		t.Fatalf("increases %v, want [10]: the batch pods wait for the pace", got)
	}
	o := e.a.opts
	o.NodeGroupWriteInterval = 0
	if err := e.a.Reconfigure(o); err != nil {
		t.Fatal(err)
	}
	e.clock.Step(time.Second)
	e.run()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 4 {
		t.Fatalf("increases %v, want [10 4]: with no pace the batch pods' nodes go", got)
	}
	if e.a.followUp() != 0 || e.a.remarked() != 0 {
		t.Fatalf("follow-up %v, re-marked %v after a release, want 0 with no pace", e.a.followUp(), e.a.remarked())
	}
}

// TestPacedAfterARefusedWrite: a write the cloud refused (throttled) still
// paces its group — the same request would meet the same answer — and
// the loop that finds the group paced asks for the next one when the pace
// ends, not at once: the last loop that asked for nodes successfully is
// older than the pace, and waking on it gave a loop a second of nothing.
func TestPacedAfterARefusedWrite(t *testing.T) {
	e := newEnv(t, smoothing(6000, 100, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(10, "web", wholeGPU()...))
	e.run()
	e.clock.Step(2 * e.writeGap())
	gpu.SetIncreaseError(cloudprovider.NewError(cloudprovider.ClassThrottled, "TooManyRequests", "throttled", nil))
	e.add(pendingPods(4, "batch", wholeGPU()...))
	freshDriver(e)
	if err := e.a.RunOnce(e.ctx); err != nil {
		t.Logf("refused loop: %v", err)
	}
	refused := e.clock.Now()
	gpu.SetIncreaseError(nil)
	e.clock.Step(time.Second)
	freshDriver(e)
	if err := e.a.RunOnce(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := gpu.Increases(); len(got) != 1 {
		t.Fatalf("increases %v, want [10]: the batch pods wait for the pace after the refused write", got)
	}
	if r, at := e.a.driver.Timed(); r != trigger.Queue || !at.Equal(refused.Add(e.writeGap())) {
		t.Fatalf("timed wake %v at %v after the refused write, want queue at %v", r, at.Sub(refused), e.writeGap())
	}
	e.clock.Step(e.writeGap() - time.Second)
	e.run()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 4 {
		t.Fatalf("increases %v, want [10 4] once the pace ended", got)
	}
}

// TestWritingGroupWaitsAndKeepsTheTokens: a group whose previous
// capacity write still runs (the vmss provider's one write in flight per
// scale set) gets no release: the provider would refuse it unsent, and
// the tokens and room it took would wait out the operation (minutes for
// GPU VMs). Its demand waits, queued and held by "write-in-flight", the
// bucket keeps its tokens, and the write goes whole once the previous
// one has ended.
func TestWritingGroupWaitsAndKeepsTheTokens(t *testing.T) {
	e := newEnv(t, smoothing(60, 10, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	gpu.SetScaleUpInFlight(true)
	e.add(pendingPods(10, "web", wholeGPU()...))
	e.run()
	if got := gpu.Increases(); len(got) != 0 {
		t.Fatalf("increases %v while the group's previous write runs, want none", got)
	}
	if e.a.nodeAdd.queue.Tokens() != 10 {
		t.Errorf("bucket %v after holding a writing group's demand, want its 10 tokens kept", e.a.nodeAdd.queue.Tokens())
	}
	if want := "heldBy: write-in-flight"; !strings.Contains(e.a.lastStatus, want) {
		t.Errorf("status %s, want %s", e.a.lastStatus, want)
	}
	if got := testutil.ToFloat64(e.a.metrics.QueueDepth.WithLabelValues("gpu", "workload")); got != 10 {
		t.Errorf("queue depth %v, want the 10 nodes waiting", got)
	}
	gpu.SetScaleUpInFlight(false)
	e.clock.Step(time.Second)
	e.run()
	if got := gpu.Increases(); len(got) != 1 || got[0] != 10 {
		t.Fatalf("increases %v once the previous write ended, want [10]", got)
	}
}

// TestDeferredWriteIsNotAFailure: a scale-up the provider defers unsent
// while its previous operation on the scale set runs (throttled, wrapping
// ErrNotSent: the VMSS provider's one capacity write in flight per set)
// is neither a warning event nor a failed scale-up — loops meet it every
// scan for the minutes a GPU scale-up runs — and its demand is sent as
// one write once the provider takes writes again.
func TestDeferredWriteIsNotAFailure(t *testing.T) {
	e := newEnv(t, smoothing(6000, 100, 1000))
	gpu := e.provider.AddGroup("gpu", 0, 100, gpuTemplate("gpu"))
	e.start()
	e.add(pendingPods(10, "web", wholeGPU()...))
	e.run()
	e.clock.Step(2 * e.writeGap())
	gpu.SetIncreaseError(cloudprovider.NewError(cloudprovider.ClassThrottled, "ScaleUpInProgress", "operation still running", cloudprovider.ErrNotSent))
	e.add(pendingPods(4, "batch", wholeGPU()...))
	for range 3 {
		freshDriver(e)
		_ = e.a.RunOnce(e.ctx)
		e.clock.Step(2 * e.writeGap())
	}
	if got := testutil.ToFloat64(e.a.metrics.FailedScaleUps.WithLabelValues("gpu", "throttled")); got != 0 {
		t.Errorf("%v failed scale-ups counted for deferred writes, want 0", got)
	}
	if got := e.events(EventFailedScaleUp); len(got) != 0 {
		t.Errorf("warning events for deferred writes: %v", got)
	}
	// Deferred nodes are queued, not cancelled.
	if got := testutil.ToFloat64(e.a.metrics.NodesCancelled.WithLabelValues("gpu", "workload")); got != 0 {
		t.Errorf("%v deferred nodes counted as cancelled demand, want 0", got)
	}
	if got := testutil.ToFloat64(e.a.metrics.QueueDepth.WithLabelValues("gpu", "workload")); got != 4 {
		t.Errorf("queue depth %v while 4 nodes wait for the deferred write, want 4", got)
	}
	gpu.SetIncreaseError(nil)
	freshDriver(e)
	e.run()
	if got := gpu.Increases(); len(got) != 2 || got[1] != 4 {
		t.Fatalf("increases %v, want [10 4]: the deferred demand sent in one write", got)
	}
}

// TestWritingGroupDoesNotHoldBalloons: balloons wait behind a group whose
// workload is paced (seconds), not behind one whose previous write runs
// (minutes): that group spends no tokens or room they would take.
func TestWritingGroupDoesNotHoldBalloons(t *testing.T) {
	na, err := newNodeAddition(func() Options {
		o := DefaultOptions()
		o.NodeAdditionAdaptive = false
		return o
	}(), nil)
	if err != nil {
		t.Fatal(err)
	}
	na.writing = map[string]bool{"gpu": true}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := na.Decide(now, []ratelimit.Demand{
		{Group: "gpu", Count: 4, Class: ratelimit.Workload, Since: now},
		{Group: "warm", Count: 2, Class: ratelimit.Balloon, Since: now},
	}, 0)
	if d.Release()["gpu"] != 0 || d.Release()["warm"] != 2 {
		t.Fatalf("released %v, want the balloons' 2 and none of the writing group's", d.Release())
	}
}
