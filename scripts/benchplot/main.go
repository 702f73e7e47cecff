// Command benchplot draws the chart of scripts/bench from the raw output of the
// otelpgxtx benchmarks (go test -bench format, any number of rounds):
//
//   - tx/s against goroutines for the variants a–e and i (BenchmarkTxScale, write), sampled
//     and unsampled;
//   - the client's CPU time per transaction against goroutines (sampled);
//   - per added round-trip time (BenchmarkTx, write, sampled), the time of one
//     transaction split into client CPU, server CPU and waiting.
//
// Every point is the median over the rounds.
//
//	benchplot -o bench/latest.svg bench/<run>/raw.txt
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// variants in chart order, with their legend labels.
var variants = []struct{ key, label string }{
	{"a_pgx", "a pgx"},
	{"b_otelpgx", "b otelpgx"},
	{"c_otelpgxtx", "c InstrumentPool"},
	{"d_run", "d Run"},
	{"e_run_capture", "e Run+capture"},
	{"i_otelpgxtx_spans", "i every statement span"},
}

const (
	unitTPS    = "tx/s"
	unitClient = "client-µs/tx"
	unitServer = "server-µs/tx"
)

func main() {
	out := flag.String("o", "latest.svg", "the SVG file to write (PNG if it ends in .png)")
	title := flag.String("title", "otelpgxtx", "a line above the chart (machine, date)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: benchplot [-o chart.svg] [-title text] raw.txt...")
		os.Exit(2)
	}
	if err := run(*out, *title, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func run(out, title string, files []string) error {
	s := samples{}
	for _, name := range files {
		if err := s.read(name); err != nil {
			return err
		}
	}
	var plots []*plot.Plot
	for _, sampling := range []string{"sampled", "unsampled"} {
		p, err := s.scaling(sampling, unitTPS, "Throughput, write, "+sampling, "transactions/s")
		if err != nil {
			return err
		}
		if p != nil {
			plots = append(plots, p)
		}
	}
	p, err := s.scaling("sampled", unitClient, "Client CPU, write, sampled", "µs per transaction")
	if err != nil {
		return err
	}
	if p != nil {
		plots = append(plots, p)
	}
	for _, rtt := range s.rtts() {
		p, err := s.cost(rtt)
		if err != nil {
			return err
		}
		plots = append(plots, p)
	}
	if len(plots) == 0 {
		return errors.New("no BenchmarkTx or BenchmarkTxScale figures to draw")
	}
	return draw2(out, title, plots)
}

// samples holds every value by benchmark name (without -GOMAXPROCS) and unit.
type samples map[string]map[string][]float64

func (s samples) read(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	r := benchfmt.NewReader(f, name)
	for r.Scan() {
		res, ok := r.Result().(*benchfmt.Result)
		if !ok {
			continue // unit metadata or a syntax error: not a figure
		}
		base, parts := res.Name.Parts()
		key := string(base)
		for _, p := range parts {
			if !strings.HasPrefix(string(p), "-") { // "-2" is GOMAXPROCS
				key += string(p)
			}
		}
		if s[key] == nil {
			s[key] = map[string][]float64{}
		}
		for _, v := range res.Values {
			s[key][v.Unit] = append(s[key][v.Unit], v.Value)
		}
	}
	return r.Err()
}

// median of the values of name in unit, and whether there are any.
func (s samples) median(name, unit string) (float64, bool) {
	v := slices.Clone(s[name][unit])
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2, true
	}
	return v[len(v)/2], true
}

// keyValues returns the values of key ("g", "rtt") in benchmark names that start with
// prefix, sorted by number.
func (s samples) keyValues(prefix, key string) []string {
	seen := map[string]bool{}
	for name := range s {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for part := range strings.SplitSeq(name, "/") {
			if v, ok := strings.CutPrefix(part, key+"="); ok {
				seen[v] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Compare(leadingNumber(a), leadingNumber(b)) })
	return out
}

func (s samples) rtts() []string { return s.keyValues("Tx/", "rtt") }

func leadingNumber(s string) float64 {
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(s)
	}
	f, _ := strconv.ParseFloat(s[:i], 64)
	return f
}

