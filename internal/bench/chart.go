package bench

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one target's bars in the chart: a value per mode, in the chart's mode order (absent modes 0).
type Series struct {
	Name   string
	Target string
}

// palette colours the series in order: the baseline, the ceiling, the schema ceiling, retrysafe, the growth run
// (without the ceilings, retrysafe takes the second colour).
var palette = []color.Color{
	color.RGBA{R: 0x88, G: 0x88, B: 0x88, A: 0xff}, // grey
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // orange
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
}

// Chart draws two panels into a PNG at path: requests per second and p99 latency per mode, one bar per series
// beside each other. title goes above both.
func Chart(path, title string, rows []Result, modes []string, series []Series) error {
	rps, err := panel(rows, modes, series, "requests per second (higher is better)", "req/s",
		func(r Result) float64 { return r.RPS })
	if err != nil {
		return err
	}
	p99, err := panel(rows, modes, series, "p99 latency (lower is better)", "ms",
		func(r Result) float64 { return float64(r.P99.Microseconds()) / 1000 })
	if err != nil {
		return err
	}
	const w, h = 12 * vg.Inch, 5 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	// The title across the top, the panels below it.
	top := dc
	top.Min.Y = top.Max.Y - vg.Points(26)
	top.FillText(draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 13), Handler: plot.DefaultTextHandler,
		XAlign: draw.XCenter, YAlign: draw.YCenter}, vg.Point{X: (top.Min.X + top.Max.X) / 2, Y: (top.Min.Y + top.Max.Y) / 2}, title)
	body := dc
	body.Max.Y -= vg.Points(28)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 2,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4, PadBottom: vg.Millimeter * 2}
	plots := [][]*plot.Plot{{rps, p99}}
	canvases := plot.Align(plots, tiles, body)
	rps.Draw(canvases[0][0])
	p99.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func panel(rows []Result, modes []string, series []Series, title, unit string, value func(Result) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	width := vg.Points(28)
	top := 0.0
	for i, s := range series {
		vals := make(plotter.Values, len(modes))
		for j, m := range modes {
			if r, ok := Find(rows, s.Target, m); ok {
				vals[j] = value(r)
				top = max(top, vals[j])
			}
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", s.Name, err)
		}
		bars.Color = palette[i%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(bars)
		p.Legend.Add(s.Name, bars)
		// The figure above each bar: the chart is read for ratios, the figures make them checkable.
		labels, err := barLabels(vals, bars.Offset)
		if err == nil {
			p.Add(labels)
		}
	}
	p.Legend.Top = true
	p.Legend.Left = false
	p.NominalX(modes...)
	// Room above the highest bar for its figure and the legend.
	p.Y.Max = top * 1.35
	return p, nil
}

func barLabels(vals plotter.Values, offset vg.Length) (*plotter.Labels, error) {
	xys := make(plotter.XYs, len(vals))
	texts := make([]string, len(vals))
	for i, v := range vals {
		xys[i] = plotter.XY{X: float64(i), Y: v}
		switch {
		case v == 0:
			texts[i] = ""
		case v < 10:
			texts[i] = fmt.Sprintf("%.1f", v)
		default:
			texts[i] = fmt.Sprintf("%.0f", v)
		}
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].XAlign = draw.XCenter
		l.TextStyle[i].YAlign = draw.YBottom
		l.TextStyle[i].Font.Size = vg.Points(8)
	}
	l.Offset = vg.Point{X: offset, Y: vg.Points(2)}
	return l, nil
}
