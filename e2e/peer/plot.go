package main

import (
	"fmt"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotName is the plot of one size, written as SVG and PNG.
func plotName(pods int, ext string) string { return fmt.Sprintf("running-%d.%s", pods, ext) }

// writePlots draws, per size, the pods Running over time of each run.
func writePlots(dir string, rep *report) error {
	for _, n := range rep.Sizes {
		p := newRunningPlot(n)
		drawn := 0
		for _, r := range rep.sorted() {
			if r.Pods != n || len(r.Series) == 0 {
				continue
			}
			l, label, err := runLine(r)
			if err != nil {
				return fmt.Errorf("plotting %s %d: %w", r.Run, n, err)
			}
			p.Add(l)
			p.Legend.Add(label, l)
			drawn++
		}
		if drawn == 0 {
			continue
		}
		if err := savePlot(dir, p, n); err != nil {
			return err
		}
	}
	return nil
}

// newRunningPlot is the empty plot of pods Running for size n.
func newRunningPlot(n int) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Pods Running, %s pods of 2 CPU / 2 Gi", fmtInt(n))
	p.X.Label.Text = "seconds since the Deployment was created"
	p.Y.Label.Text = "pods Running"
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p
}

// runLine is r's pods Running over time, in its run's colour (the floor
// dashed), and its legend.
func runLine(r *result) (*plotter.Line, string, error) {
	xy := make(plotter.XYs, len(r.Series))
	for i, s := range r.Series {
		xy[i] = plotter.XY{X: s.At, Y: float64(s.Running)}
	}
	l, err := plotter.NewLine(xy)
	if err != nil {
		return nil, "", err
	}
	l.Color = plotutil.Color(slices.Index(runNames, r.Run))
	l.Width = vg.Points(1.5)
	if r.Run == runFloor {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	label := r.Run
	if r.AllRunning != nil {
		label = fmt.Sprintf("%s: all Running at %.1f s", r.Run, *r.AllRunning)
	}
	return l, label, nil
}

// savePlot writes p, the plot of size n, to dir as SVG and PNG.
func savePlot(dir string, p *plot.Plot, n int) error {
	for _, ext := range []string{"svg", "png"} {
		if err := p.Save(9*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, plotName(n, ext))); err != nil {
			return fmt.Errorf("writing %s: %w", plotName(n, ext), err)
		}
	}
	return nil
}
