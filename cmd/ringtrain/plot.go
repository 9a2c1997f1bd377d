package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
)

// errNoCurves means the log files held no training progress to draw.
var errNoCurves = errors.New("no training progress in the logs")

// progressLine is what plot reads of a peer's JSON log: its "training" and
// "epoch done" lines.
type progressLine struct {
	Message       string   `json:"message"`
	Rank          *int     `json:"rank"`
	Epoch         int      `json:"epoch"`
	Step          int      `json:"step"`
	Steps         int      `json:"steps"`
	Loss          logFloat `json:"loss"`
	SamplesPerSec float64  `json:"samples_per_sec"`
	TestAccuracy  *float64 `json:"test_accuracy"`
	TestBPB       *float64 `json:"test_bits_per_byte"` // a language model's
	TestLoss      *float64 `json:"test_loss"`          // drawn where there is no accuracy: an mse job's
	// TrainLoss and ValBPB are what ../shared/bench/torch_gpt.py prints
	// at each evaluation, with Step: its curve, read beside ringtrain's.
	TrainLoss *float64 `json:"train_loss"`
	ValBPB    *float64 `json:"val_bpb"`
}

// logFloat is a number as zerolog writes it: a JSON number, or the
// strings "NaN", "+Inf" and "-Inf" that JSON has no numbers for.
type logFloat float64

func (f *logFloat) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || !(math.IsNaN(v) || math.IsInf(v, 0)) {
			return fmt.Errorf("a number as the string %q", s)
		}
		*f = logFloat(v)
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = logFloat(v)
	return nil
}

// curves are one rank's series: loss and samples/s by step (counted over
// epochs), test accuracy by epoch — or a language model's validation
// bits per byte by step (bpb set), at each epoch's end and each
// eval_every, or, for a job with no accuracy (mse), its test loss by
// epoch (testLoss set).
type curves struct {
	loss, rate, acc plotter.XYs
	bpb, testLoss   bool
}

// parseWithFiles parses args, whose flags may come after the files too,
// and returns the files.
func parseWithFiles(fs *flag.FlagSet, args []string) ([]string, error) {
	var files []string
	version := cli.AddVersionFlag(fs)
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if *version {
			return nil, errVersion
		}
		if fs.NArg() == 0 {
			return files, nil
		}
		files, args = append(files, fs.Arg(0)), fs.Args()[1:]
	}
}

// runPlot is `ringtrain plot LOG... -o curves.png`: loss, test accuracy
// and samples/s of every rank, from the JSON logs of `join --log-file` (or
// `local --log-dir`), drawn side by side with gonum/plot. With --by file,
// a line per log file instead, named after the file (or LABEL=LOG): one
// peer's log of each of several jobs, to compare them.
func runPlot(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "curves.png", "the PNG to write")
	by := fs.String("by", "rank", "a line per rank (of one job's logs) or per file (one log of each of several jobs, or torch_gpt.py's output; LABEL=LOG names its line)")
	files, err := parseWithFiles(fs, args)
	if err != nil {
		return fmt.Errorf("plot: %w: %w", errUsage, err)
	}
	if len(files) == 0 {
		return fmt.Errorf("plot: name the JSON log files (join --log-file, local --log-dir): %w", errUsage)
	}
	if *by != "rank" && *by != "file" {
		return fmt.Errorf("plot: --by %q; want rank or file: %w", *by, errUsage)
	}
	series := map[int]*curves{}
	labels := map[int]string{}
	for i, arg := range files {
		path, key := arg, func(rank int) int { return rank }
		if *by == "file" {
			label := strings.TrimSuffix(filepath.Base(arg), filepath.Ext(arg))
			if i := strings.LastIndex(arg, "="); i >= 0 { // a label may hold "=", as "H=50"
				label, path = arg[:i], arg[i+1:]
			}
			labels[i], key = label, func(int) int { return i }
		}
		if err := readCurves(path, series, key); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	if len(series) == 0 {
		return fmt.Errorf("plot: %v: %w", files, errNoCurves)
	}
	name := func(k int) string { return fmt.Sprintf("rank %d", k) }
	if *by == "file" {
		name = func(k int) string { return labels[k] }
	}
	if err := drawCurves(series, name, *out); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	fmt.Fprintf(stdout, "%s: loss, test accuracy and samples/s of %d %ss\n", *out, len(series), *by)
	return nil
}

