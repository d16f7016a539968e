package armsim

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
)

const managedImage = "/subscriptions/" + testSub + "/resourceGroups/images/providers/Microsoft.Compute/images/gpu-node-2026"

// TestCapacityLimits: the simulator holds a scale set to what Azure lets
// it hold, answering a PATCH beyond it as ARM does and changing nothing.
func TestCapacityLimits(t *testing.T) {
	galleryImage := "/subscriptions/" + testSub + "/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/gpu/versions/1.0.0"
	tests := []struct {
		name       string
		spec       ScaleSetSpec
		ok         int64 // the largest capacity accepted
		wantStatus int
		wantCode   string
		wantMsg    string
	}{
		{"uniform, platform image", ScaleSetSpec{}, 1000, http.StatusBadRequest, "InvalidParameter",
			"The value 1001 of parameter 'sku.capacity' is out of range. The value must be between 0 and 1000, inclusive."},
		{"uniform, gallery image", ScaleSetSpec{Image: galleryImage}, 1000, http.StatusBadRequest, "InvalidParameter",
			"The value 1001 of parameter 'sku.capacity' is out of range"},
		{"managed custom image", ScaleSetSpec{Image: managedImage}, 600, http.StatusConflict, "OperationNotAllowed",
			"Unable to create or update VirtualMachineScaleSet 'pool' as it exceeds the total limit of '600' Virtual Machine instances."},
		{"single placement group", ScaleSetSpec{SinglePlacementGroup: true}, 100, http.StatusConflict, "OperationNotAllowed",
			"Unable to create or update VirtualMachineScaleSet 'pool' as it exceeds the total limit of '100' Virtual Machine instances."},
		{"single placement group and managed image", ScaleSetSpec{SinglePlacementGroup: true, Image: managedImage}, 100, http.StatusConflict, "OperationNotAllowed",
			"exceeds the total limit of '100'"},
		{"single placement group raised to 300 on request", ScaleSetSpec{SinglePlacementGroup: true, PlacementGroupLimit: 300}, 300, http.StatusConflict, "OperationNotAllowed",
			"Unable to create or update VirtualMachineScaleSet 'pool' as it exceeds the total limit of '300' Virtual Machine instances."},
		{"single placement group raised to 200", ScaleSetSpec{SinglePlacementGroup: true, PlacementGroupLimit: 200}, 200, http.StatusConflict, "OperationNotAllowed",
			"exceeds the total limit of '200'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec
			spec.ResourceGroup, spec.Name, spec.SKU, spec.Capacity = testRG, "pool", "Standard_D16s_v5", 1
			env := newTestEnv(t, Options{}, spec)
			ctx := context.Background()
			before := env.state(t, "pool")
			_, err := env.scaleTo(ctx, "pool", tt.ok+1, to.Ptr(before.ETag))
			re := responseError(t, err)
			if re.StatusCode != tt.wantStatus || re.ErrorCode != tt.wantCode || !strings.Contains(re.Error(), tt.wantMsg) {
				t.Fatalf("capacity %d: got %d %s\n%v\nwant %d %s %q", tt.ok+1, re.StatusCode, re.ErrorCode, re, tt.wantStatus, tt.wantCode, tt.wantMsg)
			}
			if after := env.state(t, "pool"); after.Capacity != 1 || after.ETag != before.ETag {
				t.Fatalf("refused PATCH changed the scale set: %+v", after)
			}
			if _, err := env.scaleTo(ctx, "pool", tt.ok, nil); err != nil {
				t.Fatalf("capacity %d refused: %v", tt.ok, err)
			}
			if got := env.state(t, "pool").Capacity; int64(got) != tt.ok {
				t.Fatalf("capacity %d after scaling to %d", got, tt.ok)
			}
			// The scale set reports the properties that set its limit.
			got, err := env.sets.Get(ctx, testRG, "pool", nil)
			if err != nil {
				t.Fatal(err)
			}
			if spg := got.Properties.SinglePlacementGroup; spg == nil || *spg != tt.spec.SinglePlacementGroup {
				t.Errorf("singlePlacementGroup = %v, want %v", spg, tt.spec.SinglePlacementGroup)
			}
			ref := got.Properties.VirtualMachineProfile.StorageProfile.ImageReference
			if tt.spec.Image != "" && (ref.ID == nil || *ref.ID != tt.spec.Image) {
				t.Errorf("imageReference %+v, want id %s", ref, tt.spec.Image)
			}
			if tt.spec.Image == "" && (ref.ID != nil || ref.Publisher == nil) {
				t.Errorf("imageReference %+v, want a platform image", ref)
			}
			if err := env.srv.SetCapacity(testRG, "pool", int(tt.ok)+1); err == nil {
				t.Errorf("SetCapacity(%d) beyond the limit succeeded", tt.ok+1)
			}
		})
	}
}

func TestAddScaleSetRefusesCapacityBeyondLimit(t *testing.T) {
	srv, err := New(Options{SubscriptionID: testSub})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec ScaleSetSpec
		ok   bool
	}{
		{"1000, uniform", ScaleSetSpec{Name: "a", Capacity: 1000}, true},
		{"1001, uniform", ScaleSetSpec{Name: "b", Capacity: 1001}, false},
		{"600, managed image", ScaleSetSpec{Name: "c", Capacity: 600, Image: managedImage}, true},
		{"601, managed image", ScaleSetSpec{Name: "d", Capacity: 601, Image: managedImage}, false},
		{"101, single placement group", ScaleSetSpec{Name: "e", Capacity: 101, SinglePlacementGroup: true}, false},
		{"300, single placement group raised to 300", ScaleSetSpec{Name: "f", Capacity: 300, SinglePlacementGroup: true, PlacementGroupLimit: 300}, true},
		{"301, single placement group raised to 300", ScaleSetSpec{Name: "g", Capacity: 301, SinglePlacementGroup: true, PlacementGroupLimit: 300}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec
			spec.ResourceGroup, spec.SKU = testRG, "Standard_D16s_v5"
			err := srv.AddScaleSet(spec)
			if (err == nil) != tt.ok {
				t.Fatalf("AddScaleSet(capacity %d) = %v, want ok=%v", spec.Capacity, err, tt.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "capacity") {
				t.Errorf("error %q does not name the capacity", err)
			}
		})
	}
}

// TestPlacementGroupLimitRefused: the cap is raised only for a single
// placement group, and only up to 300.
func TestPlacementGroupLimitRefused(t *testing.T) {
	srv, err := New(Options{SubscriptionID: testSub})
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []ScaleSetSpec{
		{Name: "a", PlacementGroupLimit: 300},
		{Name: "b", PlacementGroupLimit: 301, SinglePlacementGroup: true},
		{Name: "c", PlacementGroupLimit: 99, SinglePlacementGroup: true},
	} {
		spec.ResourceGroup, spec.SKU = testRG, "Standard_D16s_v5"
		if err := srv.AddScaleSet(spec); err == nil || !strings.Contains(err.Error(), "placement group limit") {
			t.Errorf("AddScaleSet(%+v) = %v, want a refusal naming the placement group limit", spec, err)
		}
	}
}
