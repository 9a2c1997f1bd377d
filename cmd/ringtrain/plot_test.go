package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"gonum.org/v1/plot/plotter"
	"time"
)

// TestPlot: two ranks' JSON logs make one PNG of three panels with
// something drawn in it; flags may follow the files; a log that is not JSON
// is named with its line; logs without progress are an error, not a blank
// picture.
func TestPlot(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for r := range 2 {
		var b strings.Builder
		b.WriteString(`{"level":"info","message":"looking for peers"}` + "\n")
		for e := 1; e <= 2; e++ {
			for s := 10; s <= 40; s += 10 {
				fmt.Fprintf(&b, `{"level":"info","rank":%d,"epoch":%d,"step":%d,"steps":40,"loss":%g,"samples_per_sec":%d,"message":"training"}`+"\n",
					r, e, s, 2/float64(e*s), 1000+s)
			}
			fmt.Fprintf(&b, `{"level":"info","rank":%d,"epoch":%d,"step":40,"steps":40,"loss":0.1,"samples_per_sec":1040,"test_accuracy":%g,"message":"epoch done"}`+"\n",
				r, e, 0.7+0.1*float64(e))
		}
		p := filepath.Join(dir, fmt.Sprintf("peer-%d.jsonl", r))
		os.WriteFile(p, []byte(b.String()), 0o644)
		files = append(files, p)
	}
	out := filepath.Join(dir, "curves.png")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), append(append([]string{"plot"}, files...), "-o", out), &stdout, &stderr); err != nil {
		t.Fatalf("plot: %v (%s)", err, stderr.String())
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", out, err)
	}
	if b := img.Bounds(); b.Dx() < 3*b.Dy() {
		t.Errorf("a %v picture; want three panels side by side", b)
	}
	colours := map[[3]uint32]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += 3 {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 3 {
			r, g, b, _ := img.At(x, y).RGBA()
			colours[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	if len(colours) < 4 {
		t.Errorf("the picture has %d colours; want lines of two ranks on a background", len(colours))
	}

	bad := filepath.Join(dir, "console.log")
	os.WriteFile(bad, []byte("09:01:38 INF looking for peers\n"), 0o644)
	if err := run(context.Background(), []string{"plot", "-o", out, bad}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "console.log:1") {
		t.Errorf("plot of a console log = %v; want an error naming console.log:1", err)
	}
	empty := filepath.Join(dir, "empty.jsonl")
	os.WriteFile(empty, []byte(`{"message":"looking for peers"}`+"\n"), 0o644)
	if err := run(context.Background(), []string{"plot", empty}, &stdout, &stderr); !errors.Is(err, errNoCurves) {
		t.Errorf("plot of a log without progress = %v; want errNoCurves", err)
	}
	if err := run(context.Background(), []string{"plot"}, &stdout, &stderr); !errors.Is(err, errUsage) {
		t.Errorf("plot of nothing = %v; want a usage error", err)
	}
}

// TestPlotByFile: with --by file, one log of each of several jobs — each
// of rank 0 — draws a line per file, named after it or by LABEL=; a
// rank-0 log per job drawn by rank would be one line.
func TestPlotByFile(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for j, name := range []string{"sync", "diloco"} {
		var b strings.Builder
		// zerolog writes a NaN loss as a string: no point, not an error.
		b.WriteString(`{"level":"info","rank":0,"epoch":1,"step":10,"steps":20,"loss":"NaN","samples_per_sec":1000,"message":"training"}` + "\n")
		for e := 1; e <= 3; e++ {
			fmt.Fprintf(&b, `{"level":"info","rank":0,"epoch":%d,"step":20,"steps":20,"loss":0.5,"samples_per_sec":1000,"test_accuracy":%g,"message":"epoch done"}`+"\n",
				e, 0.6+0.1*float64(e)-0.05*float64(j))
		}
		p := filepath.Join(dir, name+".jsonl")
		os.WriteFile(p, []byte(b.String()), 0o644)
		files = append(files, p)
	}
	out := filepath.Join(dir, "variants.png")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--by", "file", files[0], files[1]}, "of 2 files"},
		{[]string{"--by", "file", "float32=" + files[0], "DiLoCo H=50=" + files[1]}, "of 2 files"},
		{[]string{files[0], files[1]}, "of 1 ranks"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), append([]string{"plot", "-o", out}, c.args...), &stdout, &stderr); err != nil {
			t.Fatalf("plot %v: %v (%s)", c.args, err, stderr.String())
		}
		if !strings.Contains(stdout.String(), c.want) {
			t.Errorf("plot %v said %q; want %q", c.args, stdout.String(), c.want)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"plot", "--by", "peer", files[0]}, &stdout, &stderr); !errors.Is(err, errUsage) {
		t.Errorf("plot --by peer = %v; want a usage error", err)
	}
}

