package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/devices"
	"github.com/ringtrain/ringtrain/train"
)

// ErrEnginesDiffer is what bench engines returns when the losses part.
var ErrEnginesDiffer = errors.New("the engines' losses differ by more than the tolerance")

// Engines trains the same model from the same start on the same
// batches with the cpu engine (gorgonia) and another device, and compares
// the loss after every step and the speed. With the CUDA build and a GPU,
// --device cuda is the check train/engine/README.md asks a GPU owner to run.
func Engines(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench engines", flag.ContinueOnError)
	fs.SetOutput(stderr)
	device := fs.String("device", "host", "the device held against cpu: cuda or host")
	model := fs.String("model", "cnn", "built-in model: mlp or cnn")
	steps := fs.Int("steps", 20, "SGD steps")
	batch := fs.Int("batch", 64, "batch size")
	seed := fs.Uint64("seed", 1, "seed of the weights and the batches")
	tol := fs.Float64("tolerance", 1e-3, "largest |loss difference| allowed at the last step")
	devOpt := devices.AddFlags(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench engines: %w: %w", cli.ErrUsage, err)
	}
	spec, err := train.BuiltinSpec(*model, 1, 28, 28, 10)
	if err != nil {
		return fmt.Errorf("bench engines: %w", err)
	}
	cfg := train.ModelConfig{Spec: spec, Batch: *batch, Seed: *seed}
	// Fashion-MNIST-shaped batches of noise with random labels: the check
	// is of arithmetic, not of learning, and needs no data files.
	xs, ys := noiseBatches(rand.New(rand.NewPCG(*seed, 7)), *steps, *batch)
	run := func(device string) ([]float32, time.Duration, error) {
		m, err := devices.NewModel(device, cfg, *devOpt)
		if err != nil {
			return nil, 0, err
		}
		defer m.Close()
		// On an engine device the optimizer runs there too, so the check
		// covers its kernels as well.
		opt, err := devices.BindOptimizer(m, &train.SGD{LR: 0.01, Momentum: 0.9}, *devOpt)
		if err != nil {
			return nil, 0, err
		}
		losses := make([]float32, *steps)
		start := time.Now()
		for s := range *steps {
			if losses[s], err = m.ForwardBackward(xs[s], ys[s], *batch); err != nil {
				return nil, 0, fmt.Errorf("%s, step %d: %w", device, s, err)
			}
			opt.Step(m.Params(), m.Grads())
		}
		return losses, time.Since(start), nil
	}
	ref, refTime, err := run("cpu")
	if err != nil {
		return fmt.Errorf("bench engines: %w", err)
	}
	got, gotTime, err := run(*device)
	if err != nil {
		return fmt.Errorf("bench engines: %w", err)
	}
	fmt.Fprintf(stdout, "%5s %12s %12s %10s\n", "step", "loss_cpu", "loss_"+*device, "diff")
	var diff float64
	for s := range ref {
		diff = math.Abs(float64(got[s] - ref[s]))
		fmt.Fprintf(stdout, "%5d %12.6f %12.6f %10.2e\n", s+1, ref[s], got[s], diff)
	}
	rate := func(d time.Duration) float64 { return float64(*steps**batch) / d.Seconds() }
	fmt.Fprintf(stdout, "%s (cpu BLAS: %s): cpu %.0f samples/s, %s %.0f samples/s; loss after %d steps differs by %.2e (tolerance %.0e)\n",
		*model, train.BLAS(), rate(refTime), *device, rate(gotTime), *steps, diff, *tol)
	if !(diff <= *tol) {
		return fmt.Errorf("bench engines: %w: %.2e > %.0e", ErrEnginesDiffer, diff, *tol)
	}
	return nil
}

// noiseBatches returns count Fashion-MNIST-shaped batches of normal noise
// with uniform labels.
func noiseBatches(rng *rand.Rand, count, batch int) ([][]float32, [][]int) {
	xs := make([][]float32, count)
	ys := make([][]int, count)
	for s := range count {
		xs[s] = make([]float32, batch*784)
		for i := range xs[s] {
			xs[s][i] = float32(rng.NormFloat64())
		}
		ys[s] = make([]int, batch)
		for i := range ys[s] {
			ys[s][i] = rng.IntN(10)
		}
	}
	return xs, ys
}
