package vmss

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider"
	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

const managedImageID = "/subscriptions/" + sub + "/resourceGroups/images/providers/Microsoft.Compute/images/gpu-node"

// TestMaxClampedToScaleSetLimit: a group's max is what its scale set can
// hold when the configured max is more, and the group says so.
func TestMaxClampedToScaleSetLimit(t *testing.T) {
	gallery := "/subscriptions/" + sub + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/gpu/versions/1.0.0"
	tests := []struct {
		name      string
		flexible  bool
		spg       bool
		image     string
		nodes     string
		wantMax   int
		wantLimit int
		wantWhy   string
	}{
		{"uniform, platform image", false, false, "", "0:2500:gpu", 1000, 1000, "Uniform scale set"},
		{"uniform, gallery image", false, false, gallery, "0:2500:gpu", 1000, 1000, "Uniform scale set"},
		{"managed custom image", false, false, managedImageID, "0:2500:gpu", 600, 600, "managed custom image"},
		{"single placement group", false, true, "", "0:2500:gpu", 100, 100, "single placement group"},
		{"configured max below the limit", false, true, "", "0:50:gpu", 50, 100, "single placement group"},
		{"flexible, managed custom image", true, false, managedImageID, "0:2500:gpu", 1000, 1000, "Flexible scale set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := gpuSet("gpu", 0, nil)
			spec.Flexible, spec.SinglePlacementGroup, spec.Image = tt.flexible, tt.spg, tt.image
			f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes(tt.nodes))
			f.refresh()
			g := f.group("gpu")
			if got := g.MaxSize(); got != tt.wantMax {
				t.Fatalf("MaxSize = %d, want %d", got, tt.wantMax)
			}
			sl, ok := g.(cloudprovider.SizeLimited)
			if !ok {
				t.Fatal("scale set node group does not implement SizeLimited")
			}
			configured, limit, why := sl.SizeLimit()
			if configured != mustSpec(t, tt.nodes).Max || limit != tt.wantLimit || why != tt.wantWhy {
				t.Fatalf("SizeLimit = %d, %d, %q; want %d, %d, %q", configured, limit, why, mustSpec(t, tt.nodes).Max, tt.wantLimit, tt.wantWhy)
			}
			// Up to the limit goes through; one more is refused before any call.
			if err := g.IncreaseSize(f.ctx, tt.wantMax); err != nil {
				t.Fatalf("IncreaseSize(%d): %v", tt.wantMax, err)
			}
			calls := patchCalls(f)
			if err := g.IncreaseSize(f.ctx, 1); err == nil {
				t.Fatalf("IncreaseSize past max %d succeeded", tt.wantMax)
			}
			if got := patchCalls(f); got != calls {
				t.Fatalf("a scale-up past the max was sent to ARM (%v → %v PATCHes)", calls, got)
			}
		})
	}
}

func mustSpec(t *testing.T, s string) cloudprovider.NodeGroupSpec {
	t.Helper()
	ng, err := cloudprovider.ParseNodeGroupSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	return ng
}

// patchCalls counts the scale set updates sent, from the ARM metrics.
func patchCalls(f *fixture) float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "vmss_autoscaler_arm_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" && l.GetValue() == "VirtualMachineScaleSetsClient.BeginUpdate" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// TestSizeLimitErrorsAreClassified: ARM's answers to a capacity beyond a
// scale set's limit, through the real client, are size-limit errors
// naming the limit, never quota or generic ones.
func TestSizeLimitErrorsAreClassified(t *testing.T) {
	tests := []struct {
		name      string
		spg       bool
		image     string
		capacity  int
		wantCode  string
		wantLimit int
	}{
		{"beyond 1,000", false, "", 1001, "InvalidParameter", 1000},
		{"managed image beyond 600", false, managedImageID, 601, "OperationNotAllowed", 600},
		{"single placement group beyond 100", true, "", 101, "OperationNotAllowed", 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := gpuSet("gpu", 0, nil)
			spec.SinglePlacementGroup, spec.Image = tt.spg, tt.image
			f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:5000:gpu"))
			f.refresh()
			g := f.p.groups[setKey("rg", "gpu")]
			_, raw := g.patchCapacity(f.ctx, tt.capacity, "")
			err := classify(raw)
			if !cloudprovider.IsSizeLimit(err) || cloudprovider.IsQuota(err) {
				t.Fatalf("class %s, want size-limit: %v", cloudprovider.ClassOf(err), err)
			}
			var ce *cloudprovider.Error
			if !errors.As(err, &ce) || ce.Code != tt.wantCode {
				t.Fatalf("code %v, want %s", ce, tt.wantCode)
			}
			if got := sizeLimitOf(raw); got != tt.wantLimit {
				t.Fatalf("sizeLimitOf = %d, want %d", got, tt.wantLimit)
			}
		})
	}
}

// TestRefusedSizeLowersMax: when ARM refuses a size the scale set's
// properties did not rule out, the error is a size-limit one and the
// group's max follows the limit ARM named.
func TestRefusedSizeLowersMax(t *testing.T) {
	spec := gpuSet("gpu", 95, nil)
	spec.SinglePlacementGroup = true
	f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:2500:gpu"))
	f.refresh()
	g := f.p.groups[setKey("rg", "gpu")]
	// As if the provider had read the scale set before it became a single
	// placement group: it believes 1,000 VMs fit.
	g.mu.Lock()
	g.limit, g.limitWhy = limitUniform, "Uniform scale set"
	g.mu.Unlock()
	err := g.IncreaseSize(f.ctx, 10)
	if !cloudprovider.IsSizeLimit(err) {
		t.Fatalf("IncreaseSize(10) at 95 = %v, want a size-limit error", err)
	}
	if got := g.MaxSize(); got != 100 {
		t.Fatalf("MaxSize = %d after ARM named a limit of 100", got)
	}
	if _, limit, why := g.SizeLimit(); limit != 100 || why == "" {
		t.Fatalf("SizeLimit = %d, %q", limit, why)
	}
	if err := g.IncreaseSize(f.ctx, 5); err != nil {
		t.Fatalf("IncreaseSize to the limit: %v", err)
	}
}

// TestLimitWarningLoggedOncePerChange: the clamp is logged at the first
// refresh and again only when it changes.
func TestLimitWarningLoggedOncePerChange(t *testing.T) {
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf)))
	spec := gpuSet("gpu", 0, nil)
	spec.SinglePlacementGroup = true
	f := newFixture(t, []armsim.ScaleSetSpec{spec}, withNodes("0:2500:gpu"))
	f.ctx = klog.NewContext(f.ctx, logger)
	warnings := func() int { return strings.Count(buf.String(), "more than its scale set can hold") }
	steps := []struct {
		name string
		do   func()
		want int
	}{
		{"first refresh", f.refresh, 1},
		{"same clamp", func() { f.expire(); f.refresh() }, 1},
		{"limit learned lower", func() {
			g := f.p.groups[setKey("rg", "gpu")]
			g.mu.Lock()
			g.learned = 50
			g.mu.Unlock()
			f.expire()
			f.refresh()
		}, 2},
	}
	for _, s := range steps {
		s.do()
		if got := warnings(); got != s.want {
			t.Fatalf("%s: %d warnings logged, want %d:\n%s", s.name, got, s.want, buf.String())
		}
	}
	for _, want := range []string{`configuredMax=2500`, `limit=100`, `reason="single placement group"`, `nodeGroup="gpu"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("warning lacks %s: %s", want, buf.String())
		}
	}
}