// scaling plots unit against goroutines (BenchmarkTxScale, write) for every variant,
// on a log2 goroutine axis; nil if there are no such figures.
func (s samples) scaling(sampling, unit, title, ylabel string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "goroutines (= connections)"
	p.Y.Label.Text = ylabel
	p.X.Scale = plot.LogScale{}
	p.Y.Min = 0
	gs := s.keyValues("TxScale/", "g")
	var ticks []plot.Tick
	for _, g := range gs {
		ticks = append(ticks, plot.Tick{Value: leadingNumber(g), Label: g})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	drawn := false
	for i, v := range variants {
		var xys plotter.XYs
		for _, g := range gs {
			if y, ok := s.median(fmt.Sprintf("TxScale/g=%s/write/%s/v=%s", g, sampling, v.key), unit); ok {
				xys = append(xys, plotter.XY{X: leadingNumber(g), Y: y})
			}
		}
		if len(xys) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(v.label, line, points)
		drawn = true
	}
	if !drawn {
		return nil, nil // not measured in this run: no panel (and no empty log axis)
	}
	// Throughput rises with goroutines, CPU per transaction mostly stays: keep the
	// legend where the lines are not.
	p.Legend.Top, p.Legend.Left = unit != unitTPS, unit != unitTPS
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	return p, nil
}

// cost is the time of one sequential transaction (BenchmarkTx, write, sampled) at an
// added round-trip time, per variant, stacked: client CPU, server CPU, waiting (the
// rest of 1/(tx/s): network, server I/O, scheduling).
func (s samples) cost(rtt string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Time per transaction, write, sampled, RTT +" + rtt
	p.Y.Label.Text = "µs per transaction"
	var client, server, wait plotter.Values
	var labels []string
	for _, v := range variants {
		name := fmt.Sprintf("Tx/rtt=%s/write/sampled/v=%s", rtt, v.key)
		tps, ok1 := s.median(name, unitTPS)
		c, ok2 := s.median(name, unitClient)
		sv, ok3 := s.median(name, unitServer)
		if !ok1 || !ok2 || !ok3 || tps == 0 {
			continue
		}
		client = append(client, c)
		server = append(server, sv)
		wait = append(wait, max(1e6/tps-c-sv, 0))
		labels = append(labels, v.key[:1])
	}
	if len(labels) == 0 {
		return nil, errors.New("no BenchmarkTx figures for rtt=" + rtt)
	}
	w := vg.Points(14)
	var below *plotter.BarChart
	for _, part := range []struct {
		name  string
		vs    plotter.Values
		color color.Color
	}{
		{"client CPU", client, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}},
		{"server CPU", server, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}},
		{"waiting", wait, color.RGBA{R: 0xc7, G: 0xc7, B: 0xc7, A: 0xff}},
	} {
		bars, err := plotter.NewBarChart(part.vs, w)
		if err != nil {
			return nil, err
		}
		bars.Color = part.color
		bars.LineStyle.Width = 0
		if below != nil {
			bars.StackOn(below)
		}
		below = bars
		p.Add(bars)
		p.Legend.Add(part.name, bars)
	}
	p.NominalX(labels...)
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	return p, nil
}

// draw2 lays the plots out three to a row under the title and writes the SVG (or PNG,
// if out ends in .png).
func draw2(out, title string, plots []*plot.Plot) error {
	const cols = 3
	rows := (len(plots) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, p := range plots {
		grid[i/cols][i%cols] = p
	}
	const header = 0.5 * vg.Inch // the title's band above the plots
	width, height := 15*vg.Inch, vg.Length(rows)*4.5*vg.Inch+header
	var c vg.CanvasWriterTo = vgsvg.New(width, height)
	if strings.HasSuffix(out, ".png") { // for a quick look where no SVG viewer is at hand
		c = vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
	}
	dc := draw.New(c)
	titleStyle := plot.New().Title.TextStyle // gonum's default font, embedded
	titleStyle.Font.Size = vg.Points(13)
	// plot.New's title style is centred and hangs from its point: here it starts at the
	// left margin and stands on its point, in the band above the plots.
	titleStyle.XAlign, titleStyle.YAlign = draw.XLeft, draw.YBottom
	dc.FillText(titleStyle, vg.Point{X: 0.2 * vg.Inch, Y: height - 0.35*vg.Inch}, title)
	body := draw.Crop(dc, 0, 0, 0, -header)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, body)
	for j := range grid {
		for i, p := range grid[j] {
			if p != nil {
				p.Draw(canvases[j][i])
			}
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	_, werr := c.WriteTo(f)
	return errors.Join(werr, f.Close())
}
