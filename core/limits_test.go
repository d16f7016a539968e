package core

import (
	"testing"

	"sigs.k8s.io/yaml"
)

// TestScaleUpStopsAtScaleSetLimit: a group whose configured max is more
// than its scale set holds grows to the limit, and the status says why it
// stops there.
func TestScaleUpStopsAtScaleSetLimit(t *testing.T) {
	e := newEnv(t)
	g := e.provider.AddGroup("gpu-a100", 0, 25, gpuTemplate("gpu-a100"))
	g.SetSizeLimit(10, "single placement group")
	e.start()
	e.add(pendingPods(15, "train", wholeGPU()...))
	e.run()
	if got := sum(g.Increases()); got != 10 {
		t.Fatalf("increases %v (total %d), want 10: the scale set's limit", g.Increases(), got)
	}
	if len(e.status.writes) == 0 {
		t.Fatal("no status written")
	}
	var st Status
	if err := yaml.Unmarshal([]byte(e.status.writes[len(e.status.writes)-1]), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.NodeGroups) != 1 {
		t.Fatalf("status node groups %+v", st.NodeGroups)
	}
	gs := st.NodeGroups[0]
	want := "configured max 25 is more than the node group can hold (10: single placement group); max is 10"
	if gs.Max != 10 || gs.MaxWarning != want {
		t.Fatalf("status max %d, warning %q; want 10, %q", gs.Max, gs.MaxWarning, want)
	}
}
