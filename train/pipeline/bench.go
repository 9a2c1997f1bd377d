package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ringtrain/ringtrain/train"
)

// BenchConfig is a pipeline benchmark: a model of Blocks equal blocks
// (linear Width → Width, then ReLU) and a last linear layer to 10
// classes, cut into stages of equal blocks, each stage computing on one
// thread, all in this process over in-memory links (frames encoded and
// decoded as on the network).
//
// With Pace set, each block also waits Pace in a forward pass and 2×Pace
// in a backward one, as if each stage had a device of its own: on a
// machine with fewer cores than stages, the stages would otherwise
// measure their contention for the cores rather than the schedule. A
// backward call waits 3×Pace a block, since a stage that is not the last
// recomputes its forward pass there and the last runs its forward there;
// with more than one stage the last waits one Pace a block more, so that
// every stage costs the same.
type BenchConfig struct {
	Width, Blocks, Batch, MicroBatches, Reps int
	Stages                                   []int
	Schedules                                []Kind
	Pace                                     time.Duration
}

// BenchResult is one row: a schedule and a number of stages.
type BenchResult struct {
	Schedule             Kind
	Stages, MicroBatches int
	// Step is the median step. Busy is the busiest stage's compute in a
	// step of the pipeline (its waits on the others aside; the median);
	// Bottleneck the slowest stage's step when run alone, its neighbours
	// answering at once (on one machine the stages share its caches and
	// memory, so Busy is the longer). Expected is what a pipeline of equal
	// stages takes, Busy × (M+S−1)/M; Ratio is Step / Expected.
	Step, Busy, Bottleneck, Expected time.Duration
	Ratio                            float64
	// Bubble is the share of the step the busiest stage waits, 1 −
	// Busy/Step; GPipeBubble the share a schedule of equal stages must
	// wait, (S−1)/(M+S−1).
	Bubble, GPipeBubble float64
	// Speedup is one peer's step (the whole model, the same micro-batches,
	// one thread) over Step.
	Speedup float64
	// PeakInFlight and PeakBytes are each stage's most micro-batches held
	// at once and the bytes of their inputs.
	PeakInFlight []int
	PeakBytes    []int64
}

// Bench runs cfg and reports each row as it is measured.
func Bench(cfg BenchConfig, emit func(BenchResult)) error {
	layers := []train.Layer{}
	for range cfg.Blocks {
		layers = append(layers, train.Layer{Type: train.LayerLinear, Out: cfg.Width}, train.Layer{Type: train.LayerReLU})
	}
	layers = append(layers, train.Layer{Type: train.LayerLinear, Out: 10})
	model := train.ModelConfig{Spec: train.Spec{Input: []int{cfg.Width}, Layers: layers}, Batch: cfg.Batch, Seed: 1}
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, cfg.Batch*cfg.Width)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	y := make([]int, cfg.Batch)
	for i := range y {
		y[i] = r.IntN(10)
	}
	for _, kind := range cfg.Schedules {
		var one time.Duration
		for _, S := range cfg.Stages {
			if cfg.Blocks%S != 0 {
				return fmt.Errorf("%d blocks do not cut into %d equal stages: %w", cfg.Blocks, S, ErrConfig)
			}
			pc := Config{Stages: S, MicroBatches: cfg.MicroBatches, Schedule: kind, Threads: 1}
			for k := 1; k < S; k++ {
				pc.Split = append(pc.Split, 2*k*cfg.Blocks/S)
			}
			var pace func(s int) func(bool)
			if cfg.Pace > 0 {
				block := cfg.Pace * time.Duration(cfg.Blocks/S)
				pace = func(s int) func(bool) {
					back := 3 * block
					if S > 1 && s == S-1 {
						back += block
					}
					return func(backward bool) {
						if backward {
							time.Sleep(back)
							return
						}
						time.Sleep(block)
					}
				}
			}
			res, err := benchRow(pc, model, x, y, cfg.Reps, pace)
			if err != nil {
				return err
			}
			if S == 1 {
				one = res.Step
			}
			if one > 0 {
				res.Speedup = float64(one) / float64(res.Step)
			}
			emit(res)
		}
	}
	return nil
}