// readCurves adds a log file's progress lines to series, each line to the
// series key gives its rank. Lines that are not JSON objects (a console
// log, a panic) are an error naming the line.
func readCurves(path string, series map[int]*curves, key func(rank int) int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var l progressLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("%s:%d: not a JSON log line (write it with --log-file): %v", path, n, err)
		}
		if l.Rank == nil && l.Message == "" && l.ValBPB != nil && l.Step > 0 { // torch_gpt.py's
			c := seriesOf(series, key(0))
			if x := float64(l.Step); drawable(x) && drawable(*l.ValBPB) {
				c.acc, c.bpb = append(c.acc, plotter.XY{X: x, Y: *l.ValBPB}), true
				if l.TrainLoss != nil && drawable(*l.TrainLoss) {
					c.loss = append(c.loss, plotter.XY{X: x, Y: *l.TrainLoss})
				}
			}
			continue
		}
		if l.Rank == nil || (l.Message != "training" && l.Message != "epoch done" && l.Message != "validation") || l.Steps <= 0 || l.Epoch < 1 {
			continue
		}
		c := seriesOf(series, key(*l.Rank))
		x := float64(l.Epoch-1)*float64(l.Steps) + float64(l.Step)
		if !drawable(x) {
			continue
		}
		if l.Message == "validation" { // between epochs' ends: a language model's score
			if l.TestBPB != nil && drawable(*l.TestBPB) {
				c.acc, c.bpb = append(c.acc, plotter.XY{X: x, Y: *l.TestBPB}), true
			}
			continue
		}
		if loss := float64(l.Loss); drawable(loss) { // a diverged step draws no point
			c.loss = append(c.loss, plotter.XY{X: x, Y: loss}) // an epoch's end: the mean since the last report
		}
		if drawable(l.SamplesPerSec) {
			c.rate = append(c.rate, plotter.XY{X: x, Y: l.SamplesPerSec})
		}
		switch {
		case l.Message != "epoch done":
		case l.TestBPB != nil && drawable(*l.TestBPB):
			c.acc, c.bpb = append(c.acc, plotter.XY{X: x, Y: *l.TestBPB}), true
		case l.TestAccuracy != nil && *l.TestAccuracy >= 0 && *l.TestAccuracy <= 1:
			c.acc = append(c.acc, plotter.XY{X: float64(l.Epoch), Y: *l.TestAccuracy})
		case l.TestLoss != nil && drawable(*l.TestLoss):
			c.acc, c.testLoss = append(c.acc, plotter.XY{X: float64(l.Epoch), Y: *l.TestLoss}), true
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// seriesOf is series[k], made if there is none yet.
func seriesOf(series map[int]*curves, k int) *curves {
	c := series[k]
	if c == nil {
		c = &curves{}
		series[k] = c
	}
	return c
}

// drawable: a value a float32 can hold. Training writes no other (its
// losses are float32), and an axis from -1.7e308 to 1.7e308 has an
// infinite span, whose ticks gonum's plot counted for 12 minutes and more.
func drawable(v float64) bool { return math.Abs(v) <= math.MaxFloat32 }

// drawCurves draws three panels side by side, a line per series, named
// in the legend by name.
func drawCurves(ranks map[int]*curves, name func(int) string, out string) error {
	titles := [3][2]string{{"training loss", "step"}, {"test accuracy", "epoch"}, {"samples/s per rank, since its epoch began", "step"}}
	var ps [3]*plot.Plot
	for i := range ps {
		ps[i] = plot.New()
		ps[i].Title.Text, ps[i].X.Label.Text = titles[i][0], titles[i][1]
		ps[i].Add(plotter.NewGrid())
	}
	scoreAxis(ps[1], ranks)
	ps[0].Legend.Top = true
	order := make([]int, 0, len(ranks))
	for r := range ranks {
		order = append(order, r)
	}
	slices.Sort(order)
	for k, r := range order {
		c := ranks[r]
		col := plotutilColor(k)
		for i, xy := range []plotter.XYs{c.loss, c.acc, c.rate} {
			if len(xy) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(xy)
			if err != nil {
				return err
			}
			line.Color, points.Color = col, col
			points.Radius = vg.Points(1.5)
			ps[i].Add(line, points)
			if i == 0 {
				ps[i].Legend.Add(name(r), line)
			}
		}
	}
	img := vgimg.New(vg.Points(1200), vg.Points(380))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 3, PadX: vg.Points(20), PadY: vg.Points(10), PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	canvases := plot.Align([][]*plot.Plot{ps[:]}, tiles, dc)
	for i, p := range ps {
		p.Draw(canvases[0][i])
	}
	return writePNG(img, out)
}

// scoreAxis titles and bounds the middle plot by what the curves score:
// test accuracy, a language model's validation bits per byte, or the test
// loss of a job with no classes.
func scoreAxis(p *plot.Plot, ranks map[int]*curves) {
	// Accuracy from a little under the lowest drawn to a little over the
	// highest: curves that differ by a point stay apart.
	lo, hi := 1.0, 0.0
	for _, c := range ranks {
		for _, xy := range c.acc {
			lo, hi = min(lo, xy.Y), max(hi, xy.Y)
		}
	}
	p.Y.Min, p.Y.Max = 0, 1
	bpb, testLoss := false, false
	for _, c := range ranks {
		bpb, testLoss = bpb || c.bpb, testLoss || c.testLoss
	}
	switch {
	case bpb: // a language model's: its validation bits per byte by step, from 0
		p.Title.Text, p.X.Label.Text = "validation bits per byte", "step"
		p.Y.Max = max(1, hi*1.05)
	case testLoss: // a job with no classes: its test loss, from 0
		p.Title.Text = "test loss"
		p.Y.Max = hi * 1.05
	case lo <= hi:
		p.Y.Min, p.Y.Max = max(0, lo-0.02), min(1, hi+0.01)
	}
}

// writePNG writes img to out whole or not at all.
func writePNG(img *vgimg.Canvas, out string) error {
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil { // CreateTemp's 0600 is for secrets
		return err
	}
	return os.Rename(tmp.Name(), out)
}

// plotutilColor is the k-th of a few colours that tell ranks apart.
func plotutilColor(k int) color.Color {
	palette := []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
		{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}}
	return palette[k%len(palette)]
}
