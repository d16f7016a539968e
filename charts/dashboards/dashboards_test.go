package dashboards

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// committedDir is where the chart reads the dashboards from.
const committedDir = "../vmss-autoscaler/dashboards"

// TestCommittedJSONIsGenerated fails when the dashboards' JSON in the
// chart is not what this package generates: edited by hand, or the Go
// changed without `go generate ./charts/dashboards` (make dashboards).
func TestCommittedJSONIsGenerated(t *testing.T) {
	files, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(All()) || len(files) < 5 {
		t.Fatalf("%d dashboards rendered", len(files))
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(committedDir, name))
		if err != nil {
			t.Errorf("%s: %v (run go generate ./charts/dashboards)", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is out of date: run go generate ./charts/dashboards (make dashboards) and commit the JSON", name)
		}
	}
	committed, err := filepath.Glob(filepath.Join(committedDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var extra []string
	for _, p := range committed {
		if _, ok := files[filepath.Base(p)]; !ok {
			extra = append(extra, filepath.Base(p))
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("%v in %s are not generated: define them in Go or remove them", extra, committedDir)
	}
}

// TestRenderIsStable: two renders give the same bytes (no map order or
// time in the output), and ids are 1..n in panel order.
func TestRenderIsStable(t *testing.T) {
	a, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	for name := range a {
		if !bytes.Equal(a[name], b[name]) {
			t.Errorf("%s differs between two renders", name)
		}
	}
	for _, d := range All() {
		built, err := d.Build().Build()
		if err != nil {
			t.Fatal(err)
		}
		number(&built)
		for i, p := range built.Panels {
			var id uint32
			switch {
			case p.Panel != nil && p.Panel.Id != nil:
				id = *p.Panel.Id
			case p.RowPanel != nil:
				id = p.RowPanel.Id
			}
			if id != uint32(i+1) {
				t.Errorf("%s: panel %d has id %d", d.Name, i, id)
			}
		}
	}
}

// TestCapacityRequestsPanels: the Capacity requests dashboard has a
// description on every panel (what an SRE reads at 3 a.m.) and queries
// both the ProvisioningRequests' and the CapacityBuffers' metrics.
func TestCapacityRequestsPanels(t *testing.T) {
	built, err := capacityRequests().Build()
	if err != nil {
		t.Fatal(err)
	}
	var panels int
	queried := map[string]bool{}
	for _, p := range built.Panels {
		if p.Panel == nil {
			continue
		}
		panels++
		if p.Panel.Description == nil || *p.Panel.Description == "" {
			t.Errorf("panel %q has no description", *p.Panel.Title)
		}
		for _, target := range p.Panel.Targets {
			data, err := json.Marshal(target)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []string{"vmss_autoscaler_provisioning_requests", "vmss_autoscaler_provisioning_request_booked_pods",
				"vmss_autoscaler_provisioning_request_booked_gpus", "vmss_autoscaler_provisioning_request_provision_duration_seconds_bucket",
				"vmss_autoscaler_provisioning_request_provision_duration_seconds_count", "vmss_autoscaler_capacity_buffers",
				"vmss_autoscaler_capacity_buffer_pods"} {
				if bytes.Contains(data, []byte(m+"{")) {
					queried[m] = true
				}
			}
		}
	}
	if panels < 8 {
		t.Errorf("%d panels", panels)
	}
	if len(queried) != 7 {
		t.Errorf("metrics queried: %v, want all 7", queried)
	}
}