func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func benchRow(cfg Config, model train.ModelConfig, x []float32, y []int, reps int, pace func(s int) func(bool)) (BenchResult, error) {
	ctx := context.Background()
	S, M := cfg.Stages, cfg.MicroBatches
	res := BenchResult{Schedule: cfg.Schedule, Stages: S, MicroBatches: M, GPipeBubble: float64(S-1) / float64(M+S-1)}
	// The pipeline.
	pipes := make([]*Pipe, S)
	var prev Link
	for s := range S {
		var next, nextPrev Link
		if s < S-1 {
			next, nextPrev = MemLinks(4*M + 4)
		}
		p, err := New(ctx, cfg, model, s, prev, next)
		if err != nil {
			return res, err
		}
		defer p.Close()
		if pace != nil {
			p.pace = pace(s)
		}
		pipes[s], prev = p, nextPrev
	}
	step := func() error {
		errs := make([]error, S)
		var wg sync.WaitGroup
		for s, p := range pipes {
			wg.Go(func() { _, errs[s] = p.ForwardBackward(x, y, len(y)) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	var times, busy []time.Duration
	for i := range reps + 2 {
		before := make([]time.Duration, S)
		for s, p := range pipes {
			before[s] = p.Stats().Compute
		}
		t0 := time.Now()
		if err := step(); err != nil {
			return res, err
		}
		if i < 2 { // the first steps warm the machines up
			continue
		}
		times = append(times, time.Since(t0))
		var most time.Duration
		for s, p := range pipes {
			most = max(most, p.Stats().Compute-before[s])
		}
		busy = append(busy, most)
	}
	res.Step, res.Busy = median(times), median(busy)
	for _, p := range pipes {
		st := p.Stats()
		res.PeakInFlight, res.PeakBytes = append(res.PeakInFlight, st.PeakInFlight), append(res.PeakBytes, st.PeakBytes)
	}
	// Each stage alone, its neighbours answering at once.
	for s := range S {
		alone, err := stageAlone(cfg, model, s, x, y, reps, pace)
		if err != nil {
			return res, err
		}
		res.Bottleneck = max(res.Bottleneck, alone)
	}
	res.Expected = res.Busy * time.Duration(M+S-1) / time.Duration(M)
	res.Ratio = float64(res.Step) / float64(res.Expected)
	res.Bubble = 1 - float64(res.Busy)/float64(res.Step)
	return res, nil
}

// stageAlone is stage s's median step time with its neighbours
// answering at once (soloLink), after two steps to warm up.
func stageAlone(cfg Config, model train.ModelConfig, s int, x []float32, y []int, reps int, pace func(s int) func(bool)) (time.Duration, error) {
	var prev, next Link
	if s > 0 {
		prev = &soloLink{}
	}
	if s < cfg.Stages-1 {
		next = &soloLink{}
	}
	p, err := New(context.Background(), cfg, model, s, prev, next)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	if pace != nil {
		p.pace = pace(s)
	}
	var alone []time.Duration
	for i := range reps + 2 {
		t0 := time.Now()
		if _, err := p.ForwardBackward(x, y, len(y)); err != nil {
			return 0, err
		}
		if i >= 2 {
			alone = append(alone, time.Since(t0))
		}
	}
	return median(alone), nil
}

// soloLink stands in for the stages beside one run alone: it answers every
// Recv at once with a frame of the shape expected (zeros, encoded and
// decoded as a real one is), and drops what is sent after encoding it.
type soloLink struct{ buf []byte }

func (l *soloLink) Send(_ context.Context, f *Frame) error {
	l.buf = AppendFrame(l.buf[:0], f)
	return nil
}

func (l *soloLink) Recv(_ context.Context, want Expect) (*Frame, error) {
	f := &Frame{Kind: want.Kind, Enc: want.Enc, Stage: want.Stage, Gen: want.Gen, Step: want.Step, MB: want.MB, Rows: want.Rows}
	for _, n := range want.Sizes {
		f.Tensors = append(f.Tensors, make([]float32, n*want.Rows))
	}
	return ReadFrame(bytes.NewReader(AppendFrame(nil, f)), want)
}
