// Package dashboards defines the Helm chart's Grafana dashboards in Go,
// typed and schema-checked by grafana-foundation-sdk. The generator (gen,
// run by `go generate ./charts/dashboards` or `make dashboards`) writes
// them as JSON into charts/vmss-autoscaler/dashboards, where the chart
// picks them up; a test fails when the committed JSON is not what this
// package generates, so the JSON is never edited by hand.
package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

//go:generate go run ./gen --dir ../vmss-autoscaler/dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// Dashboard is one dashboard: its file name (without .json) and how to
// build it.
type Dashboard struct {
	Name  string
	Build func() *dashboard.DashboardBuilder
}

// All lists the chart's dashboards.
func All() []Dashboard {
	return []Dashboard{
		{"overview", overview},
		{"smoothing", smoothing},
		{"preflight", preflight},
		{"balloons", balloons},
		{"arm", arm},
		{"health", health},
		{"capacity-requests", capacityRequests},
	}
}

// Render builds every dashboard and returns its JSON (indented, ending in
// a newline) by file name.
func Render() (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, d := range All() {
		data, err := render(d)
		if err != nil {
			return nil, err
		}
		out[d.Name+".json"] = data
	}
	return out, nil
}

func render(d Dashboard) ([]byte, error) {
	built, err := d.Build().Build()
	if err != nil {
		return nil, fmt.Errorf("dashboard %s: %w", d.Name, err)
	}
	number(&built)
	for i := range built.Links {
		// Links above the panels, as on every Grafana version (the SDK's
		// default places them in Grafana 12's controls menu).
		built.Links[i].Placement = nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // PromQL's "<" and ">" stay readable
	if err := enc.Encode(built); err != nil {
		return nil, fmt.Errorf("dashboard %s: encoding JSON: %w", d.Name, err)
	}
	return buf.Bytes(), nil
}

// number gives rows and panels the ids 1, 2, ... in order: Grafana needs
// them unique within a dashboard, and stable ids keep links to panels.
func number(d *dashboard.Dashboard) {
	var id uint32
	for _, p := range d.Panels {
		id++
		switch {
		case p.Panel != nil:
			v := id
			p.Panel.Id = &v
		case p.RowPanel != nil:
			p.RowPanel.Id = id
		}
	}
}
