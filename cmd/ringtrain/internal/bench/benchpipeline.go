package bench

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/train/pipeline"
)

// Pipeline is `ringtrain bench pipeline`: the bubble, the peak
// activation memory and the speedup of a model of equal stages
// (pipeline.Bench).
func Pipeline(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench pipeline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	width := fs.Int("width", 1024, "each block's linear layer is width × width")
	blocks := fs.Int("blocks", 8, "blocks (linear + ReLU); the stages get equal shares")
	batch := fs.Int("batch", 256, "samples per step")
	micro := fs.Int("micro-batches", 8, "micro-batches per step (M)")
	stages := fs.String("stages", "1,2,4", "stage counts to run, comma-separated (1: one peer, the speedup's baseline)")
	scheds := fs.String("schedules", "1f1b,gpipe", "schedules, comma-separated")
	reps := fs.Int("reps", 5, "timed steps per row; the median is reported")
	pace := fs.Duration("pace", 0, "each block also waits this long in a forward pass (twice in a backward), as on a device per stage: the schedule measured without the stages contending for cores")
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench pipeline: %w: %w", cli.ErrUsage, err)
	}
	cfg := pipeline.BenchConfig{Width: *width, Blocks: *blocks, Batch: *batch, MicroBatches: *micro, Reps: *reps, Pace: *pace}
	for _, s := range strings.Split(*stages, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bench pipeline: --stages %q: %w", *stages, cli.ErrUsage)
		}
		cfg.Stages = append(cfg.Stages, n)
	}
	for _, s := range strings.Split(*scheds, ",") {
		cfg.Schedules = append(cfg.Schedules, pipeline.Kind(strings.TrimSpace(s)))
	}
	const row = "%-6s %2s %2s %9s %8s %9s %11s %6s %7s %12s %8s  %s\n"
	fmt.Fprintf(stdout, row, "sched", "S", "M", "step_ms", "busy_ms", "alone_ms", "expected_ms", "ratio", "bubble", "gpipe_bubble", "speedup", "peak micro-batches (KiB of inputs) per stage")
	return pipeline.Bench(cfg, func(r pipeline.BenchResult) {
		var peaks []string
		for i, p := range r.PeakInFlight {
			peaks = append(peaks, fmt.Sprintf("%d (%d)", p, r.PeakBytes[i]>>10))
		}
		ms := func(d interface{ Seconds() float64 }) string { return fmt.Sprintf("%.1f", d.Seconds()*1000) }
		fmt.Fprintf(stdout, row, r.Schedule, strconv.Itoa(r.Stages), strconv.Itoa(r.MicroBatches), ms(r.Step), ms(r.Busy), ms(r.Bottleneck), ms(r.Expected),
			fmt.Sprintf("%.3f", r.Ratio), fmt.Sprintf("%.3f", r.Bubble), fmt.Sprintf("%.3f", r.GPipeBubble), fmt.Sprintf("%.2f", r.Speedup), strings.Join(peaks, ", "))
	})
}