// TestPlotHugeValues: a log whose losses and rates are ±1.7e308 is drawn
// without them, at once. Before, the axis spanned an infinite range and
// plot spun for 12 minutes and more.
func TestPlotHugeValues(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for s := 1; s <= 20; s++ {
		loss, rate := float64(s), 100.0
		if s%2 == 0 {
			loss, rate = 1.7e308*float64(1-2*(s%4/2)), -1.7e308
		}
		fmt.Fprintf(&b, `{"rank":0,"epoch":1,"step":%d,"steps":20,"loss":%g,"samples_per_sec":%g,"message":"training"}`+"\n", s, loss, rate)
	}
	fmt.Fprintf(&b, `{"rank":0,"epoch":1,"step":20,"steps":20,"loss":1,"samples_per_sec":1,"test_accuracy":1.7e308,"message":"epoch done"}`+"\n")
	log := filepath.Join(dir, "huge.jsonl")
	os.WriteFile(log, []byte(b.String()), 0o644)
	out := filepath.Join(dir, "curves.png")
	done := make(chan error, 1)
	go func() { done <- run(context.Background(), []string{"plot", log, "-o", out}, io.Discard, io.Discard) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("plot: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("plot of a log with losses of ±1.7e308 still drawing after 30 s")
	}
}

// TestPlotEndsOnSIGTERM: plot waiting on a FIFO that nothing writes ends
// at SIGTERM, as any program does. Before, main caught the signal for a
// context plot does not watch, and plot went on.
func TestPlotEndsOnSIGTERM(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := peerCommand(ctx, t, "plot", fifo, "-o", filepath.Join(dir, "c.png"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // for it to reach the open
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("plot still running 10 s after SIGTERM")
	}
}

// A language model's log draws its validation bits per byte where an
// image model's draws test accuracy.
func TestPlotReadsBitsPerByte(t *testing.T) {
	p := filepath.Join(t.TempDir(), "peer-0.jsonl")
	log := `{"level":"info","rank":0,"epoch":1,"step":4,"steps":10,"test_accuracy":0.2,"test_loss":2.84,"sent_bytes":0,"test_bits_per_byte":4.1,"message":"validation"}
{"level":"info","rank":0,"epoch":1,"step":10,"steps":10,"loss":2.5,"samples_per_sec":50,"test_accuracy":0.3,"test_bits_per_byte":3.6,"message":"epoch done"}
{"level":"info","rank":0,"epoch":2,"step":10,"steps":10,"loss":2.1,"samples_per_sec":50,"test_accuracy":0.35,"test_bits_per_byte":3.1,"message":"epoch done"}
`
	if err := os.WriteFile(p, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	series := map[int]*curves{}
	if err := readCurves(p, series, func(r int) int { return r }); err != nil {
		t.Fatal(err)
	}
	c := series[0]
	if c == nil || !c.bpb || len(c.acc) != 3 || c.acc[0] != (plotter.XY{X: 4, Y: 4.1}) || c.acc[1] != (plotter.XY{X: 10, Y: 3.6}) || c.acc[2] != (plotter.XY{X: 20, Y: 3.1}) {
		t.Fatalf("curves %+v; want bits per byte 4.1, 3.6 and 3.1 at steps 4, 10 and 20", c)
	}
	// torch_gpt.py's lines are a curve of their own, by step.
	tp := filepath.Join(t.TempDir(), "torch.jsonl")
	if err := os.WriteFile(tp, []byte(`{"step": 281, "train_loss": 2.51, "val_loss": 2.548, "val_bpb": 3.676}
{"step": 562, "train_loss": 2.18, "val_loss": 2.219, "val_bpb": 3.2}
{"model": "gpt L4 d128 h4 T128", "tokens_per_s": 5049, "val_loss": 2.219, "val_bpb": 3.2}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readCurves(tp, series, func(int) int { return 1 }); err != nil {
		t.Fatal(err)
	}
	if c := series[1]; c == nil || !c.bpb || len(c.acc) != 2 || c.acc[1] != (plotter.XY{X: 562, Y: 3.2}) || len(c.loss) != 2 {
		t.Fatalf("torch_gpt.py's curves %+v; want bits per byte at steps 281 and 562", c)
	}
	if err := drawCurves(series, func(int) string { return "rank 0" }, filepath.Join(t.TempDir(), "lm.png")); err != nil {
		t.Fatal(err)
	}
}

// An mse job's lines carry a test loss and no accuracy: its panel is the
// test loss by epoch.
func TestPlotReadsTestLoss(t *testing.T) {
	p := filepath.Join(t.TempDir(), "peer-0.jsonl")
	log := `{"level":"info","rank":0,"epoch":1,"step":64,"steps":64,"loss":0.03,"samples_per_sec":900,"test_loss":0.045,"message":"epoch done"}
{"level":"info","rank":0,"epoch":2,"step":64,"steps":64,"loss":0.02,"samples_per_sec":900,"test_loss":0.014,"message":"epoch done"}
`
	if err := os.WriteFile(p, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	series := map[int]*curves{}
	if err := readCurves(p, series, func(r int) int { return r }); err != nil {
		t.Fatal(err)
	}
	if c := series[0]; c == nil || !c.testLoss || c.bpb || len(c.acc) != 2 || c.acc[1] != (plotter.XY{X: 2, Y: 0.014}) {
		t.Fatalf("curves %+v; want the test loss 0.045 and 0.014 by epoch", c)
	}
	if err := drawCurves(series, func(int) string { return "rank 0" }, filepath.Join(t.TempDir(), "mse.png")); err != nil {
		t.Fatal(err)
	}
}
