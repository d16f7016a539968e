package dashboards

//lint:file-ignore SA1019 The chart ships classic dashboard JSON (dashboard v1), the model the Grafana sidecar provisions on every Grafana version; the SDK marks it deprecated in favour of dashboardv2, which only Grafana 12's new dashboard API reads.

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Every panel and variable queries the Prometheus data source the
// dashboard's $datasource variable picks.
func datasource() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
}

// The variables: $job (the scraped autoscaler) and $node_group (all by
// default). Panel queries filter with job=~"$job" and, per group,
// node_group=~"$node_group".
const (
	jobVariableQuery       = `label_values(vmss_autoscaler_loop_duration_seconds_count, job)`
	nodeGroupVariableQuery = `label_values(vmss_autoscaler_node_group_max_size{job=~"$job"}, node_group)`
)

// newDashboard is a dashboard with what all of the chart's share: uid
// vmss-autoscaler-<name>, tags, links to each other, the last 6 hours
// refreshed every 30 s, a shared crosshair, and the variables.
func newDashboard(name, title, description string) *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder(title).
		Uid("vmss-autoscaler-"+name).
		Description(description).
		Tags([]string{"vmss-autoscaler", "autoscaling"}).
		Timezone("browser").
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Time("now-6h", "now").
		Refresh("30s").
		Link(dashboard.NewDashboardLinkBuilder("vmss-autoscaler").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{"vmss-autoscaler"}).
			AsDropdown(true)).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
			Label("Data source").
			Type("prometheus")).
		WithVariable(queryVariable("job", "Job", jobVariableQuery).
			Sort(dashboard.VariableSortAlphabeticalAsc)).
		WithVariable(queryVariable("node_group", "Node group", nodeGroupVariableQuery).
			Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).
			IncludeAll(true).
			AllValue(".*").
			Current(dashboard.VariableOption{
				Selected: cog.ToPtr(true),
				Text:     dashboard.StringOrArrayOfString{ArrayOfString: []string{"All"}},
				Value:    dashboard.StringOrArrayOfString{ArrayOfString: []string{"$__all"}},
			}))
}

func queryVariable(name, label, query string) *dashboard.QueryVariableBuilder {
	return dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Datasource(datasource()).
		Query(dashboard.StringOrMap{Map: map[string]any{"query": query, "refId": name}}).
		Definition(query).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged)
}

// query is one PromQL target of a panel and its legend.
type query struct{ expr, legend string }

func q(expr, legend string) query { return query{expr, legend} }

// targets are range queries with refIds A, B, ...
func targets(qs []query) []cog.Builder[variants.Dataquery] {
	out := make([]cog.Builder[variants.Dataquery], 0, len(qs))
	for i, x := range qs {
		out = append(out, prometheus.NewDataqueryBuilder().
			RefId(string(rune('A'+i))).
			Expr(x.expr).
			LegendFormat(x.legend).
			Datasource(datasource()).
			Range())
	}
	return out
}

// panelHeight is every panel's height but the tall ones'.
const panelHeight = 8

// series is a time series panel of lines, span w of 24 columns.
func series(title, unit string, w uint32, qs ...query) *timeseries.PanelBuilder {
	return timeseries.NewPanelBuilder().
		Title(title).
		Datasource(datasource()).
		Span(w).
		Height(panelHeight).
		Unit(unit).
		DrawStyle(common.GraphDrawStyleLine).
		LineWidth(1).
		FillOpacity(10).
		ShowPoints(common.VisibilityModeNever).
		Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNone).Group("A")).
		Legend(common.NewVizLegendOptionsBuilder().
			ShowLegend(true).
			DisplayMode(common.LegendDisplayModeTable).
			Placement(common.LegendPlacementBottom).
			Calcs([]string{"lastNotNull", "max"})).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)).
		Targets(targets(qs))
}

// stacked is a time series panel whose series stack.
func stacked(title, unit string, w uint32, qs ...query) *timeseries.PanelBuilder {
	return series(title, unit, w, qs...).
		Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal).Group("A"))
}

// single is a stat panel of the last value.
func single(title, unit string, w uint32, qs ...query) *stat.PanelBuilder {
	return stat.NewPanelBuilder().
		Title(title).
		Datasource(datasource()).
		Span(w).
		Height(panelHeight).
		Unit(unit).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Fields("").Values(false)).
		ColorMode(common.BigValueColorModeValue).
		GraphMode(common.BigValueGraphModeArea).
		TextMode(common.BigValueTextModeAuto).
		Orientation(common.VizOrientationAuto).
		Targets(targets(qs))
}

// timeline is a state timeline: one row per series, a value while it holds.
func timeline(title, unit string, w uint32, qs ...query) *statetimeline.PanelBuilder {
	return statetimeline.NewPanelBuilder().
		Title(title).
		Datasource(datasource()).
		Span(w).
		Height(panelHeight).
		Unit(unit).
		ShowValue(common.VisibilityModeNever).
		MergeValues(true).
		RowHeight(0.9).
		Legend(common.NewVizLegendOptionsBuilder().
			ShowLegend(true).
			DisplayMode(common.LegendDisplayModeList).
			Placement(common.LegendPlacementBottom)).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeSingle).Sort(common.SortOrderNone)).
		Targets(targets(qs))
}

// thresholds colours a value green, then each color from its value up.
func thresholds(steps ...dashboard.Threshold) *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().
		Mode(dashboard.ThresholdsModeAbsolute).
		Steps(append([]dashboard.Threshold{{Color: "green"}}, steps...))
}

func step(color string, from float64) dashboard.Threshold {
	return dashboard.Threshold{Color: color, Value: cog.ToPtr(from)}
}

func row(title string) *dashboard.RowBuilder { return dashboard.NewRowBuilder(title) }
