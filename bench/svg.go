package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Series is one curve of a CDF plot.
type Series struct {
	Label string
	// Points are [value, cumulative fraction] pairs sorted by value, as in
	// Report.TTFTCDF.
	Points [][2]float64
}

// SeriesOf returns the TTFT CDF of a report as a plot series; label
// overrides the report's own label when not empty.
func SeriesOf(r *Report, label string) Series {
	if label == "" {
		label = r.Config.Label
	}
	label += fmt.Sprintf(" (p50 %.2f ms, p99 %.2f ms)", r.TTFT.P50, r.TTFT.P99)
	return Series{Label: label, Points: r.TTFTCDF}
}

// Plot geometry, in SVG user units. The legend goes under the chart, one
// row per series, so long labels never run off the image.
const (
	svgWidth     = 960
	plotLeft     = 80
	plotRight    = 920
	plotTop      = 60
	plotBottom   = 470
	legendTop    = plotBottom + 80
	legendRowGap = 22
)

// palette is a set of colours that stay apart for colour-blind readers;
// after it runs out the dash pattern changes.
var palette = []string{"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442"}

var dashes = []string{"", "6 3", "2 3", "8 3 2 3"}

// WriteCDFSVG draws the series as step-function CDFs on one chart with a
// linear millisecond axis and writes a standalone SVG document.
func WriteCDFSVG(w io.Writer, title, xLabel string, series []Series) error {
	xmax := 0.0
	for _, s := range series {
		for _, p := range s.Points {
			xmax = max(xmax, p[0])
		}
	}
	step := niceStep(xmax / 6)
	xmax = math.Ceil(xmax/step) * step
	if xmax <= 0 {
		xmax, step = 1, 0.2
	}
	sx := func(v float64) float64 { return plotLeft + (plotRight-plotLeft)*v/xmax }
	sy := func(f float64) float64 { return plotBottom - (plotBottom-plotTop)*f }

	svgHeight := legendTop + legendRowGap*len(series) + 10
	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">
<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>
`, svgWidth, svgHeight, svgWidth, svgHeight, svgWidth, svgHeight)
	text := func(x, y float64, anchor, extra, s string) {
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="%s"%s>`, fmtNum(x), fmtNum(y), anchor, extra)
		_ = xml.EscapeText(&b, []byte(s))
		b.WriteString("</text>\n")
	}
	text(svgWidth/2, 32, "middle", ` font-size="17" font-weight="bold"`, title)

	// Grid and ticks.
	b.WriteString(`<g stroke="#dddddd" stroke-width="1">` + "\n")
	for k := 0; k <= 10; k++ {
		y := sy(float64(k) / 10)
		fmt.Fprintf(&b, `<line x1="%d" y1="%s" x2="%d" y2="%s"/>`+"\n", plotLeft, fmtNum(y), plotRight, fmtNum(y))
	}
	for v := 0.0; v <= xmax+step/2; v += step {
		x := sx(v)
		fmt.Fprintf(&b, `<line x1="%s" y1="%d" x2="%s" y2="%d"/>`+"\n", fmtNum(x), plotTop, fmtNum(x), plotBottom)
	}
	b.WriteString("</g>\n")
	for k := 0; k <= 10; k += 2 {
		text(plotLeft-8, sy(float64(k)/10)+4, "end", "", strconv.FormatFloat(float64(k)/10, 'f', 1, 64))
	}
	for v := 0.0; v <= xmax+step/2; v += step {
		text(sx(v), plotBottom+18, "middle", "", fmtNum(v))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333333"/>`+"\n",
		plotLeft, plotTop, plotRight-plotLeft, plotBottom-plotTop)
	text((plotLeft+plotRight)/2, plotBottom+42, "middle", "", xLabel)
	text(22, (plotTop+plotBottom)/2, "middle", fmt.Sprintf(` transform="rotate(-90 22 %d)"`, (plotTop+plotBottom)/2),
		"fraction of requests ≤ x")

	for i, s := range series {
		color := palette[i%len(palette)]
		dash := dashes[(i/len(palette))%len(dashes)]
		dashAttr := ""
		if dash != "" {
			dashAttr = ` stroke-dasharray="` + dash + `"`
		}
		if len(s.Points) > 0 {
			fmt.Fprintf(&b, `<path fill="none" stroke="%s" stroke-width="2"%s d="M%s %s`, color, dashAttr,
				fmtNum(sx(s.Points[0][0])), fmtNum(sy(0)))
			prev := 0.0
			for _, p := range s.Points {
				x := fmtNum(sx(p[0]))
				fmt.Fprintf(&b, " L%s %s L%s %s", x, fmtNum(sy(prev)), x, fmtNum(sy(p[1])))
				prev = p[1]
			}
			b.WriteString(`"/>` + "\n")
		}
		y := float64(legendTop + i*legendRowGap)
		fmt.Fprintf(&b, `<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="%s" stroke-width="3"%s/>`+"\n",
			plotLeft, fmtNum(y), plotLeft+24, fmtNum(y), color, dashAttr)
		text(plotLeft+30, y+4, "start", "", s.Label)
	}
	b.WriteString("</svg>\n")
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write svg: %w", err)
	}
	return nil
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten, for axis ticks.
func niceStep(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// fmtNum prints a number compactly: at most three decimals, no trailing zeros.
func fmtNum(v float64) string {
	s := strconv.FormatFloat(v, 'f', 3, 64)
	for len(s) > 1 && s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}
