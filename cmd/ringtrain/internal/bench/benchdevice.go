package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/devices"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// DeviceResult is one line of `bench device`.
type DeviceResult struct {
	Device      string  `json:"device"`
	Model       string  `json:"model"`
	Batch       int     `json:"batch"`
	Steps       int     `json:"steps"`
	Optimizer   string  `json:"optimizer"`
	Graph       bool    `json:"graph"`
	TF32        bool    `json:"tf32"`
	Run         int     `json:"run,omitempty"`
	SamplesPerS float64 `json:"samples_per_s"`
	// TokensPerS is a language model's: samples/s × its context.
	TokensPerS float64 `json:"tokens_per_s,omitempty"`
	StepMS     float64 `json:"step_ms"`
	Median     bool    `json:"median,omitempty"`
}

// Device is `ringtrain bench device`: one device's training speed
// for a model and batch size, as JSON, measured the way the PyTorch
// reference of testdata/gpu-bench.sh measures PyTorch — whole training steps
// (forward, backward, Adam at lr 1e-3) on full batches already in memory,
// after untimed warm-up steps, through train.Replica on a ring of one. The
// batches are seeded noise with random labels: speed does not depend on
// the values, and no data files are needed. A line per run, then the
// median.
func Device(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench device", flag.ContinueOnError)
	fs.SetOutput(stderr)
	device := fs.String("device", "cpu", devices.Help)
	model := fs.String("model", "cnn", "built-in model: mlp, cnn, gpt (torch_gpt.py's: 4 layers, dim 128, 4 heads, context 128, on random bytes) or gpt-large (6 layers, dim 384, 6 heads, context 256)")
	batch := fs.Int("batch", 64, "batch size")
	steps := fs.Int("steps", 400, "timed steps per run")
	warmup := fs.Int("warmup", 50, "untimed steps before the first run")
	runs := fs.Int("runs", 3, "runs; the last line is their median")
	optName := fs.String("optimizer", "adam", "adam (lr 1e-3, as the PyTorch script), adamw (lr 1e-3, decay 0.1, betas 0.9 and 0.95, as torch_gpt.py) or sgd (lr 0.01, momentum 0.9)")
	devOpt := devices.AddFlags(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench device: %w: %w", cli.ErrUsage, err)
	}
	if *batch < 1 || *steps < 1 || *runs < 1 || *warmup < 0 {
		return fmt.Errorf("bench device: --batch, --steps and --runs must be positive: %w", cli.ErrUsage)
	}
	spec, xs, ys, err := benchModel(*model, *batch)
	if err != nil {
		return fmt.Errorf("bench device: %w", err)
	}
	m, err := devices.NewModel(*device, train.ModelConfig{Spec: spec, Batch: *batch, Seed: 1}, *devOpt)
	if err != nil {
		return fmt.Errorf("bench device: %w", err)
	}
	defer m.Close()
	convReport(m, stderr)
	opt, err := benchOptimizer(*optName, m.ParamNames())
	if err != nil {
		return err
	}
	if opt, err = devices.BindOptimizer(m, opt, *devOpt); err != nil {
		return fmt.Errorf("bench device: %w", err)
	}
	solo, err := ring.New(nil, ring.Config{Rank: 0, Size: 1})
	if err != nil {
		return err
	}
	defer solo.Close()
	r := train.NewReplica(m, opt, solo)
	pool := len(xs)
	step := func(i int) error {
		if _, err := r.Step(ctx, xs[i%pool], ys[i%pool], *batch); err != nil {
			return fmt.Errorf("bench device: step %d: %w", i, err)
		}
		return nil
	}
	for i := range *warmup {
		if err := step(i); err != nil {
			return err
		}
	}
	res := DeviceResult{Device: deviceName(m, *device), Model: *model, Batch: *batch, Steps: *steps, Optimizer: *optName,
		Graph: !devOpt.NoGraph && *device != "cpu", TF32: devOpt.TF32 && *device == "cuda"}
	enc := json.NewEncoder(stdout)
	var rates []float64
	for run := range *runs {
		start := time.Now()
		for i := range *steps {
			if err := step(i); err != nil {
				return err
			}
		}
		d := time.Since(start)
		res.Run = run + 1
		res.SamplesPerS = float64(*steps**batch) / d.Seconds()
		res.TokensPerS = tokensPerS(res.SamplesPerS, len(ys[0]) / *batch)
		res.StepMS = d.Seconds() * 1e3 / float64(*steps)
		rates = append(rates, res.SamplesPerS)
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
	res.Run, res.Median = 0, true
	res.SamplesPerS = median(rates)
	res.TokensPerS = tokensPerS(res.SamplesPerS, len(ys[0]) / *batch)
	res.StepMS = float64(*batch) / res.SamplesPerS * 1e3
	return enc.Encode(res)
}

// convReport writes how m's direct convolutions' algorithms were timed
// and which were kept, where m plans them so.
func convReport(m train.Model, w io.Writer) {
	if r, ok := m.(interface{ ConvReport() string }); ok && r.ConvReport() != "" {
		fmt.Fprintln(w, r.ConvReport())
	}
}

// benchOptimizer is --optimizer: Adam at 1e-3, as the PyTorch script;
// AdamW at 1e-3 with decay 0.1 on the weights, as torch_gpt.py; or SGD
// at 0.01 with momentum 0.9.
func benchOptimizer(name string, params []string) (train.Optimizer, error) {
	switch name {
	case "adam":
		return train.NewAdam(1e-3), nil
	case "adamw":
		return train.NewAdamW(1e-3, 0.1, train.DecayWeights(params)), nil
	case "sgd":
		return &train.SGD{LR: 0.01, Momentum: 0.9}, nil
	}
	return nil, fmt.Errorf("bench device: --optimizer %q; want adam, adamw or sgd: %w", name, cli.ErrUsage)
}

// benchModel is --model and 16 batches for it, cycled: seeded noise with
// uniform labels for the image models, random bytes for the GPTs (gpt is
// torch_gpt.py's default shape, gpt-large its 6 layers × 384 at context
// 256).
func benchModel(name string, batch int) (train.Spec, [][]float32, [][]int, error) {
	const pool = 16
	rng := rand.New(rand.NewPCG(1, 9))
	if name != "gpt" && name != "gpt-large" {
		spec, err := train.BuiltinSpec(name, 1, 28, 28, 10)
		xs, ys := noiseBatches(rng, pool, batch)
		return spec, xs, ys, err
	}
	spec, T := train.GPTSpec(4, 128, 4, 128), 128
	if name == "gpt-large" {
		spec, T = train.GPTSpec(6, 384, 6, 256), 256
	}
	xs, ys := make([][]float32, pool), make([][]int, pool)
	for s := range pool {
		xs[s], ys[s] = make([]float32, batch*T), make([]int, batch*T)
		for i := range xs[s] {
			xs[s][i], ys[s][i] = float32(rng.IntN(256)), rng.IntN(256)
		}
	}
	return spec, xs, ys, nil
}

// deviceName is the device m computes on, as it names it (the GPU's
// model, say), or asked.
func deviceName(m train.Model, asked string) string {
	if d, ok := m.(interface{ Device() string }); ok {
		return d.Device()
	}
	return asked
}

// tokensPerS is a language model's samples/s as tokens/s (labels a
// sample: its context), or 0 for a model of one label a sample.
func tokensPerS(samples float64, labels int) float64 {
	if labels < 2 {
		return 0
	}
	return samples * float64(labels)
}
