package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotFiles are the plots writePlots makes (each also as PNG).
var plotFiles = []string{"joins.svg", "pending.svg", "loops.svg", "nodes.svg", "apiserver.svg"}

// line is one named series of a plot.
type line struct {
	name   string
	xy     plotter.XYs
	dashed bool
	color  int // the scenario's
}

func writePlots(dir string, scenarios []*result) error {
	var joins, pending, loops, nodes, api []line
	for i, r := range scenarios {
		var p99, rejected plotter.XYs
		for j, a := range r.APISeries {
			p99 = append(p99, plotter.XY{X: a.At / 60, Y: a.P99})
			if j > 0 {
				prev := r.APISeries[j-1]
				if dt := a.At - prev.At; dt > 0 {
					rejected = append(rejected, plotter.XY{X: a.At / 60, Y: 60 * (a.Rejected - prev.Rejected + a.Throttled - prev.Throttled) / dt})
				}
			}
		}
		api = append(api, line{name: r.Name + ": nodes joined in the last 60 s", xy: joinedPerMinute(r), color: i},
			line{name: r.Name + ": API server p99 latency (ms, 10 s intervals)", xy: p99, color: i, dashed: true},
			line{name: r.Name + ": APF rejections and 429s a minute", xy: rejected, color: i + len(scenarios)})
		joins = append(joins, line{name: r.Name + ": joined in the last 60 s", xy: joinedPerMinute(r), color: i})
		if r.Smoothing {
			joins = append(joins, line{name: r.Name + ": node-addition rate", xy: rate(r), dashed: true, color: i})
		}
		var pend, unsched, n, loop plotter.XYs
		for _, p := range r.Series {
			pend = append(pend, plotter.XY{X: p.At / 60, Y: float64(p.Pending)})
			unsched = append(unsched, plotter.XY{X: p.At / 60, Y: p.Unschedulable})
			n = append(n, plotter.XY{X: p.At / 60, Y: float64(p.Nodes)})
		}
		for _, l := range r.LoopSeries {
			loop = append(loop, plotter.XY{X: l.At / 60, Y: l.Seconds})
		}
		pending = append(pending, line{name: r.Name + ": pending", xy: pend, color: i},
			line{name: r.Name + ": unschedulable (the autoscaler's view)", xy: unsched, color: i, dashed: true})
		nodes = append(nodes, line{name: r.Name, xy: n, color: i})
		loops = append(loops, line{name: r.Name, xy: loop, color: i})
	}
	plots := []struct {
		file, title, y string
		lines          []line
	}{
		{"joins.svg", "Nodes joined per minute against the node-addition rate", "nodes / minute", joins},
		{"pending.svg", "Pending pods, and those the scheduler has marked unschedulable", "pods", pending},
		{"loops.svg", "Autoscaler loop duration", "seconds", loops},
		{"nodes.svg", "Nodes (scale-up, then scale-down under the brake)", "nodes", nodes},
		{"apiserver.svg", "Joins per minute against API-server latency and flow-control rejections", "nodes / minute; ms; rejections / minute", api},
	}
	for _, p := range plots {
		if err := savePlot(filepath.Join(dir, p.file), p.title, p.y, p.lines); err != nil {
			return err
		}
	}
	return nil
}

func savePlot(path, title, y string, lines []line) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "minutes since the workload was submitted"
	p.Y.Label.Text = y
	p.Y.Min = 0
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	for _, l := range lines {
		if len(l.xy) == 0 {
			continue
		}
		pl, err := plotter.NewLine(l.xy)
		if err != nil {
			return fmt.Errorf("plotting %s in %s: %w", l.name, path, err)
		}
		pl.Color = plotutil.Color(l.color)
		pl.Width = vg.Points(1.5)
		if l.dashed {
			pl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(pl)
		p.Legend.Add(l.name, pl)
	}
	// SVG for the docs, PNG beside it for viewers without SVG.
	for _, f := range []string{path, strings.TrimSuffix(path, ".svg") + ".png"} {
		if err := p.Save(9*vg.Inch, 4.5*vg.Inch, f); err != nil {
			return fmt.Errorf("writing %s: %w", f, err)
		}
	}
	return nil
}

// joinedPerMinute is, at each sample, the nodes that joined in the 60 s
// before it.
func joinedPerMinute(r *result) plotter.XYs {
	var out plotter.XYs
	j, k := 0, 0
	for _, p := range r.Series {
		for j < len(r.Joins) && r.Joins[j] <= p.At {
			j++
		}
		for k < j && r.Joins[k] <= p.At-60 {
			k++
		}
		out = append(out, plotter.XY{X: p.At / 60, Y: float64(j - k)})
	}
	return out
}

func rate(r *result) plotter.XYs {
	var out plotter.XYs
	for _, p := range r.Series {
		if p.Rate > 0 {
			out = append(out, plotter.XY{X: p.At / 60, Y: p.Rate})
		}
	}
	return out
}
